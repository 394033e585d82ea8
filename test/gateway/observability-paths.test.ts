// What an operator sees of requests that end off the common path: one log line and one count each
// (a body that never arrived, a context refusal answered by a final answer), failures said at warn
// with the code the client got, and refusals timed in the overhead histogram (SPEC §10).
import t from 'tap';
import { Writable } from 'node:stream';
import { connect } from 'node:net';
import type { Registry } from 'prom-client';
import { startGateway, openaiUpstream, metricValue } from '../helpers/gateway.js';
import { startOpenAiDouble } from '../doubles/openai.js';

type Line = Record<string, unknown>;
function sink() {
  let out = '';
  const stream = new Writable({ write(c: Buffer, _e, d) { out += c.toString(); d(); } });
  return { stream, lines: () => out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Line) };
}
/** A metric's value for these labels (a histogram's `_count` or `_sum` by its full name). */
async function metric(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  if (name.endsWith('_sum')) return metricValue(registry, name.slice(0, -'_sum'.length), labels);
  const base = name.replace(/_count$/, '');
  const got = await registry.getSingleMetric(base)?.get();
  return (got?.values ?? []).filter((v) => ((v as { metricName?: string }).metricName ?? base) === name && Object.entries(labels).every(([k, want]) => String(v.labels[k]) === want)).reduce((sum, v) => sum + v.value, 0);
}
const settle = () => new Promise((r) => setTimeout(r, 300));

t.test('a model request whose body does not arrive in time (408) has its one log line and its count', async (t) => {
  const log = sink();
  const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9', { billing: 'local' })], auth: { keys: [{ key: 'tg-k-12345678', tenant: 'acme' }] } }, { logStream: log.stream, requestTimeoutMs: 500 });
  const port = Number(new URL(gw.url).port);
  const head = await new Promise<string>((resolve) => {
    const s = connect(port, '127.0.0.1', () => {
      // Headers, and the start of a body that never ends.
      s.write('POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nauthorization: Bearer tg-k-12345678\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{"model":"gpt-4o","messages":[');
    });
    let got = '';
    s.on('data', (d) => (got += d.toString()));
    s.on('close', () => resolve(got.split('\r\n')[0] ?? ''));
    s.on('error', () => {});
  });
  t.equal(head, 'HTTP/1.1 408 Request Timeout', 'the client is answered 408');
  await settle();
  const lines = log.lines().filter((l) => l.reqId !== undefined);
  t.equal(lines.length, 1, `one line for the request (got ${lines.length})`);
  t.match(lines[0], { status: 408, route: 'chat' });
  t.equal(await metric(gw.registry, 'tollgate_requests_total', { route: 'chat', status: '408' }), 1, 'and one count');
});

t.test('a stream whose upstream fails part way is logged like the same failure unstreamed: at warn, with its code', async (t) => {
  const double = await startOpenAiDouble({ completionTokens: 8 });
  t.teardown(double.close);
  const log = sink();
  const gw = await startGateway(t, { upstreams: [openaiUpstream(double.url, { billing: 'local', timeoutMs: 400 })] }, { logStream: log.stream });
  const ask = async (stream: boolean) => {
    const r = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20, stream }) });
    await r.text();
    await settle();
    return log.lines().filter((l) => l.msg === 'request settled').at(-1)!;
  };
  // The same upstream timeout, unstreamed and streamed.
  double.options.hang = true;
  const whole = await ask(false);
  t.match(whole, { status: 504, level: 40, code: 'upstream_timeout' }, 'unstreamed: warn, with the code');
  double.options.hang = false;
  double.options.stallAfterChunks = 2;
  const streamed = await ask(true);
  t.match(streamed, { status: 504, level: 40, code: 'upstream_timeout' }, `streamed: warn, with the code (got level ${streamed.level}, code ${streamed.code})`);
  double.options.stallAfterChunks = undefined;
  double.options.dropAfterChunks = 2;
  const lost = await ask(true);
  t.match(lost, { status: 502, level: 40, code: 'upstream_lost' }, `a lost stream: warn, with the code the client got (got level ${lost.level}, code ${lost.code})`);
});

