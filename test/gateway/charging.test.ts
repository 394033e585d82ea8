// The charge of SPEC §4 through the real HTTP path: a shared prefix is not charged again, unused
// output is refunded, the whole allowance must fit, model or tool changes are charged in full, the
// budget holds under 200 concurrent requests, and a stream is cut at the allowance.

import t from 'tap';
import { get_encoding as getEncoding } from '@dqbd/tiktoken';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore } from '../../metering/stores/open-store.js';

type Json = Record<string, unknown>;

function client(url: string) {
  return async (body: Json, headers: Record<string, string> = {}) => {
    const res = await fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...headers },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    const h = (n: string) => Number(res.headers.get(n));
    return {
      status: res.status,
      text,
      json: () => JSON.parse(text) as Json,
      reserved: h('x-tollgate-reserved-tokens'),
      charge: h('x-tollgate-charge-tokens'),
      refund: h('x-tollgate-refund-tokens'),
      shared: h('x-tollgate-shared-prefix-tokens'),
      conversation: res.headers.get('x-tollgate-conversation'),
    };
  };
}

async function ledgerRows(gw: { ledger: { exportRows(a: null, b: null): AsyncIterable<LedgerRow> } }) {
  const rows: LedgerRow[] = [];
  for await (const r of gw.ledger.exportRows(null, null)) rows.push(r);
  return rows;
}

const system = { role: 'system', content: 'You are a careful research assistant. Cite your sources.' };

// Regression: a request the upstream failed (refunded whole) left a head that shared nothing, so
// the SDK's retry of it was charged its whole prompt, though the provider still held what the
// request before had cached.
t.test('a retry after a failed request is credited what the failed one was', async (t) => {
  const options: Parameters<typeof startOpenAiDouble>[0] = { completionTokens: 3 };
  const upstream = await startOpenAiDouble(options);
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const send = client(gw.url);
  const turn1 = { model: 'gpt-4o', max_tokens: 50, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(10) }] };
  t.equal((await send(turn1)).status, 200);
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: ' hi hi hi' }, { role: 'user', content: 'And Spain?' }] };
  options.failWith = { status: 429, body: { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } } };
  const failed = await send(turn2);
  t.equal(failed.status, 429);
  t.ok(failed.shared > 16, `the failed request was credited turn 1's prefix (${failed.shared})`);
  options.failWith = undefined;
  const retry = await send(turn2);
  t.equal(retry.status, 200);
  t.equal(retry.conversation, failed.conversation, 'the same conversation');
  t.equal(retry.shared, failed.shared, 'and the retry the same credit');
  t.equal(retry.reserved, failed.reserved, 'so the same reservation');
});

// Review: the head a failure left carried the failure's time, so failures kept the cache's age
// young and a request long after the last read was credited a prefix the provider had dropped.
t.test("failures do not keep a cached prefix alive past its lifetime", async (t) => {
  const options: Parameters<typeof startOpenAiDouble>[0] = { completionTokens: 3 };
  const upstream = await startOpenAiDouble(options);
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { prefixCacheTtlSeconds: 300 })] }, { clock: true });
  const send = client(gw.url);
  const headers = { 'x-tollgate-conversation': 'ttl' };
  const turn1 = { model: 'gpt-4o', max_tokens: 50, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(10) }] };
  t.equal((await send(turn1, headers)).status, 200);
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: ' hi hi hi' }, { role: 'user', content: 'And Spain?' }] };
  options.failWith = { status: 429, body: { error: { message: 'Rate limit reached', type: 'requests', param: null, code: 'rate_limit_exceeded' } } };
  for (let i = 0; i < 4; i++) {
    gw.now.ms += 200_000;
    t.equal((await send(turn2, headers)).status, 429);
  }
  options.failWith = undefined;
  const late = await send(turn2, headers);
  t.equal(late.status, 200);
  t.equal(late.shared, 0, '800 s after the last read: nothing is cached any more');
});

