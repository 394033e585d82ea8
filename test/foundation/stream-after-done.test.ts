// After `data: [DONE]` the client's stream ends at once, settled, whatever the upstream does next:
// an upstream that ends its response is read to its end and its connection used again; one that
// keeps the response open after [DONE] does not hold the client (server/pipeline/relay-stream.ts).

import t from 'tap';
import { createServer, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

const chunk = (delta: Record<string, unknown>, finish: string | null = null) =>
  `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;

async function upstream(t: { teardown(fn: () => unknown): void }, holdAfterDone: boolean) {
  let connections = 0;
  const held: ServerResponse[] = [];
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk({ role: 'assistant', content: '' }) + chunk({ content: 'Hello' }) + chunk({}, 'stop'));
      res.write(`data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [], usage: { prompt_tokens: 9, completion_tokens: 1, total_tokens: 10 } })}\n\n`);
      if (holdAfterDone) {
        res.write('data: [DONE]\n\n');
        held.push(res);
      } else {
        res.end('data: [DONE]\n\n');
      }
    });
  });
  server.on('connection', () => connections++);
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    for (const res of held) res.destroy();
    server.closeAllConnections();
    server.close();
  });
  return {
    url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`,
    connections: () => connections,
    release: () => held.forEach((res) => res.destroy()),
  };
}

const body = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 16, stream: true });

t.test('an upstream that ends after [DONE]: read to its end, one connection for every request', async (t) => {
  const up = await upstream(t, false);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`${up.url}/v1`, { billing: 'local' })] });
  for (let i = 0; i < 5; i++) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
    const text = await res.text();
    t.ok(text.endsWith('data: [DONE]\n\n'), 'the stream ends with [DONE]');
    t.match(text, /: tollgate \{"charge_tokens":\d+/, 'settled');
  }
  t.equal(up.connections(), 1, 'the upstream connection went back to the pool each time');
});

t.test('an upstream that keeps its response open after [DONE] does not hold the client', async (t) => {
  const up = await upstream(t, true);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`${up.url}/v1`, { billing: 'local' })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await res.text();
  t.ok(text.endsWith('data: [DONE]\n\n'));
  t.match(text, /"content":"Hello"/);
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows.length, 1);
  t.match(rows[0], { state: 'settled', status: 200, generated_tokens: 1 });
  up.release();
});

t.test('a malformed tool-call entry in a chunk neither breaks the stream nor leaves the upstream running', async (t) => {
  let closedAt = 0;
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(chunk({ role: 'assistant', content: '' }) + chunk({ content: 'Hello' }) + chunk({ tool_calls: [null, 'x'] }));
      res.on('close', () => (closedAt = Date.now()));
      res.end(chunk({}, 'stop') + 'data: [DONE]\n\n');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => {
    server.closeAllConnections();
    server.close();
  });
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}/v1`;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(url, { billing: 'local' })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  const text = await res.text();
  t.notMatch(text, /upstream_lost/, 'no error event: the upstream did nothing wrong that the relay cannot pass on');
  t.ok(text.endsWith('data: [DONE]\n\n'));
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.match(rows[0], { state: 'settled', status: 200 });
  t.ok(closedAt > 0, 'the upstream response ended');
});
