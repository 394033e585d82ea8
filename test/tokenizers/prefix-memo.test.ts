// The prefix memo (metering/prefix-memo.ts): turn N of a conversation takes the chain hashes and
// token counts of the leading messages it shares with an earlier turn this process saw, and works
// only on what it added — with results identical to computing everything again.
import t from 'tap';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { canonicalEqual, MAX_NEW_MESSAGES, PrefixMemo } from '../../metering/prefix-memo.js';
import { chainHashes } from '../../metering/runs/run-state.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { TokenCache } from '../../metering/token-cache.js';
import type { ChatMessage, ToolDefinition } from '../../metering/types.js';
import { startGateway } from '../helpers/gateway.js';
import { countMapCalls } from '../helpers/map-spy.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { plan } from '../../server/pipeline/plan.js';
import { validateRequest } from '../../server/pipeline/endpoints.js';

/** A research conversation as a client resends it: fresh objects every turn (parsed from JSON). */
function conversation(turns: number): ChatMessage[] {
  const m: ChatMessage[] = [{ role: 'system', content: 'You answer from the sources you are given.' }];
  for (let i = 1; i <= turns; i++) {
    m.push({ role: 'user', content: `Question ${i}: what does section ${i} of the report say about retries?` });
    m.push({ role: 'assistant', content: null, tool_calls: [{ id: `call_${i}`, type: 'function', function: { name: 'search', arguments: `{"q":"section ${i}"}` } }] });
    m.push({ role: 'tool', tool_call_id: `call_${i}`, content: `Section ${i}: retries back off exponentially, at most ${i} times.` });
    m.push({ role: 'assistant', content: `Section ${i} allows at most ${i} retries with exponential back-off.` });
  }
  return JSON.parse(JSON.stringify(m)) as ChatMessage[];
}

const TOOLS: ToolDefinition[] = [
  { type: 'function', function: { name: 'search', description: 'Search the report.', parameters: { type: 'object', properties: { q: { type: 'string', description: 'The query' } } } } },
];

t.test('canonical equality: key order and null-versus-absent do not matter, values do', async (t) => {
  t.ok(canonicalEqual({ role: 'user', content: 'hi' }, { content: 'hi', role: 'user' }));
  t.ok(canonicalEqual({ role: 'assistant', content: null, refusal: null }, { role: 'assistant' }));
  t.ok(canonicalEqual({ a: [1, { b: 2, c: null }] }, { a: [1, { b: 2 }] }));
  t.notOk(canonicalEqual({ role: 'user', content: 'hi' }, { role: 'user', content: 'hi!' }));
  t.notOk(canonicalEqual({ role: 'user', content: 'hi' }, { role: 'user', content: 'hi', name: 'ann' }));
  t.notOk(canonicalEqual({ n: 1 }, { n: '1' }), 'a number is not its string');
  t.notOk(canonicalEqual({ a: [1, 2] }, { a: [1, 2, 3] }));
  t.notOk(canonicalEqual({ a: [null] }, { a: [] }), 'null in an array is data');
  t.notOk(canonicalEqual({ a: [1] }, { a: { 0: 1 } }));
});

t.test('a later turn takes the chain of the turn it grew from and hashes only the rest', async (t) => {
  const memo = new PrefixMemo();
  const turn1 = conversation(1).concat({ role: 'user', content: 'And section 2?' });
  memo.remember('key-a', turn1, chainHashes(turn1), null, null);

  const turn2 = conversation(2).concat({ role: 'user', content: 'And section 3?' });
  // Turn 2 resends turn 1's first 5 messages unchanged: they match; its 6th differs from turn 1's.
  const grown = [...turn2.slice(0, 5), { role: 'user', content: 'And section 2?' }, { role: 'assistant', content: 'It says…' }, { role: 'user', content: 'Thanks. Section 3?' }];
  const m = memo.match('key-a', JSON.parse(JSON.stringify(grown)) as ChatMessage[]);
  t.ok(m, 'found');
  t.equal(m!.length, turn1.length);
  t.strictSame(chainHashes(grown, m!.chain), chainHashes(grown), 'the chain is the one computed from scratch');

  t.equal(memo.match('key-b', grown), null, 'another key does not see it');
  const edited = JSON.parse(JSON.stringify(grown)) as ChatMessage[];
  edited[1]!.content = 'Question 1, edited';
  t.equal(memo.match('key-a', edited), null, 'an edited earlier message is not the same list');
  t.equal(memo.match('key-a', turn2), null, 'a list that differs at the remembered length is not found');
});