t.test('refusals are observed in the gateway overhead histogram: it is all gateway time', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9', { billing: 'local' })], runs: { tokenBudget: 50 }, limits: { maxBodyBytes: 1000 } });
  const send = (body: string) => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body }).then((r) => r.status);
  const post = (body: unknown) => send(JSON.stringify(body));
  t.equal(await post({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 200_000 }), 413);
  t.equal(await post({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 100 }), 402);
  // An audit (twenty-second session): the refusals the body parser makes, before the pipeline took
  // the request, were counted but not timed.
  t.equal(await send('{"model": "gpt-4o", "messages": ['), 400, 'a malformed body');
  t.equal(await post({ model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(2000) }] }), 413, 'a body past the limit');
  t.equal(await metric(gw.registry, 'tollgate_requests_total', { route: 'chat' }), 4);
  t.equal(await metric(gw.registry, 'tollgate_gateway_overhead_seconds_count', { route: 'chat' }), 4, 'each refused request observed');
});

t.test('a research round the upstream refuses for its context, answered as the final answer: one line for the one request', async (t) => {
  const double = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(double.close);
  // The first request the double gets (the research round) is refused for its context window.
  Object.defineProperty(double.options, 'failWith', {
    get: () => (double.requests.length === 1 ? { status: 400, body: { error: { message: "This model's maximum context length is 100000 tokens", code: 'context_length_exceeded', type: 'invalid_request_error' } } } : undefined),
  });
  const log = sink();
  const gw = await startGateway(t, { upstreams: [openaiUpstream(double.url, { billing: 'local', contextWindow: null })] }, { logStream: log.stream });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const messages = [
    { role: 'user', content: 'research this' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'EVIDENCE' },
  ];
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 10 }) });
  t.equal(res.status, 200);
  t.match(res.headers.get('x-tollgate-notice'), /finishing-the-answer/);
  await res.text();
  await settle();
  t.equal(double.requests.length, 2, 'the upstream was called twice');
  const lines = log.lines().filter((l) => l.reqId !== undefined);
  t.equal(lines.length, 1, `one line for the request: ${lines.map((l) => l.msg).join(' | ')}`);
  t.equal(await metric(gw.registry, 'tollgate_requests_total'), 1, 'one count');
  t.equal(await metric(gw.registry, 'tollgate_upstream_duration_seconds_count'), 2, 'both upstream calls timed');
});

t.test("a refusal's overhead starts when its body has arrived: a slow client's upload is not gateway time", async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9', { billing: 'local' })], runs: { tokenBudget: 50 } });
  const port = Number(new URL(gw.url).port);
  const body = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 100 });
  // A quick refusal first (the encoder warms up): the slow one is measured alone.
  t.equal((await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body })).status, 402);
  const before = await metric(gw.registry, 'tollgate_gateway_overhead_seconds_sum', { route: 'chat' });
  const status = await new Promise<string>((resolve) => {
    const s = connect(port, '127.0.0.1', () => {
      s.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${Buffer.byteLength(body)}\r\nconnection: close\r\n\r\n${body.slice(0, 10)}`);
      setTimeout(() => s.write(body.slice(10)), 1000); // the rest a second later: a slow uplink
    });
    let got = '';
    s.on('data', (d) => (got += d.toString()));
    s.on('close', () => resolve(got.split('\r\n')[0] ?? ''));
    s.on('error', () => {});
  });
  t.match(status, / 402 /);
  const overhead = (await metric(gw.registry, 'tollgate_gateway_overhead_seconds_sum', { route: 'chat' })) - before;
  t.ok(overhead < 0.5, `${overhead.toFixed(3)} s observed for a refusal made in milliseconds after a 1 s upload`);
  t.equal(await metric(gw.registry, 'tollgate_gateway_overhead_seconds_count', { route: 'chat' }), 2, 'and it was observed');
});
