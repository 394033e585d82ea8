// Upstream failures (SPEC §2.7, §6, §11): connection refused → 502 upstream_unreachable, too slow →
// 504 upstream_timeout, an upstream 4xx/5xx passed through in the OpenAI envelope. Each fails before
// any output, so the whole reservation is refunded: charge 0 in the ledger.

import t, { type Test } from 'tap';
import OpenAI from 'openai';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, openaiUpstream, llamaUpstream, type TestGateway } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';
import { sdkStatus } from '../helpers/sdk.js';
import { freePort as deadPort } from '../helpers/process.js';

type Json = Record<string, unknown>;
const chat = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'will this fail?' }], max_tokens: 20 };

async function rows(gw: TestGateway): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) out.push(row);
  return out;
}

function post(gw: TestGateway, body: Json) {
  return fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
}

/** The one ledger row refunds everything it reserved. */
async function wholeRefund(t: Test, gw: TestGateway, status: number) {
  const all = await rows(gw);
  t.equal(all.length, 1, 'one ledger row');
  const row = all[0];
  t.equal(row.state, 'settled');
  t.equal(row.status, status);
  t.ok(row.reserved_tokens > 20, 'prompt + allowance were reserved');
  t.equal(row.charge_tokens, 0, 'charged nothing');
  t.equal(row.refund_tokens, row.reserved_tokens, 'the whole reservation refunded');
  t.equal(row.cost_usd, 0);
}

