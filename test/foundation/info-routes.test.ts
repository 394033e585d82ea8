// GET /v1/models, /healthz, /readyz and /metrics (SPEC §8, §10, §11), against real upstream
// doubles (OpenAI-compatible and llama.cpp) and one upstream that is down.

import t from 'tap';
import OpenAI from 'openai';
import { connect, type AddressInfo } from 'node:net';
import { createServer } from 'node:http';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, openaiUpstream, llamaUpstream } from '../helpers/gateway.js';
import { freePort as deadPort } from '../helpers/process.js';

interface ModelEntry {
  id: string;
  upstream: string;
  billing: string;
  context_window: number | null;
}

t.test('GET /v1/models is the union of the upstreams, with upstream, billing and context window', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const llama = await startLlamaCppDouble({ nCtx: 2048 });
  t.teardown(llama.close);
  const gw = await startGateway(t, {
    upstreams: [
      openaiUpstream(openai.url, { models: ['gpt-4o', 'gpt-4o-mini'], contextWindow: 128000 }),
      { name: 'plan', kind: 'openai', baseUrl: `${openai.url}/v1`, models: ['o3', 'gpt-4o'], billing: 'plan' },
      llamaUpstream(llama.url, { models: ['qwen-local'] }),
    ],
  });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  const list: ModelEntry[] = [];
  for await (const m of client.models.list()) list.push(m as unknown as ModelEntry);
  const byId = new Map(list.map((m) => [m.id, m]));
  t.same([...byId.keys()].sort(), ['gpt-4o', 'gpt-4o-mini', 'o3', 'qwen-local'], 'each model once');
  t.match(byId.get('gpt-4o'), { upstream: 'openai', billing: 'metered', context_window: 128000 }, 'the first upstream that lists it');
  t.match(byId.get('o3'), { upstream: 'plan', billing: 'plan', context_window: null }, 'unknown window is null, not a guess');
  t.match(byId.get('qwen-local'), { upstream: 'local', billing: 'local', context_window: 2048 }, "llama.cpp's own n_ctx from /props");
  // One model, as the SDK's retrieve asks: routed as a request would be, or model_not_found.
  t.match(await client.models.retrieve('o3'), { id: 'o3', object: 'model', upstream: 'plan', billing: 'plan', context_window: null });
  t.match(await client.models.retrieve('gpt-4o'), { id: 'gpt-4o', upstream: 'openai', context_window: 128000 });
  const missing = await client.models.retrieve('gpt-nope').then(
    () => null,
    (e: unknown) => e,
  );
  t.ok(missing instanceof OpenAI.NotFoundError);
  t.equal((missing as InstanceType<typeof OpenAI.NotFoundError>).code, 'model_not_found');
});

// Regression (nineteenth session): /props had no bound but the upstream's timeoutMs (10 minutes by
// default), asked again by every caller: one stalled llama.cpp server held /v1/models, every
// request's plan, and a stopping gateway's drain.
t.test('a llama.cpp server that never answers /props: the window is unknown after a short wait, asked once', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const asked: string[] = [];
  const stalled = createServer((req) => asked.push(`${req.method} ${req.url}`)); // accepts, never answers
  await new Promise<void>((resolve) => stalled.listen(0, '127.0.0.1', resolve));
  t.teardown(() => {
    stalled.closeAllConnections();
    stalled.close();
  });
  const port = (stalled.address() as AddressInfo).port;
  const gw = await startGateway(
    t,
    { upstreams: [openaiUpstream(openai.url, { models: ['gpt-4o'], contextWindow: 128000 }), llamaUpstream(`http://127.0.0.1:${port}`, { models: ['qwen-local'] })] },
    { propsTimeoutMs: 300 },
  );
  const list = async () => {
    // Liveness, not speed: without the bound this waits for minutes.
    const res = await fetch(`${gw.url}/v1/models`, { signal: AbortSignal.timeout(20_000) });
    t.equal(res.status, 200);
    return ((await res.json()) as { data: ModelEntry[] }).data;
  };
  const first = await list();
  t.match(first.find((m) => m.id === 'qwen-local'), { upstream: 'local', context_window: null }, 'unknown, not waited for');
  t.match(first.find((m) => m.id === 'gpt-4o'), { context_window: 128000 });
  await list();
  t.same(asked, ['GET /props'], 'a failed /props is not asked again at once');
});

t.test('GET /v1/models/{model}: a name a pattern takes is served', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  t.match(await client.models.retrieve('gpt-5-mini'), { id: 'gpt-5-mini', upstream: 'openai', billing: 'metered', context_window: 128000 });
  t.equal((await fetch(`${gw.url}/v1/models/claude-x`)).status, 404);
});

