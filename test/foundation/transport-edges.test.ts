// The HTTP edges of a request, both sides: an upstream that breaks off its answer is a 502 (not the
// gateway's 500) and refunds; a client that leaves while a non-streamed answer is read is settled
// as 499, its prompt charged; an upstream error that echoes its key has it taken out; a stream
// honours the client's `Connection: close`; and a request must arrive whole in bounded time.

import t from 'tap';
import { createServer, type Server } from 'node:http';
import { connect } from 'node:net';
import type { AddressInfo } from 'node:net';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { REQUEST_TIMEOUT_MS } from '../../server/app.js';
import type { LedgerRow } from '../../metering/ledger.js';

type Json = Record<string, unknown>;
const chat = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Answer at length.' }], max_tokens: 20 };

async function rows(gw: { ledger: { exportRows(a: null, b: null): AsyncIterable<LedgerRow> } }): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const r of gw.ledger.exportRows(null, null)) out.push(r);
  return out;
}

/** An upstream that sends headers for 1,000 bytes, writes 10, then `then` (break off, or hold). */
async function brokenUpstream(t: { teardown(fn: () => unknown): void }, then: 'break' | 'hold'): Promise<string> {
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'application/json', 'content-length': '1000' });
      res.write('{"id":"x",');
      if (then === 'break') setTimeout(() => res.socket?.destroy(), 20);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

t.test('an upstream that breaks off a non-streamed answer: 502 upstream_bad_response, refunded in full', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream(await brokenUpstream(t, 'break'))] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat) });
  t.equal(res.status, 502);
  t.match(((await res.json()) as { error: Json }).error, { code: 'upstream_bad_response', message: /broke off its answer/, upstream: 'openai' });
  const [row] = await rows(gw);
  t.match(row, { status: 502, charge_tokens: 0 });
});

t.test('a client that leaves while a non-streamed answer is being read: 499, its prompt charged', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream(await brokenUpstream(t, 'hold'))] });
  const abort = new AbortController();
  const pending = fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat), signal: abort.signal }).catch(() => null);
  await new Promise((r) => setTimeout(r, 300));
  abort.abort();
  await pending;
  let all: LedgerRow[] = [];
  for (let i = 0; i < 100 && !all[0]?.status; i++) {
    await new Promise((r) => setTimeout(r, 20));
    all = await rows(gw);
  }
  t.equal(all[0]?.status, 499, 'the client went away');
  t.ok((all[0]!.charge_tokens ?? 0) > 0 && all[0]!.refund_tokens === 20, 'the prompt it read is charged, the allowance refunded');
});

t.test("an upstream error that echoes the upstream's key does not hand it to the client", async (t) => {
  const upstream = await startOpenAiDouble({ failWith: { status: 401, body: { error: { message: 'bad key: Bearer sk-upstream-SECRET-123', type: 'invalid_request_error' } } } });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] }, { env: { DOUBLE_KEY: 'sk-upstream-SECRET-123' } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat) });
  t.equal(res.status, 401);
  const text = await res.text();
  t.notMatch(text, /SECRET-123/);
  t.match(text, /bad key: Bearer \[redacted\]/);
});

