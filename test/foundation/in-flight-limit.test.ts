// `limits.maxInFlightPerKey` (ADR 0023): a key with that many model requests running gets a 429
// `concurrency_limit_reached` for the next one — before anything is planned, reserved or sent —
// with `retry-after` (the SDKs retry it with their back-off), while other keys go on. A slot is
// given back when its request ends, however it ends. Off by default.
// The upstream double stalls its streams (holds them open) so that requests stay in flight
// without timing: every wait here is on an event.

import t, { type Test } from 'tap';
import { connect, type Socket } from 'node:net';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream, metricValue, type TestGateway } from '../helpers/gateway.js';
import { parseConfig } from '../../server/config.js';
import type { LedgerRow } from '../../metering/ledger.js';

const KEYS = [
  { key: 'tg-busy', tenant: 'busy' },
  { key: 'tg-other', tenant: 'other' },
];

async function rows(gw: TestGateway): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) out.push(row);
  return out;
}

/** The probe's first truthy answer; throws when none comes in 10 s (an event that never happens is a failure, not a hang). */
async function until<T>(probe: () => T | null | undefined | false | Promise<T | null | undefined | false>): Promise<T> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const v = await probe();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`waited 10 s for ${probe.toString()}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

function chat(gw: TestGateway, key: string, body: Record<string, unknown>, signal?: AbortSignal): Promise<Response> {
  return fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: `question ${Math.random()}` }], max_tokens: 20, ...body }),
    signal,
  });
}

/** Opens a stream that the upstream starts and then holds open; resolves once its first chunk arrived. */
async function heldStream(gw: TestGateway, key: string): Promise<{ res: Response; abort: AbortController }> {
  const abort = new AbortController();
  const res = await chat(gw, key, { stream: true }, abort.signal);
  if (res.status !== 200) throw new Error(`stream answered ${res.status}: ${await res.text()}`);
  const reader = res.body!.getReader();
  await reader.read();
  reader.releaseLock();
  return { res, abort };
}

async function gatewayWith(t: Test, limits: Record<string, unknown>) {
  const upstream = await startOpenAiDouble({ completionTokens: 10, stallAfterChunks: 1 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })], auth: { keys: KEYS }, limits });
  return { upstream, gw };
}

t.test('a key at its limit gets a 429 with retry-after, nothing reserved or sent; another key goes on', async (t) => {
  const { upstream, gw } = await gatewayWith(t, { maxInFlightPerKey: 2 });
  const first = await heldStream(gw, 'tg-busy');
  const second = await heldStream(gw, 'tg-busy');
  t.equal(upstream.requests.length, 2);

  const refused = await chat(gw, 'tg-busy', {});
  t.equal(refused.status, 429);
  t.equal(refused.headers.get('retry-after'), '1', 'the SDKs wait this long before their retry');
  t.equal(refused.headers.get('x-should-retry'), null, 'not final, unlike a refusal');
  const body = (await refused.json()) as { error: Record<string, unknown> };
  t.same(body.error, {
    message: 'too many requests in flight for this key: 2 running, the limit is 2; send it again when one has finished',
    type: 'rate_limit_error',
    param: null,
    code: 'concurrency_limit_reached',
    in_flight: 2,
    limit: 2,
  });
  t.equal(upstream.requests.length, 2, 'nothing was sent upstream');
  t.equal((await rows(gw)).length, 2, 'nothing was reserved');
  t.equal(await metricValue(gw.registry, 'tollgate_refusals_total', { reason: 'concurrency_limit_reached' }), 1);

  // Another key is not held by this one's streams.
  const other = await chat(gw, 'tg-other', {});
  t.equal(other.status, 200);

  // A stream that ends gives its slot back: the next request of the key goes.
  first.abort.abort();
  await until(async () => (await rows(gw)).filter((r) => r.state === 'settled').length === 2);
  const busyKey = `key:${(await rows(gw)).find((r) => r.tenant === 'busy')!.key_id}`;
  await until(() => gw.app.gateway.keySlots.inFlight(busyKey) < 2);
  const again = await chat(gw, 'tg-busy', {});
  t.equal(again.status, 200);
  await again.text();
  second.abort.abort();
});

t.test('a slot is given back by every ending: answered, refused in planning (the window, an unknown model)', async (t) => {
  const { gw } = await gatewayWith(t, { maxInFlightPerKey: 1 });
  // Answered, one after another: each one's slot was given back.
  for (let i = 0; i < 3; i++) {
    const res = await chat(gw, 'tg-busy', {});
    t.equal(res.status, 200, `answer ${i + 1}`);
    await res.text();
  }
  // Refused after its slot was taken (the model's window): given back all the same.
  const big = await chat(gw, 'tg-busy', { max_tokens: 200_000 });
  t.equal(big.status, 413);
  await big.text();
  // Unknown model (refused before planning).
  const unknown = await chat(gw, 'tg-busy', { model: 'nobody-serves-this' });
  t.equal(unknown.status, 404);
  await unknown.text();
  const after = await chat(gw, 'tg-busy', {});
  t.equal(after.status, 200, 'the key still has its one slot');
  await after.text();
  const busyKey = `key:${(await rows(gw)).find((r) => r.tenant === 'busy')!.key_id}`;
  t.equal(gw.app.gateway.keySlots.inFlight(busyKey), 0);
});

t.test('the openai SDK surfaces the 429 as a RateLimitError with the code', async (t) => {
  const { gw } = await gatewayWith(t, { maxInFlightPerKey: 1 });
  const held = await heldStream(gw, 'tg-busy');
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-busy', maxRetries: 0 });
  const err = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'one more' }], max_tokens: 5 }).catch((e: unknown) => e);
  t.ok(err instanceof OpenAI.RateLimitError);
  t.equal((err as InstanceType<typeof OpenAI.RateLimitError>).code, 'concurrency_limit_reached');
  held.abort.abort();
});

t.test("/v1/admission does not count requests in flight, and its limits are the size limits alone", async (t) => {
  const { gw } = await gatewayWith(t, { maxInFlightPerKey: 1 });
  const held = await heldStream(gw, 'tg-busy');
  const res = await fetch(`${gw.url}/v1/admission`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer tg-busy' },
    body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o', messages: [{ role: 'user', content: 'plan me' }], max_tokens: 5 } }),
  });
  t.equal(res.status, 200);
  const plan = (await res.json()) as { limits: unknown; verdict: { admit: boolean } };
  t.equal(plan.verdict.admit, true);
  t.same(Object.keys(plan.limits as object).sort(), ['maxBodyBytes', 'maxRequestTokens', 'maxRowTokens', 'maxRows']);
  held.abort.abort();
});

t.test('a gateway without keys counts its tenant local as one key, and says so', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 10, stallAfterChunks: 1 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })], limits: { maxInFlightPerKey: 1 } });
  const held = await heldStream(gw, 'tg-anything');
  const refused = await chat(gw, 'tg-something-else', {});
  t.equal(refused.status, 429);
  t.equal(((await refused.json()) as { error: { message: string } }).error.message, 'too many requests in flight for tenant "local" (a gateway without keys): 1 running, the limit is 1; send it again when one has finished');
  held.abort.abort();
});

/** A request whose headers and the first part of its body are sent; the rest is the caller's to send. */
async function slowBody(gw: TestGateway, key: string, body: string, sentBytes: number, chunked = false): Promise<{ socket: Socket; rest: () => void; answer: Promise<string> }> {
  const { port } = new URL(gw.url);
  const socket = connect(Number(port), '127.0.0.1');
  await new Promise<void>((resolve) => socket.once('connect', resolve));
  let text = '';
  socket.on('data', (d: Buffer) => (text += d.toString('latin1')));
  socket.on('error', () => {});
  const answer = new Promise<string>((resolve) => socket.once('close', () => resolve(text)));
  socket.write(
    `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nauthorization: Bearer ${key}\r\n` +
      `${chunked ? 'transfer-encoding: chunked' : `content-length: ${Buffer.byteLength(body)}`}\r\nconnection: close\r\n\r\n`,
  );
  const frame = (part: string) => (chunked ? `${Buffer.byteLength(part).toString(16)}\r\n${part}\r\n` : part);
  socket.write(frame(body.slice(0, sentBytes)));
  return { socket, rest: () => socket.write(frame(body.slice(sentBytes)) + (chunked ? '0\r\n\r\n' : '')), answer };
}

async function slotsOf(gw: TestGateway, key: string): Promise<() => number> {
  const principal = await gw.app.gateway.auth.authenticate(`Bearer ${key}`);
  const owner = `key:${principal.keyId}`;
  return () => gw.app.gateway.keySlots.inFlight(owner);
}

function chatBody(extra = ''): string {
  return JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: `question ${Math.random()}${extra}` }], max_tokens: 20 });
}

t.test('a body still arriving holds its slot: slow uploads cannot keep more bodies in memory than the key has slots', async (t) => {
  const { upstream, gw } = await gatewayWith(t, { maxInFlightPerKey: 2 });
  const inFlight = await slotsOf(gw, 'tg-busy');
  const body = chatBody();
  const a = await slowBody(gw, 'tg-busy', body, 10);
  const b = await slowBody(gw, 'tg-busy', body, 10);
  await until(() => inFlight() === 2);
  t.equal(upstream.requests.length, 0, 'neither has reached the model');

  // The third gets its 429 at once, though the two are only sending their bodies.
  const refused = await chat(gw, 'tg-busy', {});
  t.equal(refused.status, 429);
  t.match(((await refused.json()) as { error: { code: string } }).error.code, 'concurrency_limit_reached');
  const other = await chat(gw, 'tg-other', {});
  t.equal(other.status, 200, 'another key goes on');
  await other.text();

  // A large body that finds no slot is not kept, nor parsed: its 429, though it is no JSON.
  const large = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: 'Bearer tg-busy' },
    body: '{' + 'x'.repeat(1024 * 1024),
  });
  t.equal(large.status, 429, 'a 429, not a 400 for its JSON: it was not kept');
  await large.text();

  // A body that ends runs in the slot it took: answered, and the slot is free again.
  a.rest();
  t.match(await a.answer, /^HTTP\/1\.1 200 /);
  await until(() => inFlight() === 1);
  const next = await chat(gw, 'tg-busy', {});
  t.equal(next.status, 200, 'a slot came free');
  await next.text();
  b.rest();
  t.match(await b.answer, /^HTTP\/1\.1 200 /);
  await until(() => inFlight() === 0);
  t.equal(upstream.requests.length, 4, 'the two slow bodies, the other key, and the one after');
});

t.test('a slot taken while the body arrived is given back when the body ends badly: a 413, a 400, a client that leaves, the request timeout', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 10 });
  t.teardown(upstream.close);
  const gw = await startGateway(
    t,
    { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })], auth: { keys: KEYS }, limits: { maxInFlightPerKey: 1, maxBodyBytes: 4096 } },
    { requestTimeoutMs: 1500 },
  );
  const inFlight = await slotsOf(gw, 'tg-busy');
  const afterwards = async (what: string) => {
    await until(() => inFlight() === 0);
    const res = await chat(gw, 'tg-busy', {});
    t.equal(res.status, 200, `the key has its slot again after ${what}`);
    await res.text();
  };

  // Over the size limit (a chunked body, so the 413 comes once the bytes arrived).
  const over = await slowBody(gw, 'tg-busy', chatBody('x'.repeat(5000)), 10, true);
  await until(() => inFlight() === 1);
  over.rest();
  t.match(await over.answer, /^HTTP\/1\.1 413 /);
  await afterwards('a 413');

  // Malformed JSON.
  const bad = await slowBody(gw, 'tg-busy', '{"model": "gpt-4o", "messages": [' + ' '.repeat(100), 10);
  await until(() => inFlight() === 1);
  bad.rest();
  t.match(await bad.answer, /^HTTP\/1\.1 400 /);
  await afterwards('a 400');

  // The client leaves part way.
  const gone = await slowBody(gw, 'tg-busy', chatBody(), 10);
  await until(() => inFlight() === 1);
  gone.socket.destroy();
  await afterwards('a client that left');

  // The body never ends: the request timeout.
  const stuck = await slowBody(gw, 'tg-busy', chatBody(), 10);
  await until(() => inFlight() === 1);
  t.match(await stuck.answer, /^(HTTP\/1\.1 408 |$)/);
  await afterwards('the request timeout');
});

t.test('off by default: a key may have any number in flight', async (t) => {
  const { upstream, gw } = await gatewayWith(t, {});
  const held = await Promise.all([1, 2, 3, 4, 5].map(() => heldStream(gw, 'tg-busy')));
  t.equal(upstream.requests.length, 5);
  for (const h of held) h.abort.abort();
});

t.test('config: a whole number from 1, or null', async (t) => {
  t.equal(parseConfig({}, {}).limits.maxInFlightPerKey, null);
  t.equal(parseConfig({ limits: { maxInFlightPerKey: 8 } }, {}).limits.maxInFlightPerKey, 8);
  t.equal(parseConfig({ limits: { maxInFlightPerKey: null } }, {}).limits.maxInFlightPerKey, null);
  t.throws(() => parseConfig({ limits: { maxInFlightPerKey: 0 } }, {}), /limits\.maxInFlightPerKey: must be an integer from 1 to 1000000/);
  t.throws(() => parseConfig({ limits: { maxInFlightPerKey: 2.5 } }, {}), /limits\.maxInFlightPerKey/);
});
