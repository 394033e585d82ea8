// Client disconnect and upstream loss (SPEC §2.7, §11).
// - A client that goes away makes the gateway abort the upstream request at once, and the ledger
//   row is settled as 499, charged the prompt + what was generated, the rest refunded.
// - An upstream lost mid-stream: the client is told with an error event (the OpenAI SDKs throw an
//   APIError on it), charged prompt + generated so far, the rest refunded; the ledger says 502.
// The doubles stall (hold the connection open, sending nothing) rather than sleep, so the tests
// wait on events, never on time: an upstream that was not aborted would stay open until teardown.

import t, { type Test } from 'tap';
import OpenAI from 'openai';
import { startOpenAiDouble, type RecordedRequest } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, openaiUpstream, llamaUpstream, type TestGateway } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';
import { openStore } from '../../metering/stores/open-store.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const tick = () => new Promise((r) => setTimeout(r, 10));

async function until<T>(what: string, probe: () => T | null | undefined | false | Promise<T | null | undefined | false>): Promise<T> {
  // Bounded only by tap's own test timeout: no assertion depends on how long this takes.
  for (;;) {
    const v = await probe();
    if (v) return v;
    await tick();
  }
}

async function onlyRow(gw: TestGateway): Promise<LedgerRow> {
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  if (rows.length !== 1) throw new Error(`expected one ledger row, found ${rows.length}`);
  return rows[0];
}

const settledRow = (gw: TestGateway) => until('row settled', async () => {
  const row = await onlyRow(gw).catch(() => null);
  return row && row.state === 'settled' ? row : null;
});

/** Reads SSE `data:` events from a fetch body until `enough` says stop; returns them parsed. */
async function readEvents(body: ReadableStream<Uint8Array>, enough: (events: Array<Record<string, unknown>>) => boolean): Promise<Array<Record<string, unknown>>> {
  const reader = body.getReader();
  const decoder = new TextDecoder();
  const events: Array<Record<string, unknown>> = [];
  let buffer = '';
  while (!enough(events)) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    let at: number;
    while ((at = buffer.indexOf('\n\n')) !== -1) {
      const event = buffer.slice(0, at);
      buffer = buffer.slice(at + 2);
      if (event.startsWith('data: ') && !event.startsWith('data: [DONE]')) events.push(JSON.parse(event.slice(6)) as Record<string, unknown>);
    }
  }
  reader.releaseLock();
  return events;
}

const contentChunks = (events: Array<Record<string, unknown>>) =>
  events.filter((e) => Array.isArray(e.choices) && e.choices.some((c: { delta?: { content?: string } }) => (c.delta?.content ?? '') !== '')).length;

async function gatewayWith(t: Test, opts: Parameters<typeof startOpenAiDouble>[0]) {
  const upstream = await startOpenAiDouble(opts);
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  return { upstream, gw };
}

t.test('client aborts a stream mid-way: upstream aborted, 499, charged prompt + streamed', async (t) => {
  // 1. the upstream streams 3 tokens, then stalls with the connection open
  const { upstream, gw } = await gatewayWith(t, { completionTokens: 50, stallAfterChunks: 3 });
  const abort = new AbortController();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'stream then leave' }], max_tokens: 40, stream: true }),
    signal: abort.signal,
  });
  t.equal(res.status, 200);
  const reserved = Number(res.headers.get('x-tollgate-reserved-tokens'));
  const events = await readEvents(res.body!, (e) => contentChunks(e) >= 3);
  t.equal(contentChunks(events), 3, 'the client read three tokens');
  const seen: RecordedRequest = upstream.requests.at(-1)!;
  t.equal(seen.chunksSent, 3);
  t.notOk(seen.closedEarly, 'upstream still open while the client reads');

  // 2. the client goes away: the gateway closes the upstream request (not left to stall)
  abort.abort();
  await until('upstream closed', () => seen.closedEarly);
  t.ok(seen.closedEarly, 'the upstream saw its request closed before it finished');

  // 3. settled: 499, prompt + 3 generated, the other 37 refunded
  const row = await settledRow(gw);
  t.equal(row.status, 499);
  t.equal(row.reserved_tokens, reserved);
  t.equal(row.allowance, 40);
  t.equal(row.generated_tokens, 3);
  t.equal(row.charge_tokens, row.prompt_charge + 3);
  t.equal(row.refund_tokens, 37);
  t.equal(row.charge_tokens! + row.refund_tokens!, row.reserved_tokens);
});