t.test('the longest remembered list wins, and a list that grows replaces the one it grew from', async (t) => {
  const memo = new PrefixMemo();
  const full = conversation(6);
  let from = null;
  for (let n = 2; n <= full.length; n += 4) {
    const list = JSON.parse(JSON.stringify(full.slice(0, n))) as ChatMessage[];
    from = memo.match('k', list);
    if (n > 2) t.equal(from?.length, n - 4, `turn of ${n} messages found the previous turn`);
    memo.remember('k', list, chainHashes(list, from?.chain), null, from);
  }
  t.equal(memo.stats().entries, 1, 'one conversation, one entry');
  const last = JSON.parse(JSON.stringify(full.slice(0, 22))) as ChatMessage[];
  const again = memo.match('k', last);
  t.equal(again?.length, 22, 'the same list again (admission, then the request) is found whole');
  memo.remember('k', last, chainHashes(last, again?.chain), null, again);
  t.equal(memo.stats().entries, 1, 'and is still one entry');

  // Two lists of one key, one a prefix of the other: the longer is the better match.
  const memo2 = new PrefixMemo();
  const short = full.slice(0, 3);
  const long = full.slice(0, 9);
  memo2.remember('k', short, chainHashes(short), null, null);
  memo2.remember('k', long, chainHashes(long), null, null);
  t.equal(memo2.match('k', full.slice(0, 12))?.length, 9);
  t.equal(memo2.match('k', full.slice(0, 8))?.length, 3);
});

t.test('a turn that adds more messages than the memo looks back over is simply not found', async (t) => {
  const memo = new PrefixMemo();
  const full = conversation(MAX_NEW_MESSAGES);
  const first = full.slice(0, 2);
  memo.remember('k', first, chainHashes(first), null, null);
  t.equal(memo.match('k', full.slice(0, 2 + MAX_NEW_MESSAGES))?.length, 2);
  t.equal(memo.match('k', full.slice(0, 3 + MAX_NEW_MESSAGES)), null);
});

t.test('memory is bounded in bytes: the least recently used lists go first', async (t) => {
  const memo = new PrefixMemo(8 * 1024);
  const lists = Array.from({ length: 20 }, (_, i) => [{ role: 'user', content: `conversation ${i} `.repeat(40) }] as ChatMessage[]);
  for (const l of lists) memo.remember('k', l, chainHashes(l), null, null);
  const s = memo.stats();
  t.ok(s.bytes <= 8 * 1024, `${s.bytes} bytes kept`);
  t.ok(s.entries < 20 && s.entries > 0);
  t.ok(memo.match('k', [...lists[19]!, { role: 'assistant', content: 'x' }]), 'the newest is kept');
  t.equal(memo.match('k', [...lists[0]!, { role: 'assistant', content: 'x' }]), null, 'the oldest went');
  const none = new PrefixMemo(0);
  none.remember('k', lists[0]!, chainHashes(lists[0]!), null, null);
  t.equal(none.stats().entries, 0, 'size 0 turns it off');
});

t.test('a list of many short messages is accounted at what it keeps alive, ~250 bytes a message (regression: 64, and the memo held 3× its budget)', async (t) => {
  const memo = new PrefixMemo();
  const list = Array.from({ length: 7000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `${i}` })) as ChatMessage[];
  memo.remember('k', list, chainHashes(list), null, null);
  t.ok(memo.stats().bytes >= 7000 * 256, `${memo.stats().bytes} bytes for 7,000 messages`);
});

t.test('every field a message holds is accounted, not only those counted (regression: a 4 MB tool_call_id was held for free)', async (t) => {
  const memo = new PrefixMemo();
  const big = 'x'.repeat(1_000_000);
  const list = [
    { role: 'user', content: 'look it up' },
    { role: 'tool', tool_call_id: big, content: 'r' },
    { role: 'assistant', content: 'ok', reasoning_content: big, extra: { note: big } },
  ] as unknown as ChatMessage[];
  memo.remember('k', list, chainHashes(list), null, null);
  t.ok(memo.stats().bytes >= 3 * 2 * 1_000_000, `${memo.stats().bytes} bytes for three 1 MB fields`);
  // A budget the fields exceed keeps nothing.
  const small = new PrefixMemo(1_000_000);
  small.remember('k', list, chainHashes(list), null, null);
  t.equal(small.stats().entries, 0);
});

