// A client that reads a stream slower than the model writes it holds the upstream back, as a plain
// proxy would (SPEC §2: streams relayed chunk by chunk, never buffered): the gateway reads the next
// piece of the upstream's stream once the client has taken the last, so a slow or stalled reader
// never makes the gateway gather a whole answer in memory.
import t, { type Test } from 'tap';
import { createServer, request as httpRequest, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { collect } from '../helpers/stores.js';

const CHUNKS = 20_000;
const piece = ' word'.repeat(400); // 2 KB of content a chunk: 40 MB in all

/** An upstream that streams CHUNKS chunks as fast as it is read; `state` says how far it got. */
async function floodingUpstream(t: Test) {
  const state = { written: 0, finished: false, closed: false };
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.on('close', () => (state.closed = true));
      const pump = () => {
        while (state.written < CHUNKS) {
          state.written++;
          const chunk = { id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: piece }, finish_reason: null }] };
          if (!res.write(`data: ${JSON.stringify(chunk)}\n\n`)) return void res.once('drain', pump);
        }
        res.end('data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n');
        state.finished = true;
      };
      pump();
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { upstream.closeAllConnections(); upstream.close(() => r()); }));
  return { url: `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`, state };
}

/** A stream request over plain HTTP, paused as soon as its head arrives. */
async function pausedStream(url: string): Promise<IncomingMessage> {
  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'write a lot' }], max_tokens: 100_000_000, stream: true });
  const res = await new Promise<IncomingMessage>((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, resolve);
    req.on('error', reject);
    req.end(body);
  });
  res.pause();
  return res;
}

t.test('a stalled reader stalls the upstream; once it reads, the whole stream comes', async (t) => {
  const { url, state } = await floodingUpstream(t);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(url, { billing: 'local', models: ['m'], contextWindow: null })], runs: { tokenBudget: null } });
  const res = await pausedStream(gw.url);
  t.equal(res.statusCode, 200);
  // The client reads nothing for a while: the upstream may fill the sockets' buffers, no more.
  await new Promise((r) => setTimeout(r, 1500));
  t.ok(state.written < CHUNKS / 2, `the upstream wrote ${state.written} of ${CHUNKS} chunks while the client read nothing`);
  t.notOk(state.finished);
  let received = 0;
  let text = '';
  res.setEncoding('utf8');
  res.on('data', (d: string) => {
    received += d.length;
    text = text.slice(-200) + d;
  });
  res.resume();
  await new Promise((r) => res.on('end', r));
  t.ok(state.finished, 'then the whole stream came through');
  t.ok(received > CHUNKS * piece.length, `${received} characters received`);
  t.match(text, /data: \[DONE\]\n\n$/);
});

t.test('a reader that never takes anything more is let go: the upstream is closed and the request settled', async (t) => {
  const { url, state } = await floodingUpstream(t);
  // The upstream's timeout bounds how long a client may drain nothing (10 minutes by default).
  const gw = await startGateway(t, { upstreams: [openaiUpstream(url, { billing: 'local', models: ['m'], contextWindow: null, timeoutMs: 1000 })], runs: { tokenBudget: null } });
  const res = await pausedStream(gw.url);
  t.equal(res.statusCode, 200);
  res.on('error', () => undefined);
  for (let i = 0; i < 100 && gw.app.gateway.inFlight.size > 0; i++) await new Promise((r) => setTimeout(r, 100));
  t.equal(gw.app.gateway.inFlight.size, 0, 'settled');
  t.ok(state.closed, 'the upstream connection was closed');
  t.notOk(state.finished);
  const [row] = await collect(gw.ledger.exportRows(null, null));
  t.match(row, { state: 'settled', status: 499 }, 'settled as a client that left, for what was generated');
  t.ok((row?.generated_tokens ?? 0) > 0, `${row?.generated_tokens} tokens generated, charged`);
});