t.test('connection refused → 502 upstream_unreachable, whole reservation refunded', async (t) => {
  const port = await deadPort();
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${port}`, { billing: 'local' })] });
  const res = await post(gw, chat);
  t.equal(res.status, 502);
  t.equal(res.headers.get('x-should-retry'), null, 'an upstream failure is not a refusal: an SDK may retry it');
  const body = (await res.json()) as { error: Json };
  t.match(body.error, { code: 'upstream_unreachable', type: 'upstream_error', param: null, upstream: 'openai' });
  t.match(String(body.error.message), /upstream "openai" could not be reached/);
  t.equal(res.headers.get('x-tollgate-charge-tokens'), '0');
  t.equal(res.headers.get('x-tollgate-refund-tokens'), res.headers.get('x-tollgate-reserved-tokens'));
  await wholeRefund(t, gw, 502);
  // A stream request fails the same way, before any SSE is sent.
  const streamed = await post(gw, { ...chat, stream: true });
  t.equal(streamed.status, 502);
  t.match(streamed.headers.get('content-type') ?? '', /application\/json/);
});

t.test('an upstream slower than timeoutMs → 504 upstream_timeout, whole reservation refunded', async (t) => {
  const upstream = await startOpenAiDouble({ hang: true });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local', timeoutMs: 300 })] });
  const res = await post(gw, chat);
  t.equal(res.status, 504);
  const body = (await res.json()) as { error: Json };
  t.match(body.error, { code: 'upstream_timeout', type: 'upstream_error', upstream: 'openai' });
  t.equal(res.headers.get('x-tollgate-charge-tokens'), '0');
  await wholeRefund(t, gw, 504);
  t.equal(upstream.requests.length, 1, 'the request did reach the upstream');
});

t.test("an upstream 429 stays retryable: its retry advice and rate-limit headers are passed on", async (t) => {
  const upstream = await startOpenAiDouble({
    failWith: {
      status: 429,
      body: { error: { message: 'Rate limit reached for requests', type: 'requests', param: null, code: 'rate_limit_exceeded' } },
      headers: {
        'retry-after-ms': '20',
        'x-ratelimit-remaining-requests': '0',
        'x-request-id': 'req_upstream_429',
        'anthropic-ratelimit-requests-remaining': '0',
        'ratelimit-policy': '"default";q=100;w=60',
        ratelimit: '"default";r=0;t=20',
      },
    },
  });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const res = await post(gw, chat);
  t.equal(res.status, 429);
  t.equal(res.headers.get('x-should-retry'), null, 'not marked final: the provider asked for a retry later');
  t.equal(res.headers.get('retry-after-ms'), '20');
  t.equal(res.headers.get('x-ratelimit-remaining-requests'), '0');
  t.equal(res.headers.get('anthropic-ratelimit-requests-remaining'), '0', "Anthropic's rate-limit state too");
  t.equal(res.headers.get('ratelimit'), '"default";r=0;t=20', "and the IETF draft's");
  t.equal(res.headers.get('ratelimit-policy'), '"default";q=100;w=60');
  t.equal(res.headers.get('x-request-id'), 'req_upstream_429');
  // The SDK retries it as it would against the provider: 1 + maxRetries attempts.
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 2 });
  const before = upstream.requests.length;
  t.equal(await sdkStatus(client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 20 })), 429);
  t.equal(upstream.requests.length - before, 3);
});

t.test("a successful answer carries the upstream's request id and rate-limit state", async (t) => {
  const upstream = await startOpenAiDouble({ responseHeaders: { 'x-request-id': 'req_upstream_ok', 'x-ratelimit-remaining-tokens': '9000', 'set-cookie': 'a=b' } });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  const done = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 5 });
  t.equal(done._request_id, 'req_upstream_ok');
  for (const stream of [false, true]) {
    const res = await post(gw, { ...chat, stream });
    t.equal(res.headers.get('x-request-id'), 'req_upstream_ok');
    t.equal(res.headers.get('x-ratelimit-remaining-tokens'), '9000');
    t.equal(res.headers.get('set-cookie'), null, 'nothing else of the upstream is passed on');
    await res.arrayBuffer();
  }
});

t.test('an upstream 4xx passes through in the OpenAI envelope, whole reservation refunded', async (t) => {
  const upstream = await startOpenAiDouble({
    failWith: { status: 400, body: { error: { message: 'Invalid value for temperature', type: 'invalid_request_error', param: 'temperature', code: 'invalid_value' } } },
  });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  const err = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 20 }).then(
    () => null,
    (e: unknown) => e,
  );
  t.ok(err instanceof OpenAI.BadRequestError, 'the SDK sees a BadRequestError');
  const e = err as InstanceType<typeof OpenAI.BadRequestError>;
  t.equal(e.status, 400);
  t.equal(e.code, 'invalid_value');
  t.equal(e.param, 'temperature');
  t.equal(e.type, 'invalid_request_error');
  t.match(e.message, /Invalid value for temperature/);
  t.equal(e.headers?.get('x-tollgate-charge-tokens'), '0');
  await wholeRefund(t, gw, 400);
});

t.test('an upstream 5xx passes through, is retried by the SDK as it would be without the gateway, and refunds everything', async (t) => {
  const upstream = await startOpenAiDouble({ failWith: { status: 503, body: { error: { message: 'overloaded', type: 'server_error', param: null, code: null } } } });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  t.equal(await sdkStatus(client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 20 })), 503);
  t.equal(upstream.requests.length, 3, 'the SDK retried twice, as it does against OpenAI itself');
  t.equal((await rows(gw)).length, 3, 'each attempt has its own row');
  const res = await post(gw, chat);
  t.equal(res.status, 503);
  t.equal(res.headers.get('x-tollgate-charge-tokens'), '0');
  t.equal(res.headers.get('x-tollgate-refund-tokens'), res.headers.get('x-tollgate-reserved-tokens'));
  const body = (await res.json()) as { error: Json };
  t.same(body.error, { message: 'overloaded', type: 'server_error', param: null, code: null }, "the provider's envelope as it was, code null and all");
  // A body that is not the envelope at all is wrapped in one.
  upstream.options.failWith = { status: 502, body: 'Bad Gateway' };
  const plain = await post(gw, chat);
  t.equal(plain.status, 502);
  t.match(await plain.json(), { error: { message: '"Bad Gateway"', type: 'upstream_error', param: null, code: 'upstream_error' } });
  for (const row of await rows(gw)) t.equal(row.charge_tokens, 0, `row ${row.id} charged nothing`);
});

t.test("llama.cpp's error envelope (numeric code, no param) is normalised, its figures kept", async (t) => {
  const llama = await startLlamaCppDouble({
    failWith: {
      status: 400,
      body: { error: { code: 400, message: 'request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it', type: 'exceed_context_size_error', n_prompt_tokens: 5000, n_ctx: 4096 } },
    },
  });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const res = await post(gw, { ...chat, model: 'tiny' });
  t.equal(res.status, 400);
  const body = (await res.json()) as { error: Json };
  t.same(body.error, {
    code: 'exceed_context_size_error',
    message: 'request (5000 tokens) exceeds the available context size (4096 tokens), try increasing it',
    type: 'exceed_context_size_error',
    param: null,
    n_prompt_tokens: 5000,
    n_ctx: 4096,
  });
  t.equal(res.headers.get('x-tollgate-charge-tokens'), '0');
  await wholeRefund(t, gw, 400);
});

t.test('an upstream 200 that is not JSON → 502 upstream_bad_response, and the reservation is settled, refunded in full', async (t) => {
  const { createServer } = await import('node:http');
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/html' });
      res.end('<html>gateway page</html>');
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => server.close(() => resolve())));
  const { port } = server.address() as { port: number };
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${port}`, { billing: 'local' })] });
  const res = await post(gw, chat);
  t.equal(res.status, 502);
  t.match(((await res.json()) as { error: Json }).error, { code: 'upstream_bad_response', upstream: 'openai', message: 'upstream "openai" sent a response that is not JSON' });
  // Not left reserved (a restart would have charged it in full): settled, nothing charged.
  await wholeRefund(t, gw, 502);
});