t.test("a stream answers a client's Connection: close by closing after it", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const { port } = new URL(gw.url);
  const body = JSON.stringify({ ...chat, stream: true });
  const { text, closed } = await new Promise<{ text: string; closed: boolean }>((resolve) => {
    const socket = connect(Number(port), '127.0.0.1', () =>
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`),
    );
    let text = '';
    socket.on('data', (b) => (text += b.toString()));
    const timer = setTimeout(() => { socket.destroy(); resolve({ text, closed: false }); }, 3000);
    socket.on('end', () => { clearTimeout(timer); resolve({ text, closed: true }); });
  });
  t.match(text, /data: \[DONE\]/);
  t.notMatch(text, /connection: keep-alive/i);
  t.ok(closed, 'the gateway closed the connection after the stream');
});

t.test('a request must arrive whole within the request timeout', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9')] });
  t.equal(gw.app.server.requestTimeout, REQUEST_TIMEOUT_MS);
  t.ok(REQUEST_TIMEOUT_MS > 0 && REQUEST_TIMEOUT_MS <= 300_000);
});

t.test('a conversation header sent twice is a 400 naming it, not a new conversation named "a, b"', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const { port } = new URL(gw.url);
  for (const name of ['x-tollgate-conversation', 'x-tollgate-parent']) {
    const body = JSON.stringify(chat);
    const text = await new Promise<string>((resolve) => {
      const socket = connect(Number(port), '127.0.0.1', () =>
        socket.write(
          `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${name}: conv-a\r\n${name}: conv-b\r\nContent-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`,
        ),
      );
      let text = '';
      socket.on('data', (b) => (text += b.toString()));
      socket.on('end', () => resolve(text));
    });
    t.match(text, /^HTTP\/1\.1 400 /, name);
    t.match(text, new RegExp(`"param":"${name}"`));
    t.match(text, /sent 2 times, name one conversation/);
  }
  t.equal(upstream.requests.length, 0);
  t.equal((await rows(gw)).length, 0, 'nothing in the ledger');
});

t.test('a stream event that never ends: an error event, the upstream let go, what came before charged', async (t) => {
  let upstreamClosed: () => void = () => {};
  const closed = new Promise<void>((r) => (upstreamClosed = r));
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (content: string) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
      res.write(chunk('Hello') + chunk(' there'));
      // Then one event that never reaches its blank line: 1 MiB more of it every few milliseconds.
      res.write('data: {"choices":[{"index":0,"delta":{"content":"');
      const more = 'z'.repeat(1024 * 1024);
      // As fast as the gateway reads it, no faster (the socket's buffer stays bounded).
      const pump = () => {
        while (!res.destroyed && res.write(more));
        if (!res.destroyed) res.once('drain', pump);
      };
      pump();
      res.on('close', () => upstreamClosed());
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { billing: 'local' })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...chat, stream: true }) });
  t.equal(res.status, 200, 'the stream had started');
  const text = await res.text();
  t.match(text, /"content":"Hello"/);
  t.match(text, /data: \{"error":\{"message":"upstream \\"openai\\" sent a broken stream: an event of the upstream's stream passed 16777216 characters without ending","type":"upstream_error","param":null,"code":"upstream_bad_response","upstream":"openai"\}\}/);
  t.ok(text.endsWith('data: [DONE]\n\n'));
  t.ok(text.length < 64 * 1024, `the endless event was not passed on (${text.length} characters came)`);
  await closed;
  t.pass('the upstream connection was closed');
  const [row] = await rows(gw);
  t.match(row, { status: 502, generated_tokens: 2, refund_tokens: 18 });
});

for (const [name, body, generated, code] of [
  ['ends its stream part way, cleanly, without [DONE]', 'data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","choices":[{"index":0,"delta":{"content":"Hello"},"finish_reason":null}]}\n\n', 1, 'upstream_lost'],
  ['answers a stream request with junk under an event-stream type', 'this is not server-sent events\n', 0, 'upstream_bad_response'],
] as const) {
  t.test(`an upstream that ${name}: an error event, not a whole answer`, async (t) => {
    const server: Server = createServer((req, res) => {
      req.resume();
      req.on('end', () => {
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(body);
      });
    });
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
    t.teardown(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
    const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { billing: 'local' })] });
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...chat, stream: true }) });
    const text = await res.text();
    t.match(text, new RegExp(`data: \\{"error":\\{[^\\n]*"code":"${code}","upstream":"openai"\\}\\}`));
    t.notMatch(text, /this is not/, 'the junk is not passed on');
    const [row] = await rows(gw);
    t.match(row, { status: 502, generated_tokens: generated });
    if (generated === 0) t.equal(row.charge_tokens, 0, 'nothing came: the whole reservation refunded');
  });
}