// The same slow pattern the token cache had (test/tokenizers/token-cache.test.ts): a hit must not
// delete from the Map, and an eviction must not start an iterator over it.
t.test('a hit never deletes from the Map; an eviction deletes once; nothing iterates it', async (t) => {
  const lists = Array.from({ length: 400 }, (_, i) => [{ role: 'user', content: `conversation ${i}` }] as ChatMessage[]);
  const memo = new PrefixMemo(64 * 1024);
  for (const l of lists.slice(0, 200)) memo.remember('k', l, chainHashes(l), null, null);
  const full = memo.stats().entries;
  t.ok(full > 50 && full < 200, `${full} lists fill the memo`);
  const hot = lists[199]!;
  const longer = [...hot, { role: 'assistant', content: 'x' }] as ChatMessage[];
  chainHashes(longer); // digests memoised outside the counted part
  let found = 0;
  const hits = countMapCalls(() => {
    for (let i = 0; i < 1000; i++) if (memo.match('k', longer)) found++;
  });
  t.equal(found, 1000);
  t.equal(hits.delete, 0, 'hits delete nothing');
  t.equal(hits.iterators, 0);
  const fresh = lists.slice(200, 200 + Math.floor(full / 2));
  const chains = fresh.map((l) => chainHashes(l));
  const evictions = countMapCalls(() => fresh.forEach((l, i) => memo.remember('k', l, chains[i]!, null, null)));
  t.equal(evictions.iterators, 0, 'eviction never starts an iterator');
  t.equal(evictions.delete, fresh.length, 'one delete per eviction (each new list takes one old one\'s room)');
  t.ok(memo.match('k', longer), 'the list in use stayed');
  t.equal(memo.match('k', [...lists[0]!, { role: 'assistant', content: 'x' }]), null, 'the oldest went');
});

t.test('known counts give the same count as counting again, and spare the look-ups', async (t) => {
  const cache = new TokenCache();
  const counter = new TiktokenCounter('o200k_base', { cache });
  const before = conversation(5);
  const prev = counter.countChatSync({ model: 'gpt-4o', messages: before, tools: TOOLS });
  const after = JSON.parse(JSON.stringify([...before, { role: 'user', content: 'One more: section 6?' }])) as ChatMessage[];

  const cold = new TiktokenCounter('o200k_base', { cache: new TokenCache() }).countChatSync({ model: 'gpt-4o', messages: after, tools: TOOLS });
  const lookupsBefore = cache.stats().hits + cache.stats().misses;
  const warm = counter.countChatSync({ model: 'gpt-4o', messages: after, tools: TOOLS, known: { messages: before.length, method: counter.method, prefix: prev.prefix } });
  t.strictSame(warm, cold, 'identical count, prefix and method');
  t.equal(cache.stats().hits + cache.stats().misses - lookupsBefore, 2, 'only the tools and the new message were looked up');

  const other = counter.countChatSync({ model: 'gpt-4o', messages: after, tools: TOOLS, known: { messages: before.length, method: 'tiktoken:cl100k_base', prefix: prev.prefix.map((p) => p + 1000) } });
  t.strictSame(other, cold, "another counter's counts are ignored");
});

t.test('through the gateway: a warm turn plans exactly as a cold one (after a restart)', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(() => upstream.close());
  const gw = await startGateway(t, {
    upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstream.url}/v1`, apiKeyEnv: 'UP_KEY', models: ['gpt-*'], billing: 'metered', contextWindow: 128_000 }],
    auth: { keys: [{ key: 'tg-memo', tenant: 'acme' }] },
  }, { env: { UP_KEY: 'sk-up' } });
  const g = gw.app.gateway;
  const principal = await g.auth.authenticate('Bearer tg-memo');
  const full = conversation(4);
  // Turns 1–3 go through the real path, so the ledger holds the conversation's head.
  for (const n of [5, 9, 13]) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer tg-memo' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: full.slice(0, n), tools: TOOLS, max_tokens: 50 }),
    });
    t.equal(res.status, 200);
    await res.text();
  }
  const body = () => validateRequest('chat', JSON.parse(JSON.stringify({ model: 'gpt-4o-mini', messages: full.slice(0, 17), tools: TOOLS, max_tokens: 50 })));
  const warm = await plan(g, body(), principal, {});
  t.equal(g.prefixMemo.match(principal.keyId ?? '', full.slice(0, 17))?.length, 17, 'the warm turn was remembered');

  // A restart: the memo is empty, everything is hashed and counted again.
  const memo = g.prefixMemo;
  g.prefixMemo = new PrefixMemo();
  const cold = await plan(g, body(), principal, {});
  g.prefixMemo = memo;

  t.equal(warm.conversationSource, 'inferred');
  t.equal(warm.conversation, cold.conversation, 'the same conversation is found');
  t.strictSame(warm.chain, cold.chain);
  t.strictSame(warm.chatCount, cold.chatCount);
  t.ok(warm.sharedPrefixTokens > 0, `shared ${warm.sharedPrefixTokens} tokens`);
  t.equal(warm.sharedPrefixTokens, cold.sharedPrefixTokens);
  t.equal(warm.promptCharge, cold.promptCharge);
  t.equal(warm.run, cold.run);
});

t.test('tokenCache.prefixMemoBytes sizes the memo; 0 turns it off', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(() => upstream.close());
  const gw = await startGateway(t, {
    upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstream.url}/v1`, apiKeyEnv: 'UP_KEY', models: ['gpt-*'] }],
    tokenCache: { prefixMemoBytes: 0 },
  }, { env: { UP_KEY: 'sk-up' } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', messages: conversation(2), max_tokens: 20 }),
  });
  t.equal(res.status, 200);
  await res.text();
  t.same(gw.app.gateway.prefixMemo.stats(), { entries: 0, bytes: 0, maxBytes: 0 });
});