t.test('an upstream 200 whose body is an error → 502 upstream_bad_response with its message, refunded in full', async (t) => {
  const upstream = await startOpenAiDouble({ failWith: { status: 200, body: { error: { message: 'No endpoints found for this model', code: 404 } } } });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const err = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 20 }).then(
    () => null,
    (e: unknown) => e,
  );
  t.ok(err instanceof OpenAI.APIError, 'the SDK sees an error, not an answer without choices');
  t.equal((err as InstanceType<typeof OpenAI.APIError>).status, 502);
  t.match((err as InstanceType<typeof OpenAI.APIError>).message, /answered 200 with an error: No endpoints found for this model/);
  await wholeRefund(t, gw, 502);
});

t.test('a stream request answered 200 with an error object (no event stream) → 502 with its message, refunded in full', async (t) => {
  const upstream = await startOpenAiDouble({ failWith: { status: 200, body: { error: { message: 'No endpoints found for this model', code: 404 } } } });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const err = await (async () => {
    const stream = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'x' }], max_tokens: 20, stream: true });
    for await (const _chunk of stream) {
      // an answer would be read here
    }
    return null;
  })().catch((e: unknown) => e);
  t.ok(err instanceof OpenAI.APIError, 'the SDK sees an error, not an empty stream that looks like an answer');
  t.equal((err as InstanceType<typeof OpenAI.APIError>).status, 502);
  t.match((err as InstanceType<typeof OpenAI.APIError>).message, /answered 200 with an error: No endpoints found for this model/);
  await wholeRefund(t, gw, 502);
});

// Regression (nineteenth session): an upstream that sent its response head and then nothing for its
// `timeoutMs` was said to have broken off its answer (502) or been lost part way (`upstream_lost`):
// it did not answer in time, as one silent before its head is (504 upstream_timeout).
t.test('an upstream silent after its response head: upstream_timeout, whole reservation refunded', async (t) => {
  for (const stream of [false, true]) {
    const silent = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': stream ? 'text/event-stream' : 'application/json' });
        res.flushHeaders();
        if (!stream) res.write('{"id":"x","object":"chat.completion","choices":[');
      });
    });
    await new Promise<void>((resolve) => silent.listen(0, '127.0.0.1', resolve));
    const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(silent.address() as AddressInfo).port}`, { timeoutMs: 300 })] });
    const res = await post(gw, { ...chat, stream });
    if (stream) {
      const text = await res.text();
      const error = JSON.parse(/^data: (\{"error".*)$/m.exec(text)![1]!) as { error: Json };
      t.match(error.error, { code: 'upstream_timeout', type: 'upstream_error', message: /did not answer in time/ }, 'the stream says the upstream timed out');
    } else {
      t.equal(res.status, 504);
      t.match(((await res.json()) as { error: Json }).error, { code: 'upstream_timeout' });
    }
    await wholeRefund(t, gw, 504);
    silent.closeAllConnections();
    silent.close();
  }
});