// Audit: with the clock stepped back an hour after a read, the head's age was negative for the
// hour, passed the lifetime test, and a prefix long dropped was credited as shared.
t.test('a prefix read before the clock was stepped back is not credited: its age is unknown', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { prefixCacheTtlSeconds: 300 })] }, { clock: true });
  const warnings: unknown[] = [];
  gw.app.gateway.log.warn = ((obj: unknown, msg?: string) => void warnings.push({ obj, msg })) as typeof gw.app.gateway.log.warn;
  const send = client(gw.url);
  const headers = { 'x-tollgate-conversation': 'stepped' };
  const turn1 = { model: 'gpt-4o', max_tokens: 50, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(10) }] };
  // 1. A first read; 2. the clock is stepped back an hour; 3. ten real minutes pass.
  t.equal((await send(turn1, headers)).status, 200);
  gw.now.ms -= 3_600_000;
  gw.now.ms += 600_000;
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: ' hi hi hi' }, { role: 'user', content: 'And Spain?' }] };
  const late = await send(turn2, headers);
  t.equal(late.status, 200);
  t.equal(late.shared, 0, 'charged its whole prompt');
  t.match(warnings, [{ obj: { ahead_ms: 3_000_000 }, msg: /ahead of this clock/ }], 'the operator is told, once');
  // 4. The next turn's head is written by the stepped clock: sharing goes on as before.
  const turn3 = { ...turn2, messages: [...turn2.messages, { role: 'assistant', content: ' hi hi hi' }, { role: 'user', content: 'And Italy?' }] };
  t.ok((await send(turn3, headers)).shared > 0, 'the turn after shares again');
  t.equal(warnings.length, 1);
});

t.test('a shared prefix is charged once; unused output is refunded', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const send = client(gw.url);
  // 1. turn one: nothing shared, charged in full
  const turn1 = { model: 'gpt-4o', max_tokens: 50, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(10) }] };
  const r1 = await send(turn1);
  t.equal(r1.status, 200);
  t.equal(r1.shared, 0);
  t.equal(r1.refund, 47, 'allowance 50, 3 generated');
  const prompt1 = r1.reserved - 50;
  t.equal(r1.charge, prompt1 + 3);
  // 2. turn two (inferred conversation): the leading messages are shared, less 16
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: ' hi hi hi' }, { role: 'user', content: 'And Spain?' }] };
  const r2 = await send(turn2);
  t.equal(r2.conversation, r1.conversation, 'conversation inferred from the message list');
  t.ok(r2.shared > 0);
  const plan = await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': r1.conversation! }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: turn2 }) })).json() as Json;
  const total2 = (plan.row_tokens as number[])[0];
  t.equal(r2.reserved - 50, total2 - (r2.shared - 16), 'prompt charge = prompt − (shared − 16)');
  t.ok(r2.reserved - 50 < total2 / 2, 'far less than the whole prompt');
  // 3. a different model or a different tool offer shares nothing
  const r3 = await send({ ...turn2, model: 'gpt-4o-mini', messages: [...turn2.messages, { role: 'assistant', content: 'x' }, { role: 'user', content: 'y' }] });
  t.equal(r3.shared, 0, 'model change → full charge');
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const r4 = await send({ ...turn2, tools, messages: [...turn2.messages, { role: 'assistant', content: 'x' }, { role: 'user', content: 'z' }] }, { 'x-tollgate-conversation': r1.conversation! });
  t.equal(r4.shared, 0, 'tool offer change → full charge');
  // The same tools sent again share the prefix; with their keys in another order they are another
  // prompt — a template prints them as they came — and share nothing (regression: hashed as
  // canonical JSON, the reordered offer was credited what the server did not reuse).
  const turn4 = [...turn2.messages, { role: 'assistant', content: 'x' }, { role: 'user', content: 'z' }];
  const turn5 = [...turn4, { role: 'assistant', content: 'w' }, { role: 'user', content: 'v' }];
  const r5 = await send({ ...turn2, tools, messages: turn5 }, { 'x-tollgate-conversation': r1.conversation! });
  t.ok(r5.shared > 0, 'the same offer: shared');
  const reordered = [{ function: { parameters: { properties: {}, type: 'object' }, name: 'search' }, type: 'function' }];
  const r6 = await send({ ...turn2, tools: reordered, messages: [...turn5, { role: 'assistant', content: 'u' }, { role: 'user', content: 't' }] }, { 'x-tollgate-conversation': r1.conversation! });
  t.equal(r6.shared, 0, 'the same tools, keys reordered → full charge');
  // 4. the ledger records charge, refund and the invariant holds per run
  const rows = await ledgerRows(gw);
  t.equal(rows.length, 6);
  for (const row of rows) {
    t.equal(row.state, 'settled');
    t.equal(row.reserved_tokens, (row.charge_tokens ?? 0) + (row.refund_tokens ?? 0), 'reserved = charge + refund');
  }
});