t.test('GET /v1/models/{model}: a name with a slash, sent encoded (the SDK) or as it is (curl)', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url, { models: ['anthropic/claude-3.5-sonnet', 'meta-llama/*'] })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  t.match(await client.models.retrieve('anthropic/claude-3.5-sonnet'), { id: 'anthropic/claude-3.5-sonnet', upstream: 'openai' });
  const plain = await fetch(`${gw.url}/v1/models/meta-llama/llama-3.1-8b`);
  t.equal(plain.status, 200);
  t.match(await plain.json(), { id: 'meta-llama/llama-3.1-8b', upstream: 'openai' });
  const missing = await fetch(`${gw.url}/v1/models/anthropic/claude-9`);
  t.equal(missing.status, 404);
  t.match(await missing.json(), { error: { code: 'model_not_found' } });
});

t.test('/healthz answers; /readyz reports the store and each upstream reachable or not', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const down = await deadPort();
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(openai.url), llamaUpstream(llama.url), { name: 'down', kind: 'openai', baseUrl: `http://127.0.0.1:${down}/v1`, models: ['x-*'] }],
  });
  const health = await fetch(`${gw.url}/healthz`);
  t.equal(health.status, 200);
  t.same(await health.json(), { status: 'ok' });

  const ready = await fetch(`${gw.url}/readyz`);
  t.equal(ready.status, 200, 'one upstream down does not make the gateway unready');
  const body = (await ready.json()) as { status: string; store: { ok: boolean; kind: string }; upstreams: Array<{ name: string; reachable: boolean }> };
  t.equal(body.status, 'ready');
  t.same(body.store, { ok: true, kind: 'sqlite' });
  const up = new Map(body.upstreams.map((u) => [u.name, u.reachable]));
  t.equal(up.get('openai'), true);
  t.equal(up.get('local'), true);
  t.equal(up.get('down'), false);
  // The probe's code, never undici's words, which name the upstream's address (this route is public).
  const downReport = body.upstreams.find((u) => u.name === 'down') as { error?: string };
  t.equal(downReport.error, 'the upstream did not answer (ECONNREFUSED)');
  t.notMatch(JSON.stringify(body), String(down), 'no port or address of an upstream in the public answer');
  // The probes really went to the upstreams: OpenAI's model list, llama.cpp's /health.
  t.ok(openai.requests.some((r) => r.method === 'GET' && r.path === '/v1/models'));
  t.ok(llama.requests.some((r) => r.method === 'GET' && r.path === '/health'));

  // A store that no longer answers makes the gateway not ready (503).
  await gw.ledger.close();
  const broken = await fetch(`${gw.url}/readyz`);
  t.equal(broken.status, 503);
  t.match(await broken.json(), { status: 'not ready', store: { ok: false, error: /^the ledger did not answer \([A-Za-z0-9_ ]+\)$/ } }, 'a code, never the store\'s words (this route is public)');
});

t.test('/metrics: Prometheus text with requests, upstream duration and gateway overhead', async (t) => {
  const openai = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'm' }], max_tokens: 4 });
  await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'm' }], max_tokens: 4 });
  openai.options.failWith = { status: 400, body: { error: { message: 'bad', type: 'invalid_request_error', param: null, code: 'bad' } } };
  await t.rejects(client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'm' }], max_tokens: 4 }));

  const res = await fetch(`${gw.url}/metrics`);
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type') ?? '', /^text\/plain/);
  const text = await res.text();
  t.match(text, /# TYPE tollgate_requests_total counter/);
  t.match(text, /tollgate_requests_total\{route="chat",upstream="openai",status="200"\} 2\n/);
  t.match(text, /tollgate_requests_total\{route="chat",upstream="openai",status="400"\} 1\n/);
  t.match(text, /# TYPE tollgate_upstream_duration_seconds histogram/);
  t.match(text, /tollgate_upstream_duration_seconds_count\{upstream="openai"\} 3\n/);
  t.match(text, /# TYPE tollgate_gateway_overhead_seconds histogram/);
  t.match(text, /tollgate_gateway_overhead_seconds_count\{route="chat"\} 3\n/);
  t.notMatch(text, /conversation="/, 'no conversation ids as labels');
});

t.test('/metrics with metrics.token configured needs the token', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)], metrics: { token: 'scrape-secret' } });
  const none = await fetch(`${gw.url}/metrics`);
  t.equal(none.status, 401);
  t.match(await none.json(), { error: { code: 'admin_token_required' } });
  t.equal((await fetch(`${gw.url}/metrics`, { headers: { authorization: 'Bearer wrong' } })).status, 401);
  t.equal((await fetch(`${gw.url}/metrics`, { headers: { authorization: 'Bearer admin-secret' } })).status, 401, 'the admin token is not the metrics token');
  const ok = await fetch(`${gw.url}/metrics`, { headers: { authorization: 'Bearer scrape-secret' } });
  t.equal(ok.status, 200);
  t.match(await ok.text(), /tollgate_requests_total/);
});