t.test('client aborts a non-streamed request while waiting: upstream aborted, 499, prompt charged', async (t) => {
  // 1. the upstream never answers
  const { upstream, gw } = await gatewayWith(t, { hang: true });
  const abort = new AbortController();
  const pending = fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'wait then leave' }], max_tokens: 40 }),
    signal: abort.signal,
  });
  const seen = await until('upstream got the request', () => upstream.requests.at(-1));
  // 2. the reservation is open while the request waits
  const open = await onlyRow(gw);
  t.equal(open.state, 'reserved');
  abort.abort();
  await t.rejects(pending, { name: 'AbortError' });

  // 3. the gateway aborts the upstream request and settles what the model read
  await until('upstream closed', () => seen.closedEarly);
  t.ok(seen.closedEarly);
  const row = await settledRow(gw);
  t.equal(row.status, 499);
  t.equal(row.generated_tokens, 0, 'nothing came back');
  t.equal(row.charge_tokens, row.prompt_charge, 'the prompt was read by the model: charged');
  t.ok(row.prompt_charge > 0);
  t.equal(row.refund_tokens, 40, 'the whole allowance refunded');
});

t.test('OpenAI upstream lost mid-stream: the SDK throws an APIError, charged prompt + generated', async (t) => {
  const { gw } = await gatewayWith(t, { completionTokens: 30, dropAfterChunks: 4 });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const { data: stream, response } = await client.chat.completions
    .create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'lose me' }], max_tokens: 30, stream: true, stream_options: { include_usage: true } })
    .withResponse();
  let text = '';
  let finish: string | null = null;
  // 1. the SDK's iteration gives the four tokens that came, then throws: the answer is not whole
  const err = await (async () => {
    for await (const chunk of stream) {
      text += chunk.choices[0]?.delta?.content ?? '';
      finish = chunk.choices[0]?.finish_reason ?? finish;
    }
  })().then(
    () => null,
    (e: unknown) => e,
  );
  t.equal(text, ' hi hi hi hi', 'the four tokens that came');
  t.equal(finish, null, 'no finish_reason pretends the answer ended');
  t.ok(err instanceof OpenAI.APIError, 'an APIError');
  t.match((err as InstanceType<typeof OpenAI.APIError>).message, /the connection to upstream "openai" was lost/);
  t.equal((err as InstanceType<typeof OpenAI.APIError>).code, 'upstream_lost');
  const reserved = Number(response.headers.get('x-tollgate-reserved-tokens'));
  // 2. prompt + 4 charged, 26 refunded; the ledger records an upstream failure
  const row = await settledRow(gw);
  t.equal(row.status, 502);
  t.equal(row.reserved_tokens, reserved);
  t.equal(row.generated_tokens, 4);
  t.equal(row.charge_tokens, row.prompt_charge + 4);
  t.equal(row.refund_tokens, 26);
});

t.test('upstream lost before any output (the role chunk only): the whole reservation refunded', async (t) => {
  const { gw } = await gatewayWith(t, { completionTokens: 30, dropAfterChunks: 0 });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'fail at once' }], max_tokens: 30, stream: true }),
  });
  t.equal(res.status, 200, 'the stream had started');
  const reserved = Number(res.headers.get('x-tollgate-reserved-tokens'));
  const text = await res.text();
  t.notMatch(text, /"content":"[^"]+"/, 'no text came');
  const trailer = JSON.parse(/^: tollgate (.*)$/m.exec(text)![1]) as { charge_tokens: number; refund_tokens: number; cost_usd: number };
  t.same(trailer, { charge_tokens: 0, refund_tokens: reserved, cost_usd: 0 });
  const row = await settledRow(gw);
  t.equal(row.generated_tokens, 0);
  t.equal(row.charge_tokens, 0, 'the prompt is not charged: the model produced nothing');
  t.equal(row.refund_tokens, row.reserved_tokens);
  t.equal(row.reserved_tokens, reserved);
  t.equal(row.cost_usd, 0);
});