// Regression (an outside audit): the prefix memo's longest remembered list was asked for first, so
// a warm gateway put a request into the conversation whose head was longest, and the same request
// after a restart (a cold memo) into the most recent one: another conversation, another charge.
t.test('the conversation a request joins does not depend on the prefix memo: the most recent matching head, warm or cold', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const q = { role: 'user', content: 'Name three rivers of Europe.' };
  const a = { role: 'assistant', content: 'The Danube, the Rhine and the Loire.' };
  const q2 = { role: 'user', content: 'Which is the longest?' };
  const longer = [q, a, q2, { role: 'assistant', content: 'The Danube.' }, { role: 'user', content: 'Where does it rise?' }];
  const seen: Record<string, Json> = {};
  for (const [memo, prefixMemoBytes] of [['warm', 32 * 1024 * 1024], ['cold', 0]] as const) {
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], tokenCache: { prefixMemoBytes } });
    const send = client(gw.url);
    const first = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [q, a, q2] });
    const fresh = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [q] });
    t.not(fresh.conversation, first.conversation, `${memo}: a list the first head is no prefix of begins its own conversation`);
    const next = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: longer });
    t.equal(next.conversation, fresh.conversation, `${memo}: the most recent request whose list leads this one's (SPEC §8)`);
    seen[memo] = { shared: next.shared, charge: next.charge };
  }
  t.same(seen.warm, seen.cold, 'the same charge warm and cold');
});

// Regression (two outside audits of SPEC §8): only each conversation's latest request was looked
// at, so a request that went back a turn (a regenerated or edited answer) began a new conversation:
// a fresh run, no shared prefix, and none of the conversation's cap.
t.test('a request that goes back a turn joins the conversation whose earlier request leads it', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const send = client(gw.url);
  const u1 = { role: 'user', content: 'Summarise the history of the Hanseatic League in a few paragraphs, please. '.repeat(4) };
  const first = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [u1] });
  const second = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [u1, { role: 'assistant', content: 'It was a trading league.' }, { role: 'user', content: 'Shorter.' }] });
  t.equal(second.conversation, first.conversation);
  // Another answer to the first question, and a follow-up: the first request's list leads this one.
  const branch = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [u1, { role: 'assistant', content: 'Merchants of the Baltic.' }, { role: 'user', content: 'Longer.' }] });
  t.equal(branch.conversation, first.conversation, 'the same conversation (SPEC §8: the most recent request whose list leads this one)');
  t.ok(branch.shared > 16, `the first question is shared: ${branch.shared} tokens`);
  // The branch's follow-up leads the next request in turn: the conversation goes on.
  const next = await send({ model: 'gpt-4o-mini', max_tokens: 20, messages: [u1, { role: 'assistant', content: 'Merchants of the Baltic.' }, { role: 'user', content: 'Longer.' }, { role: 'assistant', content: 'x' }, { role: 'user', content: 'y' }] });
  t.equal(next.conversation, first.conversation);
});

