// A client that reads a stream slower than the model writes it holds the upstream back, as a plain
// proxy would (SPEC §2: streams relayed chunk by chunk, never buffered): the gateway reads the next
// piece of the upstream's stream once the client has taken the last, so a slow or stalled reader
// never makes the gateway gather a whole answer in memory.
import t from 'tap';
import { createServer, request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

const CHUNKS = 20_000;
const piece = ' word'.repeat(400); // 2 KB of content a chunk: 40 MB in all

t.test('a stalled reader stalls the upstream; once it reads, the whole stream comes', async (t) => {
  let written = 0;
  let finished = false;
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const pump = () => {
        while (written < CHUNKS) {
          written++;
          const chunk = { id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: piece }, finish_reason: null }] };
          if (!res.write(`data: ${JSON.stringify(chunk)}\n\n`)) return void res.once('drain', pump);
        }
        res.end('data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n');
        finished = true;
      };
      pump();
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { upstream.closeAllConnections(); upstream.close(() => r()); }));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`, { billing: 'local', models: ['m'], contextWindow: null })], runs: { tokenBudget: null } });

  const body = JSON.stringify({ model: 'm', messages: [{ role: 'user', content: 'write a lot' }], max_tokens: 100_000_000, stream: true });
  const res = await new Promise<import('node:http').IncomingMessage>((resolve, reject) => {
    const req = httpRequest(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, resolve);
    req.on('error', reject);
    req.end(body);
  });
  if (res.statusCode !== 200) {
    res.resume();
    return t.fail(`status ${res.statusCode}`);
  }
  res.pause();
  // The client reads nothing for a while: the upstream may fill the sockets' buffers, no more.
  await new Promise((r) => setTimeout(r, 1500));
  t.ok(written < CHUNKS / 2, `the upstream wrote ${written} of ${CHUNKS} chunks while the client read nothing`);
  t.notOk(finished);
  let received = 0;
  let text = '';
  res.setEncoding('utf8');
  res.on('data', (d: string) => {
    received += d.length;
    text = text.slice(-200) + d;
  });
  res.resume();
  await new Promise((r) => res.on('end', r));
  t.ok(finished, 'then the whole stream came through');
  t.ok(received > CHUNKS * piece.length, `${received} characters received`);
  t.match(text, /data: \[DONE\]\n\n$/);
});
