// TiktokenCounter with a worker pool (SPEC §3 last paragraph, ADR 0009): large texts are counted
// off the main thread with results identical to the inline path, small ones stay inline, cache
// hits never leave the main thread, and the event loop keeps turning while a big count runs.
import t from 'tap';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { CountPool, CountPoolError } from '../../metering/tokenizers/count-pool.js';
import { TokenCache } from '../../metering/token-cache.js';
import type { ChatMessage, ChatPrompt, ToolDefinition } from '../../metering/types.js';
import { base64, multiByte, noSpaceRuns, prose } from './worker-texts.js';

const nextTurn = () => new Promise<void>((resolve) => setImmediate(resolve));

const TOOLS: ToolDefinition[] = [
  {
    type: 'function',
    function: {
      name: 'read_file',
      description: `Read a file. ${prose(3_000, 9)}.`,
      parameters: { type: 'object', properties: { path: { type: 'string', enum: ['a', 'b'], description: 'which' } } },
    },
  },
];

function chatOf(model: string): ChatPrompt {
  const messages: ChatMessage[] = [
    { role: 'system', content: prose(30_000) },
    { role: 'user', name: 'ana', content: [{ type: 'text', text: base64(30_000) }, { type: 'image_url' }] },
    { role: 'assistant', tool_calls: [{ id: 'c1', type: 'function', function: { name: 'read_file', arguments: noSpaceRuns(8_000) } }] },
    { role: 'tool', tool_call_id: 'c1', content: multiByte(8_000) },
  ];
  return { model, messages, tools: TOOLS };
}

t.test('identical counts inline and in a worker: prose, base64, no-space runs, multi-byte', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  const texts = { prose: prose(100_000), base64: base64(100_000), noSpace: noSpaceRuns(50_000), multiByte: multiByte(30_000) };
  for (const encoding of ['o200k_base', 'cl100k_base'] as const) {
    const inline = new TiktokenCounter(encoding, { cache: new TokenCache() });
    // inlineBytes 0: every piece of work goes to the pool.
    const pooled = new TiktokenCounter(encoding, { cache: new TokenCache(), pool, inlineBytes: 0 });
    for (const [name, text] of Object.entries(texts)) {
      t.same(await pooled.countText(text), await inline.countText(text), `${encoding} ${name}: countText`);
    }
    const model = encoding === 'o200k_base' ? 'gpt-4o' : 'gpt-4';
    const viaWorker = await pooled.countChat(chatOf(model));
    t.same(viaWorker, await inline.countChat(chatOf(model)), `${encoding}: countChat (tokens, prefix, label)`);
    t.same(viaWorker, inline.countChatSync(chatOf(model)), `${encoding}: countChatSync agrees`);
    t.equal(viaWorker.upperBound, true, 'the no-space run was cut, so the chat count is labelled an upper bound');
    t.same(pooled.stats(), { inline: 0, pooled: 5 }, `${encoding}: all the work went to the pool`);
    t.same(inline.stats(), { inline: 5, pooled: 0 }, `${encoding}: a counter without a pool never leaves the thread`);
  }
});

t.test('small work stays inline, large work goes to the pool, cache hits cost no work', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache(), pool });
  await nextTurn();
  // 1. a 1 KB text: inline, the pool never starts
  await counter.countText(prose(1_000));
  t.same(counter.stats(), { inline: 1, pooled: 0 });
  t.equal(pool.stats().started, 0, 'no worker for small work');
  await nextTurn();
  // 2. a 64 KB text: to the pool
  const big = prose(64_000, 7);
  const first = await counter.countText(big);
  t.same(counter.stats(), { inline: 1, pooled: 1 });
  t.equal(pool.stats().jobs, 1);
  // 3. the same text again: a cache hit on the main thread, no job anywhere
  t.same(await counter.countText(big), first);
  t.same(counter.stats(), { inline: 1, pooled: 1 });
  t.equal(pool.stats().jobs, 1);
  // 4. a chat whose only new message is small: the large old ones are cache hits, the new one inline
  const chat = chatOf('gpt-4o');
  await counter.countChat(chat);
  t.same(counter.stats(), { inline: 1, pooled: 2 }, 'first sight of the big chat: one batch to the pool');
  await nextTurn();
  const next = { ...chat, messages: [...chat.messages, { role: 'user', content: 'and then?' }] };
  await counter.countChat(next);
  t.same(counter.stats(), { inline: 2, pooled: 2 }, 'turn N counts only what turn N added, inline');
  t.equal(pool.stats().jobs, 2);
});

t.test('many small rows in one turn do not add up to a long inline stall', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  const counter = new TiktokenCounter('cl100k_base', { cache: new TokenCache(), pool });
  await nextTurn();
  // Eight 15 KB rows, each under the 16 KiB threshold, started in the same turn (as plan() does
  // with Promise.all over completions rows): the first fits the turn's inline budget, the rest go.
  const rows = Array.from({ length: 8 }, (_, i) => prose(15_000, 100 + i));
  const counts = await Promise.all(rows.map((row) => counter.countText(row)));
  t.same(counter.stats(), { inline: 1, pooled: 7 });
  const reference = new TiktokenCounter('cl100k_base', { cache: new TokenCache() });
  t.same(counts, await Promise.all(rows.map((row) => reference.countText(row))), 'same counts as all-inline');
});

t.test('the main thread keeps turning while a 2 MB count runs in a worker', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache(), pool });
  await counter.countText(prose(20_000, 11)); // 1. start and warm the worker
  await nextTurn();

  // 2. a setImmediate ticker runs only when the event loop gets a turn
  const ticking = (work: () => Promise<unknown>) => async () => {
    let ticks = 0;
    let on = true;
    const tick = () => {
      ticks++;
      if (on) setImmediate(tick);
    };
    setImmediate(tick);
    const result = await work();
    on = false;
    return { ticks, result };
  };
  const huge = base64(2 * 1024 * 1024, 12);
  const before = counter.stats().pooled;
  const pooled = await ticking(() => counter.countText(huge))();
  t.ok(pooled.ticks > 0, `the loop turned ${pooled.ticks} times during the pooled count`);
  t.equal(counter.stats().pooled, before + 1, 'the 2 MB count ran in the pool');

  // 3. the contrast that makes the ticker meaningful: the same kind of work inline gives it no turn
  const inline = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
  const blocked = await ticking(() => inline.countText(base64(64 * 1024, 13)))();
  t.equal(blocked.ticks, 0, 'inline counting holds the loop for the whole count');
  t.same(pooled.result, await inline.countText(huge), '2 MB: same count as inline');
});

t.test('a failing pool rejects the count (the pipeline falls back); small work still counts', async (t) => {
  const pool = new CountPool();
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache(), pool });
  await pool.close();
  await nextTurn();
  await t.rejects(counter.countText(prose(64_000)), CountPoolError);
  await nextTurn();
  t.same(await counter.countText('hello world'), { tokens: 2, method: 'tiktoken:o200k_base', upperBound: false });
  t.equal(counter.countOutput(prose(64_000)), new TiktokenCounter('o200k_base').countOutput(prose(64_000)), 'countOutput stays sync and inline');
});