t.test('a structured-output schema is read with the prompt: counted, shared while unchanged, charged again when it changes', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const send = client(gw.url);
  const properties: Record<string, unknown> = {};
  for (let i = 0; i < 40; i++) properties[`field_${i}`] = { type: 'string', description: `The value of field number ${i} as it appears in the source document.` };
  const schema = { name: 'extraction', strict: true, schema: { type: 'object', properties, required: Object.keys(properties), additionalProperties: false } };
  const format = { type: 'json_schema', json_schema: schema };
  const turn1 = { model: 'gpt-4o', max_tokens: 50, messages: [system, { role: 'user', content: 'Extract the fields from the attached memo.' }] };
  const plain = await send(turn1, { 'x-tollgate-conversation': 'no-schema' });
  const withSchema = await send({ ...turn1, response_format: format }, { 'x-tollgate-conversation': 'schema' });
  t.equal(plain.status, 200);
  t.equal(withSchema.status, 200);
  t.same((upstream.requests.at(-1)?.body as Json).response_format, format, 'passed on as sent');
  const { get_encoding } = await import('@dqbd/tiktoken');
  const enc = get_encoding('o200k_base');
  const schemaTokens = enc.encode_ordinary(JSON.stringify(schema)).length;
  enc.free();
  t.ok(schemaTokens > 600, `the schema is ${schemaTokens} tokens`);
  t.equal(withSchema.reserved - plain.reserved, schemaTokens, 'the schema is charged as prompt (it was free)');
  // The next turn with the same schema shares it with the messages; a changed schema shares nothing.
  const turn2 = { ...turn1, response_format: format, messages: [...turn1.messages, { role: 'assistant', content: '{}' }, { role: 'user', content: 'Again, please.' }] };
  const again = await send(turn2, { 'x-tollgate-conversation': 'schema' });
  t.ok(again.shared > schemaTokens, `shared ${again.shared}: the schema and the leading messages`);
  const changed = { ...turn2, messages: [...turn2.messages, { role: 'assistant', content: '{}' }, { role: 'user', content: 'Once more.' }], response_format: { type: 'json_schema', json_schema: { ...schema, name: 'extraction_v2' } } };
  const r3 = await send(changed, { 'x-tollgate-conversation': 'schema' });
  t.equal(r3.shared, 0, 'a changed schema shares nothing, like a changed tool offer');
  // json_object carries no schema: nothing to count.
  const jsonMode = await send({ ...turn1, response_format: { type: 'json_object' } }, { 'x-tollgate-conversation': 'json-mode' });
  t.equal(jsonMode.reserved, plain.reserved);
});

t.test('the whole allowance must fit before a request starts', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 100 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 300, answerReserveTokens: 10 } });
  const send = client(gw.url);
  const body = { model: 'gpt-4o', max_tokens: 100, messages: [{ role: 'user', content: 'Count.' }] };
  const ok = await send(body, { 'x-tollgate-conversation': 'c-fit' });
  t.equal(ok.status, 200);
  // A second request of the same run (same messages) needs prompt + 100; only 300 − (prompt+100) remain.
  const again = await send({ ...body, max_tokens: 250 }, { 'x-tollgate-conversation': 'c-fit' });
  t.equal(again.status, 402);
  const err = again.json().error as Json;
  t.equal(err.code, 'token_budget_exhausted');
  t.equal(typeof err.remaining, 'number');
  t.equal(typeof err.needed, 'number');
  t.ok((err.needed as number) > (err.remaining as number));
  t.equal(upstream.requests.length, 1, 'the refused request never reached the upstream');
});