t.test('an unknown route: 404 in the OpenAI envelope, not to be retried', async (t) => {
  const gw = await startGateway(t, { upstreams: [llamaUpstream('http://127.0.0.1:9')] });
  const res = await fetch(`${gw.url}/v1/foo`);
  t.equal(res.status, 404);
  t.equal(res.headers.get('x-should-retry'), 'false');
  t.match(await res.json(), { error: { code: 'not_found', type: 'not_found_error', message: 'no route for GET /v1/foo' } });
});

t.test('a URL Fastify cannot decode, and an empty JSON body, get the OpenAI envelope', async (t) => {
  const gw = await startGateway(t, { upstreams: [llamaUpstream('http://127.0.0.1:9')] });
  const bad = await fetch(`${gw.url}/v1/conversations/%E0%A4%A/spend`);
  t.equal(bad.status, 400);
  t.equal(bad.headers.get('x-should-retry'), 'false');
  t.match(await bad.json(), { error: { code: 'invalid_request', type: 'invalid_request_error', message: /request URL is malformed/ } });
  // An empty body with a JSON content type is no body: the route says what it needs.
  const empty = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '' });
  t.equal(empty.status, 400);
  t.match(await empty.json(), { error: { code: 'invalid_request', message: /must be a JSON object/ } });
  // …and a DELETE that carries the header but no body works.
  const admin = { authorization: 'Bearer admin-secret', 'content-type': 'application/json' };
  const made = (await (await fetch(`${gw.url}/admin/keys`, { method: 'POST', headers: admin, body: JSON.stringify({ tenant: 'x' }) })).json()) as { id: string };
  const del = await fetch(`${gw.url}/admin/keys/${made.id}`, { method: 'DELETE', headers: admin });
  t.equal(del.status, 200);
});

t.test('requests Node refuses before routing (bad framing, huge headers) get the OpenAI envelope', async (t) => {
  const gw = await startGateway(t, { upstreams: [llamaUpstream('http://127.0.0.1:9')] });
  const { port } = new URL(gw.url);
  const raw = (request: string) =>
    new Promise<string>((resolve, reject) => {
      const socket = connect(Number(port), '127.0.0.1', () => socket.end(request));
      let text = '';
      socket.on('data', (d) => (text += d.toString('latin1')));
      socket.on('end', () => resolve(text));
      socket.on('error', reject);
    });
  const both = await raw('POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 2\r\ntransfer-encoding: chunked\r\n\r\n{}');
  t.match(both, /^HTTP\/1\.1 400 /);
  t.match(both, /x-should-retry: false/);
  t.match(JSON.parse(both.slice(both.indexOf('\r\n\r\n') + 4)), { error: { code: 'invalid_request', type: 'invalid_request_error', message: /not valid HTTP/ } });
  const huge = await raw(`GET /healthz HTTP/1.1\r\nhost: x\r\nx-big: ${'a'.repeat(20_000)}\r\n\r\n`);
  t.match(huge, /^HTTP\/1\.1 431 /);
  t.match(JSON.parse(huge.slice(huge.indexOf('\r\n\r\n') + 4)), { error: { code: 'invalid_request', message: 'the request headers are too large' } });
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'and the gateway goes on serving');
});

t.test('a request that does not arrive whole in time gets a 408 in the OpenAI envelope, and nothing is charged', async (t) => {
  const gw = await startGateway(t, { upstreams: [llamaUpstream('http://127.0.0.1:9')] }, { requestTimeoutMs: 300 });
  const { port } = new URL(gw.url);
  const answer = await new Promise<string>((resolve, reject) => {
    // Headers and the start of a body, then nothing more.
    const socket = connect(Number(port), '127.0.0.1', () =>
      socket.write('POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 100\r\n\r\n{"model":'),
    );
    let text = '';
    socket.on('data', (d) => (text += d.toString('latin1')));
    socket.on('end', () => resolve(text));
    socket.on('error', reject);
  });
  t.match(answer, /^HTTP\/1\.1 408 Request Timeout\r\n/);
  t.notMatch(answer, /x-should-retry/, 'a slow request may be sent again');
  t.same(JSON.parse(answer.slice(answer.indexOf('\r\n\r\n') + 4)), {
    error: { message: 'the request did not arrive in time (its headers within 0.3 s, the whole request within 0.3 s)', type: 'invalid_request_error', param: null, code: 'request_timeout' },
  });
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.same(rows, [], 'no ledger row');
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200, 'and the gateway goes on serving');
});

