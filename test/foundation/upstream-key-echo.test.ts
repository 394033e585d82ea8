// The upstream's API key never reaches a client, whatever the upstream echoes back and wherever
// (server/pipeline/upstream-key.ts): an error in a 200, an error inside a stream (as data, or as an
// `event: error`), a stream line that is not JSON, a comment, a passed-on header, an error body that spells
// the key with JSON escapes, and an answer or a stream chunk that carries it beside the answer. A
// security audit and its review found each of these passing the key on.

import t from 'tap';
import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { get_encoding } from '@dqbd/tiktoken';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';

const KEY = 'sk-upstream-SECRET-0123456789';

/** Each mode answers with the Authorization header it received echoed in one place. */
const MODES: Record<string, (auth: string, res: ServerResponse) => void> = {
  'error-in-200': (auth, res) => json(res, 200, { error: { message: `bad credentials: ${auth}`, type: 'auth' } }),
  'escaped-401': (auth, res) => {
    const escaped = [...auth].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('');
    res.writeHead(401, { 'content-type': 'application/json' }).end(`{"error":{"message":"bad credentials: ${escaped}","type":"auth"}}`);
  },
  'header-echo': (auth, res) => {
    res.setHeader('x-ratelimit-echo', auth);
    res.setHeader('x-request-id', `req for ${auth}`);
    json(res, 200, { id: 'c1', object: 'chat.completion', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 5, completion_tokens: 1, total_tokens: 6 } });
  },
  'answer-echo': (auth, res) => {
    const escaped = [...auth].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('');
    res.writeHead(200, { 'content-type': 'application/json' }).end(
      `{"id":"c1","object":"chat.completion","created":1,"model":"gpt-4o-mini","debug":{"authorization":"${auth}","escaped":"${escaped}"},"choices":[{"index":0,"message":{"role":"assistant","content":"ok"},"finish_reason":"stop"}],"usage":{"prompt_tokens":5,"completion_tokens":1,"total_tokens":6}}`,
    );
  },
  'stream-chunk-echo': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const chunk = (content: string, extra: Record<string, unknown> = {}) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', ...extra, choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
    res.write(chunk('hi'));
    res.write(chunk(' there', { debug: { authorization: auth } }));
    res.write(chunk(` (${auth})`));
    res.end('data: [DONE]\n\n');
  },
  'stream-escaped-meta': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    const escaped = [...auth].map((c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, '0')}`).join('');
    const chunk = (content: string, fingerprint: string) =>
      `data: {"id":"c1","object":"chat.completion.chunk","created":1,"model":"gpt-4o-mini","system_fingerprint":"${fingerprint}","choices":[{"index":0,"delta":{"content":"${content}"},"logprobs":null,"finish_reason":null}]}\n\n`;
    res.write(chunk('hi', 'fp'));
    res.write(chunk(' there', escaped));
    res.end('data: [DONE]\n\n');
  },
  'stream-data-error': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: null }] })}\n\n`);
    res.end(`data: ${JSON.stringify({ error: { message: `stream failed for ${auth}`, type: 'server_error' } })}\n\n`);
  },
  'stream-event-error': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(`event: error\ndata: ${JSON.stringify({ error: { message: `overloaded, ${auth}` } })}\n\n`);
  },
  // A comment goes on as it came (a keep-alive), but not the key in it (twentieth session, an audit).
  'stream-comment-echo': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`: upstream debug, received authorization=${auth}\n\n`);
    res.write(`data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: 'stop' }] })}\n\n`);
    res.end('data: [DONE]\n\n');
  },
  'stream-raw-line': (auth, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`data: not json, but ${auth}\n\n`);
    res.write(`data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta: { content: 'hi' }, finish_reason: 'stop' }] })}\n\n`);
    res.end('data: [DONE]\n\n');
  },
};

function json(res: ServerResponse, status: number, body: unknown): void {
  res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
}

async function echoingUpstream(t: { teardown(fn: () => unknown): void }): Promise<string> {
  const server = createServer((req: IncomingMessage, res) => {
    let raw = '';
    req.on('data', (c: Buffer) => (raw += c.toString()));
    req.on('end', () => {
      const body = JSON.parse(raw) as { messages: Array<{ content: string }> };
      MODES[body.messages[0]!.content]!(String(req.headers.authorization), res);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

t.test("no path hands the upstream's key to the client", async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream(await echoingUpstream(t), { billing: 'local' })] }, { env: { DOUBLE_KEY: KEY } });
  for (const mode of Object.keys(MODES)) {
    const stream = mode.startsWith('stream');
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: mode }], max_tokens: 5, stream }),
    });
    const text = await res.text();
    const headers = JSON.stringify([...res.headers]);
    // Decoded as a client would read it: JSON escapes spell the key too.
    const decoded = stream ? text : JSON.stringify(JSON.parse(text));
    t.notOk(text.includes(KEY) || decoded.includes(KEY) || /\\u0073\\u006b/.test(text), `${mode}: not in the body`);
    t.notOk(headers.includes(KEY), `${mode}: not in a header`);
    t.ok(text.includes('[redacted]') || headers.includes('[redacted]'), `${mode}: the echo is there, redacted (${res.status})`);
  }
});

t.test('a stream cut at its allowance part way into an echoed key gives no start of it', async (t) => {
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      const chunk = (content: string) => `data: ${JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, delta: { content }, finish_reason: null }] })}\n\n`;
      res.write(chunk('hi'));
      res.write(chunk(` your header was ${String(req.headers.authorization)} ok`));
      res.end('data: [DONE]\n\n');
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(url, { billing: 'local' }), { ...openaiUpstream(url, { billing: 'local' }), name: 'other', models: ['mystery-*'] }] }, { env: { DOUBLE_KEY: KEY } });
  for (const model of ['gpt-4o-mini', 'mystery-model']) {
    for (let maxTokens = 2; maxTokens <= 20; maxTokens++) {
      const res = await fetch(`${gw.url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ model, messages: [{ role: 'user', content: `cut ${maxTokens}` }], max_tokens: maxTokens, stream: true }),
      });
      const text = await res.text();
      if (text.includes(KEY.slice(0, 6))) t.fail(`${model}, max_tokens ${maxTokens}: a start of the key went out`);
    }
  }
  t.pass('no start of the key at any cut');
});

t.test('what the model wrote is charged as it wrote it, the key included, though the client gets it redacted', async (t) => {
  const o200k = get_encoding('o200k_base');
  t.teardown(() => o200k.free());
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      // No usage: the gateway counts the output itself.
      json(res, 200, { id: 'c1', object: 'chat.completion', created: 1, model: 'gpt-4o-mini', choices: [{ index: 0, message: { role: 'assistant', content: `your header was ${String(req.headers.authorization)}` }, finish_reason: 'stop' }] });
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const url = `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(url, { billing: 'local' })] }, { env: { DOUBLE_KEY: KEY } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'echo' }], max_tokens: 100 }),
  });
  const body = (await res.json()) as { choices: Array<{ message: { content: string } }> };
  t.equal(body.choices[0]!.message.content, 'your header was Bearer [redacted]');
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows[0]!.generated_tokens, o200k.encode_ordinary(`your header was Bearer ${KEY}`).length);
});