t.test('200 concurrent requests against a budget that fits exactly K', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 20, delayMs: 1 });
  t.teardown(upstream.close);
  const body = { model: 'gpt-4o', max_tokens: 20, messages: [{ role: 'user', content: 'One more round, please.' }] };
  for (const K of [37, 64, 5]) {
    // 1. learn what one request needs (prefix cache off: every request is charged in full)
    const probeGw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { prefixCache: false })] });
    const probe = (await (await fetch(`${probeGw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { charge: { prompt: number; allowance: number } };
    const each = probe.charge.prompt + probe.charge.allowance;
    // 2. a run budget that fits K of them and not K+1
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { prefixCache: false })], runs: { tokenBudget: K * each + each - 1, answerReserveTokens: 0 } });
    const before = upstream.requests.length;
    const send = client(gw.url);
    const results = await Promise.all(Array.from({ length: 200 }, () => send(body, { 'x-tollgate-conversation': `c-burst-${K}` })));
    t.equal(results.filter((r) => r.status === 200).length, K, `exactly ${K} admitted`);
    t.equal(results.filter((r) => r.status === 402).length, 200 - K, 'the rest refused with 402');
    t.equal(upstream.requests.length - before, K, 'only the admitted reached the upstream');
    // 3. the ledger sums match: remaining = budget − Σcharges + Σrefunds
    const rows = await ledgerRows(gw);
    t.equal(rows.length, K);
    const state = await gw.ledger.getRun(rows[0].run);
    const charges = rows.reduce((a, r) => a + r.reserved_tokens, 0);
    const refunds = rows.reduce((a, r) => a + (r.refund_tokens ?? 0), 0);
    t.equal(state!.usedTokens, charges - refunds);
    t.ok(state!.usedTokens <= state!.budgetTokens!, 'the budget was never crossed');
  }
});

t.test('a non-streamed answer past max_tokens: the token charge stays within the reservation, the money is what was generated', async (t) => {
  const greedy = await startOpenAiDouble({ completionTokens: 20, ignoreMaxTokens: true });
  const honest = await startOpenAiDouble({ completionTokens: 20 });
  t.teardown(greedy.close);
  t.teardown(honest.close);
  const ask = async (url: string, maxTokens: number) => {
    const gw = await startGateway(t, { upstreams: [openaiUpstream(url)] });
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: maxTokens, messages: [{ role: 'user', content: 'Talk on.' }] }),
    });
    const body = (await res.json()) as { usage: { completion_tokens: number } };
    return { usage: body.usage, charge: Number(res.headers.get('x-tollgate-charge-tokens')), reserved: Number(res.headers.get('x-tollgate-reserved-tokens')), cost: Number(res.headers.get('x-tollgate-cost-usd')) };
  };
  const over = await ask(greedy.url, 4);
  const fair = await ask(honest.url, 20);
  t.equal(over.usage.completion_tokens, 20, 'the upstream generated 20 tokens against an allowance of 4');
  t.equal(over.charge, over.reserved, 'the run is charged no more than was reserved');
  t.ok(over.cost > 0);
  t.equal(over.cost, fair.cost, 'the money is the price of the 20 tokens generated, as for an upstream asked for 20');
});

t.test('a stream from an upstream that ignores max_tokens is cut at the allowance', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 40, ignoreMaxTokens: true });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', max_tokens: 7, stream: true, stream_options: { include_usage: true }, messages: [{ role: 'user', content: 'Talk.' }] }),
  });
  const text = await res.text();
  const events = text.split('\n\n').filter(Boolean);
  const chunks = events.filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as Json);
  const content = chunks.map((c) => ((c.choices as Json[])[0]?.delta as Json | undefined)?.content ?? '').join('');
  t.equal(content, ' hi'.repeat(7), 'no more than the allowance reached the client');
  const finish = chunks.map((c) => (c.choices as Json[])[0]?.finish_reason).filter(Boolean);
  t.same(finish, ['length']);
  const usage = chunks.find((c) => c.usage)?.usage as Json;
  t.equal(usage.completion_tokens, 7);
  const comment = events.find((e) => e.startsWith(': tollgate '))!;
  const settled = JSON.parse(comment.slice(': tollgate '.length)) as Json;
  t.equal(settled.refund_tokens, 0);
  t.equal(events.at(-1), 'data: [DONE]');
  t.equal(Number(res.headers.get('x-tollgate-reserved-tokens')), (settled.charge_tokens as number) + (settled.refund_tokens as number));
});

for (const kind of ['chat', 'completions'] as const) {
  t.test(`a stream cut by a chunk that crosses the allowance delivers what of it fits, and is charged the whole allowance (${kind})`, async (t) => {
    // Three tokens a chunk against an allowance of 10: three chunks (9 tokens) fit, the fourth would
    // pass it. Its first token still fits: the client gets it with the cut, and the whole allowance
    // is charged (the upstream generated the rest of that chunk too): nothing is refunded.
    const upstream = await startOpenAiDouble({ completionTokens: 40, ignoreMaxTokens: true, word: ' alpha beta gamma' });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
    const body = kind === 'chat' ? { model: 'gpt-4o', max_tokens: 10, stream: true, messages: [{ role: 'user', content: 'Talk.' }] } : { model: 'gpt-4o', max_tokens: 10, stream: true, prompt: 'Talk.' };
    const res = await fetch(`${gw.url}/v1/${kind === 'chat' ? 'chat/completions' : 'completions'}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
    });
    const text = await res.text();
    const events = text.split('\n\n').filter(Boolean);
    const chunks = events.filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as Json);
    const pieceOf = (c: Json) => {
      const choice = (c.choices as Json[])[0];
      return (kind === 'chat' ? ((choice?.delta as Json | undefined)?.content as string | undefined) : (choice?.text as string | undefined)) ?? '';
    };
    t.equal(chunks.map(pieceOf).join(''), ' alpha beta gamma'.repeat(3) + ' alpha', 'ten tokens reached the client: nine whole chunks and the start of the crossing one');
    t.same(chunks.map((c) => (c.choices as Json[])[0]?.finish_reason).filter(Boolean), ['length']);
    const settled = JSON.parse(events.find((e) => e.startsWith(': tollgate '))!.slice(': tollgate '.length)) as Json;
    const reserved = Number(res.headers.get('x-tollgate-reserved-tokens'));
    t.equal(settled.refund_tokens, 0, 'nothing refunded');
    t.equal(settled.charge_tokens, reserved, 'charged the prompt and the whole allowance');
    const rows = await ledgerRows(gw);
    t.equal(rows.length, 1);
    t.equal(rows[0]!.generated_tokens, 10, 'the ledger records the allowance as generated');
  });
}