t.test('llama.cpp upstream lost mid-stream: an error event, then the settled figures and [DONE]', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 20, dropMidStream: 4, delayMs: 1 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'lose me too' }], max_tokens: 20, stream: true }),
  });
  t.equal(res.status, 200);
  const text = await res.text();
  // 1. an error event for the lost upstream (no finish_reason), the settled comment, then [DONE]
  t.match(text, /data: \{"error":\{"message":"the connection to upstream \\"[^"\\]+\\" was lost part way through the stream","type":"upstream_error","param":null,"code":"upstream_lost","upstream":"[^"]+"\}\}/);
  t.notMatch(text, /"finish_reason":"length"/);
  t.ok(text.endsWith('data: [DONE]\n\n'));
  const trailer = /^: tollgate (.*)$/m.exec(text);
  t.ok(trailer, 'the settled figures in a closing comment');
  const settled = JSON.parse(trailer![1]) as { charge_tokens: number; refund_tokens: number };
  const content = text.split('\n\n').filter((e) => /"content":"[^"]+"/.test(e)).length;
  t.ok(content > 0 && content < 20, `some tokens came before the drop (${content})`);
  // 2. prompt + what came charged, the rest refunded
  const row = await settledRow(gw);
  t.equal(row.generated_tokens, content);
  t.equal(row.charge_tokens, row.prompt_charge + content);
  t.equal(row.refund_tokens, 20 - content);
  t.same(settled, { charge_tokens: row.charge_tokens, refund_tokens: row.refund_tokens, cost_usd: 0 });
});

for (const as of ['data', 'event'] as const) {
  t.test(`an upstream error part way through a stream (${as === 'data' ? 'an error chunk' : 'an error event'}) reaches the SDK as an APIError`, async (t) => {
    const error = { message: 'Provider returned error', type: 'server_error', param: null, code: 'provider_error' };
    const { gw } = await gatewayWith(t, { completionTokens: 30, errorAfterChunks: { chunks: 3, as, error } });
    const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
    const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'fail part way' }], max_tokens: 30, stream: true });
    let text = '';
    const err = await (async () => {
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
    })().then(
      () => null,
      (e: unknown) => e,
    );
    t.equal(text, ' hi hi hi');
    t.ok(err instanceof OpenAI.APIError, 'an APIError');
    t.match((err as InstanceType<typeof OpenAI.APIError>).message, /Provider returned error/);
    t.equal((err as InstanceType<typeof OpenAI.APIError>).code, 'provider_error');
    const row = await settledRow(gw);
    t.equal(row.status, 502, 'the ledger records the upstream failure');
    t.equal(row.generated_tokens, 3);
    t.equal(row.charge_tokens, row.prompt_charge + 3, 'what was generated is charged');
  });
}

t.test('a client that leaves while its request is admitted: nothing is sent upstream, the reservation refunded, 499', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-admit-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ledger = await openStore({ kind: 'sqlite', path: join(dir, 'ledger.db') });
  // Admission waits until the test says so: the client leaves in between.
  let admitting: () => void = () => {};
  const reached = new Promise<void>((r) => (admitting = r));
  let release: () => void = () => {};
  const released = new Promise<void>((r) => (release = r));
  const admit = ledger.admit.bind(ledger);
  ledger.admit = async (r) => {
    admitting();
    await released;
    return admit(r);
  };
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger });
  const abort = new AbortController();
  const pending = fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'never mind' }], max_tokens: 40 }),
    signal: abort.signal,
  }).catch(() => null);
  await reached;
  abort.abort();
  await pending;
  await until('the gateway saw the client go', () => new Promise<boolean>((r) => gw.app.server.getConnections((_e, n) => r(n === 0))));
  release();
  const row = await settledRow(gw);
  t.equal(upstream.requests.length, 0, 'the model was never asked');
  t.equal(row.status, 499);
  t.equal(row.charge_tokens, 0, 'no model read the prompt');
  t.equal(row.refund_tokens, row.reserved_tokens);
});

t.test('a client that leaves a stream before any output pays for the prompt the model read: 499, as after output', async (t) => {
  // The upstream sends its head and the role chunk, then holds the connection open.
  const { upstream, gw } = await gatewayWith(t, { completionTokens: 50, stallAfterChunks: 0 });
  const abort = new AbortController();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'leave early' }], max_tokens: 40, stream: true }),
    signal: abort.signal,
  });
  // The head came: the upstream has answered, sent its role chunk and is holding.
  t.equal(res.status, 200);
  t.equal(upstream.requests.length, 1);
  abort.abort();
  const row = await settledRow(gw);
  t.equal(row.status, 499, 'the client left; the upstream did not fail');
  t.equal(row.charge_tokens, row.prompt_charge, 'the prompt charged, as when output had come');
  t.equal(row.refund_tokens, 40);
});