t.test('request and refusal counters count model requests only', async (t) => {
  // Found by an outside audit: /v1/models and the other info routes were counted only when they
  // failed (an error ratio of 100 %), and every scrape or operator call without its token counted
  // as a refusal.
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)], auth: { keys: [{ key: 'tg-k', tenant: 'a' }] } });
  t.equal((await fetch(`${gw.url}/v1/models`)).status, 401);
  t.equal((await fetch(`${gw.url}/admin/keys`, { method: 'POST' })).status, 401);
  t.equal((await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: '{}' })).status, 400);
  const text = await (await fetch(`${gw.url}/metrics`)).text();
  const series = (name: string) => text.split('\n').filter((l) => l.startsWith(`${name}{`));
  t.same(series('tollgate_requests_total').map((l) => l.replace(/ \d+$/, '')), ['tollgate_requests_total{route="chat",upstream="",status="400"}']);
  t.same(series('tollgate_refusals_total').map((l) => l.replace(/ \d+$/, '')), ['tollgate_refusals_total{reason="invalid_request"}']);
});

t.test("Node's own metrics carry the tollgate_ prefix once", async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-metrics-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // No registry given: the app makes its own, with prom-client's default metrics.
  const app = await buildApp({ config: parseConfig({ store: { kind: 'sqlite', path: join(dir, 'ledger.db') }, logging: { level: 'silent' } }, {}), env: {} });
  t.teardown(() => app.close());
  const text = (await app.inject({ method: 'GET', url: '/metrics' })).body;
  t.match(text, /^tollgate_process_cpu_user_seconds_total /m);
  t.match(text, /^tollgate_nodejs_eventloop_lag_seconds /m);
  t.notMatch(text, /tollgate_process_process_/);
});

t.test('a route asked with a method it does not take: 405 naming those it takes; a path no route has: 404', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)] });
  for (const [method, path, allow] of [
    ['GET', '/v1/chat/completions', 'POST'],
    ['PUT', '/v1/embeddings', 'POST'],
    ['POST', '/healthz', 'GET, HEAD'],
    ['DELETE', '/v1/conversations/c1/spend', 'GET, HEAD'],
  ] as const) {
    const res = await fetch(`${gw.url}${path}`, { method });
    t.equal(res.status, 405, `${method} ${path}`);
    t.equal(res.headers.get('allow'), allow);
    t.equal(res.headers.get('x-should-retry'), 'false');
    t.match(await res.json(), { error: { code: 'method_not_allowed', type: 'invalid_request_error', message: `${method} is not a method of ${path}: it takes ${allow}` } });
  }
  const none = await fetch(`${gw.url}/v1/nothing-here`);
  t.equal(none.status, 404);
  t.match(await none.json(), { error: { code: 'not_found' } });
  t.equal(openai.requests.length, 0);
});

// Regression (twentieth session): the 405 was answered before any check, so anyone could learn the
// operator API's routes and methods without the admin token.
t.test('an operator route asked with another method answers 401 or 403 first: only the operator learns its methods', async (t) => {
  const openai = await startOpenAiDouble();
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url)], auth: { keys: [{ key: 'tg-client', tenant: 'acme' }] } });
  const ask = (headers: Record<string, string>) => fetch(`${gw.url}/admin/keys`, { method: 'PATCH', headers });
  const anonymous = await ask({});
  t.equal(anonymous.status, 401);
  t.equal(anonymous.headers.get('allow'), null);
  t.match(await anonymous.json(), { error: { code: 'admin_token_required' } });
  const client = await ask({ authorization: 'Bearer tg-client' });
  t.equal(client.status, 403);
  t.equal(client.headers.get('allow'), null);
  t.match(await client.json(), { error: { code: 'forbidden' } });
  const operator = await ask({ authorization: 'Bearer admin-secret' });
  t.equal(operator.status, 405);
  t.equal(operator.headers.get('allow'), 'GET, HEAD, POST');
  t.match(await operator.json(), { error: { code: 'method_not_allowed', message: 'PATCH is not a method of /admin/keys: it takes GET, HEAD, POST' } });
  const unknown = await fetch(`${gw.url}/admin/nothing-here`, { method: 'PATCH' });
  t.equal(unknown.status, 404, 'a path no route has is a 404 for anyone');
});