t.test("a legacy completions request's best_of is reserved whole: the upstream generates every candidate", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 10 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const post = (path: string, body: Json) => fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const request = { model: 'gpt-3.5-turbo-instruct', prompt: 'Say hi', max_tokens: 10, best_of: 5 };
  const plan = (await (await post('/v1/admission', { endpoint: '/v1/completions', request })).json()) as Json;
  t.equal((plan.charge as Json).allowance, 50, 'max_tokens × best_of');
  const res = await post('/v1/completions', request);
  t.equal(res.status, 200);
  await res.text();
  t.equal(Number(res.headers.get('x-tollgate-reserved-tokens')), ((plan.charge as Json).prompt as number) + 50);
  t.equal((await post('/v1/completions', { ...request, best_of: 3, n: 2 })).status, 200, 'best_of above n');
  const fewer = await post('/v1/completions', { ...request, best_of: 1, n: 2 });
  t.equal(fewer.status, 400, 'best_of below n is no request');
  t.match(await fewer.json(), { error: { param: 'best_of', message: /^best_of: must be at least n \(2\)/ } });
  t.equal(upstream.requests.length, 2, 'the refused one reached no model');
});

t.test('a reservation past 2^31 tokens, and upstream figures no integer column holds, settle on every store', async (t) => {
  // No context window and no run budget bound the allowance: max_tokens × n is 4,000,000,000.
  let reported = 1e12;
  const upstream = await startOpenAiDouble({ completionTokens: 3, promptTokens: () => reported });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: undefined, billing: 'local' })], runs: { tokenBudget: null } });
  const post = client(gw.url);
  const big = await post({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say three words.' }], max_tokens: 2_000_000_000, n: 2 });
  t.equal(big.status, 200, big.text);
  t.equal(big.reserved - big.charge + 6, 4_000_000_000, 'the whole allowance reserved, all but the 6 generated refunded');
  reported = 12.5;
  const odd = await post({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say three words.' }], max_tokens: 10 });
  t.equal(odd.status, 200, odd.text);
  const rows = await ledgerRows(gw);
  t.same(rows.map((r) => [r.state, r.upstream_prompt_tokens]), [['settled', 1e12], ['settled', null]], 'a count that is no whole number is not recorded as one');
});

// Regression: a prompt of token ids was not known as text, so its echo was metered as output and
// the stream cut inside the echo, before the answer (and charged the whole allowance).
t.test('a streamed completion with echo of a token-id prompt: its text is the echo, uncounted', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const { TiktokenCounter } = await import('../../metering/tokenizers/tiktoken-counter.js');
  const words = 'Once upon a time there was a fox who ran.';
  const ids = Array.from(getEncoding('cl100k_base').encode_ordinary(words));
  t.equal(new TiktokenCounter('cl100k_base').decode(ids), words, 'the counter reads ids back');
  t.equal(new TiktokenCounter('cl100k_base').decode([1 << 30]), null, 'and says so of an id it has not');
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-3.5-turbo-instruct', prompt: ids, max_tokens: 5, echo: true, stream: true }),
  });
  const chunks = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as { choices: Array<{ text: string; finish_reason: string | null }> });
  t.equal(chunks.flatMap((c) => c.choices.map((x) => x.text)).join(''), words + ' hi'.repeat(5), 'the prompt, then every token of the answer');
  t.equal(chunks.flatMap((c) => c.choices).at(-1)?.finish_reason, 'stop');
  const rows = await ledgerRows(gw);
  t.equal(rows.at(-1)?.generated_tokens, 5, 'generated: the answer alone');
});

