// A llama.cpp server (or a proxy before it) whose /apply-template error echoes the request's
// headers: with `logging.prompts` on, the warning quotes its text, without the upstream's key.
import t from 'tap';
import { createServer, request as httpRequest } from 'node:http';
import { Writable } from 'node:stream';
import { startGateway } from '../helpers/gateway.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';

const UPKEY = 'sk-llama-upstream-key-5150';

t.test('a llama.cpp /apply-template error that echoes the request headers leaves the upstream key out of the log (logging.prompts: true)', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 3 });
  t.teardown(llama.close);
  // A proxy in front of llama-server whose /apply-template fails, echoing the request's headers.
  const proxy = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const body = Buffer.concat(chunks);
      if (req.url === '/apply-template') {
        res.writeHead(500, { 'content-type': 'application/json' });
        res.end(JSON.stringify({ error: { code: 500, message: `bad request, headers: ${req.headers.authorization}` } }));
        return;
      }
      const u = new URL(llama.url);
      const on = httpRequest({ host: u.hostname, port: u.port, path: req.url, method: req.method, headers: req.headers }, (r) => {
        res.writeHead(r.statusCode ?? 500, r.headers);
        r.pipe(res);
      });
      on.end(body);
    });
  });
  await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => { proxy.closeAllConnections(); proxy.close(); });
  const port = (proxy.address() as { port: number }).port;
  let out = '';
  const stream = new Writable({ write(c: Buffer, _e, d) { out += c.toString(); d(); } });
  const gw = await startGateway(
    t,
    { upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: `http://127.0.0.1:${port}`, apiKeyEnv: 'LLAMA_KEY', models: ['*'], billing: 'local' }], logging: { level: 'info', prompts: true } },
    { logStream: stream, env: { LLAMA_KEY: UPKEY } },
  );
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3 }) });
  t.equal(res.status, 200);
  t.ok(out.includes('tokenizer unavailable'), 'the operator is told');
  t.notOk(out.includes(UPKEY), 'the upstream key is not in the log, even with logging.prompts');
});