// An outside audit: a list that grew was sized as the earlier list plus its new messages, and kept
// this request's copies of the earlier ones, which match canonically — a null member is no member —
// whatever members they add. Resent with 1 MB of null members' names each, 200 conversations held
// 200 MB while the memo counted a few hundred KB.
t.test("a list that grew keeps the earlier list's messages, the ones its size was measured on", async (t) => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const memo = new PrefixMemo();
  gc();
  const before = process.memoryUsage().heapUsed;
  for (let c = 0; c < 200; c++) {
    const turn1: ChatMessage[] = [{ role: 'user', content: `Conversation ${c}: what is the capital of France?` }];
    memo.remember('k', turn1, chainHashes(turn1), null, null);
    // The same message, with a null member whose name is 1 MB long, then a new one.
    const fat = { role: 'user', content: `Conversation ${c}: what is the capital of France?`, ['x'.repeat(1 << 20) + c]: null } as unknown as ChatMessage;
    const turn2: ChatMessage[] = [fat, { role: 'assistant', content: `Paris (${c}).` }];
    const from = memo.match('k', turn2);
    t.equal(from?.length, 1, `conversation ${c}: the first message matched`);
    memo.remember('k', turn2, chainHashes(turn2, from?.chain), null, from);
  }
  // Twice: one full collection can leave large strings it freed for the next to give back.
  gc();
  gc();
  const grown = process.memoryUsage().heapUsed - before;
  t.ok(grown < 20_000_000, `200 MB of null members' names were sent; the heap grew ${(grown / 1e6).toFixed(1)} MB`);
  t.ok(memo.stats().bytes < 1_000_000, 'and the memo counts what it holds');
});

// A review: remember() took the list a request grew from by its key, not as matched. Another
// conversation's list of the same key (same length, same last message) that took its place while
// the request was counted became the grown list's leading messages, under this conversation's
// chain: the other conversation's next turn then matched it and took that chain and those counts.
t.test('a list that grew from an entry since replaced is remembered as its own messages', async (t) => {
  const memo = new PrefixMemo();
  const go = () => ({ role: 'user' as const, content: 'Continue.' });
  const a1: ChatMessage[] = [{ role: 'system', content: 'You are agent A.' }, go()];
  memo.remember('k', a1, chainHashes(a1), null, null);
  const a2: ChatMessage[] = [{ role: 'system', content: 'You are agent A.' }, go(), { role: 'assistant', content: 'ok' }, { role: 'user', content: 'next' }];
  const fromA = memo.match('k', a2);
  t.equal(fromA?.length, 2);
  // While a2 is counted, conversation B's first list, of the same key, takes a1's place.
  const b1: ChatMessage[] = [{ role: 'system', content: 'You are agent B, with a longer prompt.' }, go()];
  t.equal(memo.match('k', b1), null);
  memo.remember('k', b1, chainHashes(b1), null, null);
  memo.remember('k', a2, chainHashes(a2, fromA?.chain), null, fromA);
  // B's next turn must not find a2's chain.
  const b2: ChatMessage[] = [{ role: 'system', content: 'You are agent B, with a longer prompt.' }, go(), { role: 'assistant', content: 'ok' }, { role: 'user', content: 'next' }];
  const m = memo.match('k', b2);
  t.ok(m === null || m.length === 2, `B's next turn matches at most its own first list (matched ${m?.length})`);
  if (m !== null) t.same(m.chain, chainHashes(b1), "with B's own chain");
  // And A's next turn still finds its own.
  const a3 = [...JSON.parse(JSON.stringify(a2)) as ChatMessage[], { role: 'assistant' as const, content: 'done' }];
  t.same(memo.match('k', a3)?.chain, chainHashes(a2), "A's next turn finds A's chain");
});