t.test('a streamed completion with echo: the echoed prompt reaches the client uncounted, the answer is metered (regression: cut before it)', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const prompt = 'The quick brown fox jumps over the lazy dog. '.repeat(10);
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-3.5-turbo-instruct', prompt, max_tokens: 5, echo: true, stream: true }),
  });
  t.equal(res.status, 200);
  const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {'));
  const chunks = events.map((e) => JSON.parse(e.slice(6)) as { choices: Array<{ text: string; finish_reason: string | null }> });
  const text = chunks.flatMap((c) => c.choices.map((x) => x.text)).join('');
  t.equal(text, prompt + ' hi'.repeat(5), 'the prompt, then every token of the answer');
  t.equal(chunks.flatMap((c) => c.choices).at(-1)?.finish_reason, 'stop', "the upstream's own finish, not the gateway's cut");
  const reserved = Number(res.headers.get('x-tollgate-reserved-tokens'));
  const rows = await ledgerRows(gw);
  t.equal(rows.at(-1)?.generated_tokens, 5, 'generated: the answer alone');
  t.equal(rows.at(-1)?.refund_tokens, 0);
  t.ok(reserved > 5);
});

// An outside audit: the stream's meter left the echo out, the JSON answer's count did not — an
// upstream that sent no usage had its echoed prompt charged as output (17 for 3 written).
t.test('a completion with echo answered whole and without usage: the echoed prompt is not counted as output', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, omitUsage: true });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const prompt = 'Hello world, this is my prompt';
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-3.5-turbo-instruct', prompt, max_tokens: 10, echo: true, n: 2 }),
  });
  t.equal(res.status, 200);
  const body = (await res.json()) as { choices: Array<{ index: number; text: string }> };
  t.same(body.choices.map((c) => c.text), [prompt + ' hi hi hi', prompt + ' hi hi hi'], 'the echoes reach the client');
  const row = (await ledgerRows(gw)).at(-1)!;
  t.equal(row.generated_tokens, 2 * 3, 'two choices of three tokens each, the echoes left out');
  t.equal(row.output_method, 'tiktoken:cl100k_base');
  t.equal(Number(res.headers.get('x-tollgate-charge-tokens')), row.prompt_charge + 6);
  t.equal(Number(res.headers.get('x-tollgate-refund-tokens')), 2 * 10 - 6);
});

// Review: a request whose planning took seconds (its count, the ledger) read a head written
// meanwhile by a request of its conversation planned after it; measured from the plan's start,
// that head lay ahead by more than clocks differ, and the request was charged in full and sent to
// its final answer, as if the clock had been stepped back.
t.test('a head written while a request was being planned is not taken for a clock stepped back', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-slow-plan-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ledger = await openStore({ kind: 'sqlite', path: join(dir, 'ledger.db') });
  // B's look-up of the head waits until A, the same turn sent later, has been answered.
  const getHead = ledger.getHead.bind(ledger);
  let hold: { entered: () => void; release: Promise<void> } | null = null;
  ledger.getHead = async (conversation) => {
    const held = hold;
    hold = null;
    if (held) {
      held.entered();
      await held.release;
    }
    return getHead(conversation);
  };
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger, clock: true });
  const tools = [{ type: 'function', function: { name: 'read', parameters: { type: 'object', properties: {} } } }];
  const system = { role: 'system', content: 'You are a careful assistant. '.repeat(50) };
  const post = (messages: unknown[]) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'slow-plan' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 20 }),
    });
  const turn1 = [system, { role: 'user', content: 'question one' }];
  await (await post(turn1)).text();
  const turn2 = [...turn1, { role: 'assistant', content: 'an answer' }, { role: 'user', content: 'question two' }];
  let release = () => {};
  const entered = new Promise<void>((resolve) => {
    hold = { entered: resolve, release: new Promise<void>((r) => (release = r)) };
  });
  const b = post(turn2);
  await entered;
  gw.now.ms += 6_500;
  const a = await post(turn2);
  await a.text();
  release();
  const rb = await b;
  await rb.text();
  t.equal(rb.status, 200);
  t.equal(rb.headers.get('x-tollgate-notice'), null, 'not sent to its final answer');
  // (It read the head the other request left, which holds this very turn: it shares at least as much.)
  t.ok(Number(a.headers.get('x-tollgate-shared-prefix-tokens')) > 0);
  t.ok(Number(rb.headers.get('x-tollgate-shared-prefix-tokens')) >= Number(a.headers.get('x-tollgate-shared-prefix-tokens')), 'it shares what was read before');
});

// A review (twentieth session): the tool offer's hash changed from canonical JSON to the offer as
// sent. A head written before holds the old hash: the same offer still shares its prefix, so that
// no conversation open at the upgrade is charged in full for the change of hashing alone.
t.test('a head written under the old hashing of the same tool offer still shares its prefix', async (t) => {
  const { default: Database } = await import('better-sqlite3');
  const { canonicalJson, sha256Hex } = await import('../../metering/canonical-json.js');
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  // The head is rewritten in the SQLite file itself, as an older gateway left it.
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] }, { store: 'sqlite' });
  const send = client(gw.url);
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const conv = { 'x-tollgate-conversation': 'upgraded' };
  const turn1 = { model: 'gpt-4o', max_tokens: 20, tools, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(10) }] };
  t.equal((await send(turn1, conv)).status, 200);
  // The head as a gateway before the change wrote it.
  const db = new Database(gw.dbPath);
  t.teardown(() => db.close());
  const legacy = sha256Hex(canonicalJson({ tools, tool_choice: null }));
  t.equal(db.prepare('UPDATE heads SET tool_hash = ? WHERE conversation = ?').run(legacy, 'upgraded').changes, 1);
  const turn2 = { ...turn1, messages: [...turn1.messages, { role: 'assistant', content: 'Paris.' }, { role: 'user', content: 'And Spain?' }] };
  const r2 = await send(turn2, conv);
  t.ok(r2.shared > 0, 'the same offer under the old hash: shared');
  // The head it leaves holds the new hash: a reordered offer now shares nothing.
  const reordered = [{ function: { parameters: { properties: {}, type: 'object' }, name: 'search' }, type: 'function' }];
  const r3 = await send({ ...turn2, tools: reordered, messages: [...turn2.messages, { role: 'assistant', content: 'Madrid.' }, { role: 'user', content: 'And Italy?' }] }, conv);
  t.equal(r3.shared, 0);
  // Another offer never matches an old hash.
  t.equal(db.prepare('UPDATE heads SET tool_hash = ? WHERE conversation = ?').run(legacy, 'upgraded').changes, 1);
  const other = [{ type: 'function', function: { name: 'fetch', parameters: { type: 'object', properties: {} } } }];
  const r4 = await send({ ...turn2, tools: other, messages: [...turn2.messages, { role: 'assistant', content: 'Rome.' }, { role: 'user', content: 'And Greece?' }] }, conv);
  t.equal(r4.shared, 0, 'a different offer shares nothing');
});
