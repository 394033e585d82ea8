// A body far past `limits.maxBodyBytes` gets its 413 (SPEC §6), however large it is and however
// the client sends it. Found by an outside audit: past 4× the limit the gateway destroyed the
// socket before writing the answer — curl saw an empty reply, the OpenAI SDK a connection error
// that it retried three times. The answer now goes first and the connection is closed in stages
// (server/body.ts, server/staged-close.ts).

import t, { type Test } from 'tap';
import { connect, type Socket } from 'node:net';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import OpenAI, { APIConnectionError, APIError } from 'openai';
import { startOpenAiDouble, type OpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream, metricValue, type TestGateway } from '../helpers/gateway.js';
import { processConfig, startGatewayProcess } from '../helpers/process.js';
import { LINGER_MS, drainBytes } from '../../server/body.js';

const LIMIT = 4000;
const DRAIN = drainBytes(LIMIT);

type Envelope = { error: { message: string; code: string; body_bytes: number; limit: number } };

async function setup(t: Test): Promise<{ upstream: OpenAiDouble; gw: TestGateway; port: number }> {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], limits: { maxBodyBytes: LIMIT } });
  return { upstream, gw, port: Number(new URL(gw.url).port) };
}

/** A chat request of exactly `bytes` bytes of JSON. */
function chatBody(bytes: number): string {
  const shell = JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: '' }] });
  return shell.replace('"content":""', `"content":"${'a'.repeat(bytes - shell.length)}"`);
}

/** A body sent chunked (no content-length): `bytes` bytes in pieces of 16 KiB, as a stream is. */
function chunkedBody(bytes: number): ReadableStream<Uint8Array> {
  const text = chatBody(bytes);
  let at = 0;
  return new ReadableStream<Uint8Array>({
    pull(controller) {
      if (at >= text.length) return controller.close();
      controller.enqueue(new TextEncoder().encode(text.slice(at, at + 16_384)));
      at += 16_384;
    },
  });
}

async function post(url: string, body: string | ReadableStream<Uint8Array>) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body,
    ...(typeof body === 'string' ? {} : { duplex: 'half' }),
  } as RequestInit);
  return { status: res.status, headers: res.headers, body: (await res.json()) as Envelope };
}

/** A small valid request: the gateway still serves after a refusal. */
async function stillServes(t: Test, url: string): Promise<void> {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(res.status, 200, 'the gateway goes on serving');
  await res.arrayBuffer();
}

/**
 * A client that writes its whole request before it reads anything (as a plain HTTP/1.1 client
 * may): the head, then `body`; it reads the answer once its last byte is written, and closes
 * when the server does. `error` is what the socket failed with, if it did.
 */
function writeThenRead(port: number, head: string, body: Buffer): Promise<{ answer: string; error: string | null }> {
  return new Promise((resolve) => {
    const socket = connect(port, '127.0.0.1');
    let answer = '';
    let error: string | null = null;
    socket.on('error', (err: NodeJS.ErrnoException) => (error = err.code ?? err.message));
    socket.on('close', () => resolve({ answer, error }));
    socket.write(head);
    socket.write(body, () => socket.on('data', (d: Buffer) => (answer += d.toString('latin1'))));
  });
}

function parseAnswer(raw: string): { status: number; headers: Map<string, string>; body: Envelope } {
  const [head, body] = [raw.slice(0, raw.indexOf('\r\n\r\n')), raw.slice(raw.indexOf('\r\n\r\n') + 4)];
  const [statusLine, ...lines] = head.split('\r\n');
  const headers = new Map(lines.map((l) => [l.slice(0, l.indexOf(':')).toLowerCase(), l.slice(l.indexOf(':') + 1).trim()]));
  return { status: Number(statusLine?.split(' ')[1]), headers, body: JSON.parse(body) as Envelope };
}

/** `promise`, or a rejection naming `what` after `ms`: a test that would hang fails instead. */
function within<T>(ms: number, what: string, promise: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => (timer = setTimeout(() => reject(new Error(`no ${what} within ${ms} ms`)), ms)));
  return Promise.race([promise, late]).finally(() => clearTimeout(timer));
}

/** The chunked framing of `text` in pieces of 16 KiB, with its last chunk. */
function chunked(text: string): Buffer {
  const parts: string[] = [];
  for (let at = 0; at < text.length; at += 16_384) {
    const piece = text.slice(at, at + 16_384);
    parts.push(`${Buffer.byteLength(piece).toString(16)}\r\n${piece}\r\n`);
  }
  return Buffer.from(`${parts.join('')}0\r\n\r\n`);
}

t.test('a body 10×, 100× and 2,000× the limit, with a content-length: 413 with its exact size, not a reset connection', async (t) => {
  const { upstream, gw } = await setup(t);
  for (const bytes of [10 * LIMIT, 100 * LIMIT, 8 * DRAIN]) {
    const res = await post(gw.url, chatBody(bytes));
    t.equal(res.status, 413, `${bytes} bytes: 413`);
    t.equal(res.body.error.code, 'body_too_large');
    t.equal(res.body.error.message, `request body has ${bytes} bytes, the limit is 4000`);
    t.equal(res.body.error.body_bytes, bytes);
    t.equal(res.headers.get('x-should-retry'), 'false');
    t.equal(res.headers.get('connection'), 'close', 'the connection is not kept: the rest of the body is not read');
    await stillServes(t, gw.url);
  }
  t.equal(upstream.requests.length, 3, 'only the small requests reached the upstream');
  t.equal(await metricValue(gw.registry, 'tollgate_refusals_total', { reason: 'body_too_large' }), 3);
});

t.test('a chunked body far past the limit: 413 with its exact size within the drain bound, a lower bound past it', async (t) => {
  const { upstream, gw } = await setup(t);
  for (const bytes of [10 * LIMIT, 100 * LIMIT]) {
    const res = await post(gw.url, chunkedBody(bytes));
    t.equal(res.status, 413, `${bytes} bytes chunked: 413`);
    t.equal(res.body.error.message, `request body has ${bytes} bytes, the limit is 4000`, 'counted to its end: exact');
    t.equal(res.headers.get('x-should-retry'), 'false');
    await stillServes(t, gw.url);
  }
  // Past the drain bound the gateway stops counting: it cannot know the size, and says so.
  const res = await post(gw.url, chunkedBody(8 * DRAIN));
  t.equal(res.status, 413);
  t.equal(res.body.error.message, `request body has more than ${DRAIN} bytes, the limit is 4000`);
  t.equal(res.body.error.body_bytes, DRAIN);
  t.equal(res.headers.get('x-should-retry'), 'false');
  await stillServes(t, gw.url);
  t.equal(upstream.requests.length, 3, 'only the small requests reached the upstream');
});

t.test('the openai SDK gets a 413 APIError from one request, not a connection error retried', async (t) => {
  const { upstream, gw } = await setup(t);
  const calls: string[] = [];
  const client = new OpenAI({
    baseURL: `${gw.url}/v1`,
    apiKey: 'unused',
    fetch: (input, init) => {
      calls.push(String(input));
      return fetch(input, init);
    },
  });
  t.equal(client.maxRetries, 2, 'the SDK keeps its default retries');
  // 10× and 100× the limit, then 1,000× (4 MB): past the drain bound, where the gateway stops reading.
  for (const [n, times] of [[1, 10], [2, 100], [3, 1000]] as const) {
    const content = 'a'.repeat(times * LIMIT);
    let err: unknown = null;
    try {
      await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content }] });
    } catch (caught) {
      err = caught;
    }
    t.ok(err instanceof APIError, `${times}×: an APIError`);
    t.notOk(err instanceof APIConnectionError, 'not a connection error');
    const api = err as APIError;
    t.equal(api.status, 413);
    t.equal(api.code, 'body_too_large');
    const sent = Buffer.byteLength(JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content }] }));
    t.equal(api.message, `413 request body has ${sent} bytes, the limit is 4000`);
    t.equal(api.headers?.get('x-should-retry'), 'false');
    t.equal(calls.length, n, 'sent once: not retried');
  }
  t.equal(upstream.requests.length, 0, 'the upstream was never called');
  await stillServes(t, gw.url);
});

t.test('a client that writes its whole body before reading gets the 413 and a clean close', async (t) => {
  const { upstream, gw, port } = await setup(t);
  // 1. With a content-length, 100× the limit: answered at once, the rest read and discarded.
  const body = chatBody(100 * LIMIT);
  const head = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${body.length}\r\n\r\n`;
  const plain = await writeThenRead(port, head, Buffer.from(body));
  t.equal(plain.error, null, 'no reset: the client wrote all of its body');
  const answer = parseAnswer(plain.answer);
  t.equal(answer.status, 413);
  t.equal(answer.headers.get('connection'), 'close');
  t.equal(answer.headers.get('x-should-retry'), 'false');
  t.equal(answer.body.error.message, `request body has ${body.length} bytes, the limit is 4000`);

  // 2. Chunked, 100× the limit: counted to its end, then answered.
  const chunkedHead = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n`;
  const streamed = await writeThenRead(port, chunkedHead, chunked(body));
  t.equal(streamed.error, null);
  t.equal(parseAnswer(streamed.answer).body.error.message, `request body has ${body.length} bytes, the limit is 4000`);
  t.equal(upstream.requests.length, 0);
  await stillServes(t, gw.url);

  // 3. A body larger than the sockets' buffers hold (12 MiB, 3× a 4 MiB limit): answered before
  //    most of it has arrived, so the gateway must read the rest after its answer, not close on it.
  const big = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], limits: { maxBodyBytes: 4 * 1024 * 1024 } });
  const bigBody = Buffer.alloc(12 * 1024 * 1024, 'a');
  const bigHead = `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ${bigBody.length}\r\n\r\n`;
  const late = await writeThenRead(Number(new URL(big.url).port), bigHead, bigBody);
  t.equal(late.error, null, 'no reset: the client wrote all of its body');
  t.equal(parseAnswer(late.answer).body.error.message, `request body has ${bigBody.length} bytes, the limit is ${4 * 1024 * 1024}`);
});

t.test('a body without end is not read without end: past the drain bound the gateway stops reading', async (t) => {
  const { gw, port } = await setup(t);
  // The client declares a gigabyte and writes as fast as the connection takes it; it reads what
  // comes back but never stops writing by itself.
  const declared = 1024 ** 3;
  const socket: Socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  t.teardown(() => socket.destroy());
  let answer = '';
  let written = 0;
  const piece = Buffer.alloc(64 * 1024, 'a');
  const closed = new Promise<number>((resolve) => socket.on('close', () => resolve(Date.now())));
  socket.on('error', () => {});
  socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
  socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${declared}\r\n\r\n`);
  const pump = () => {
    while (!socket.destroyed && written < declared) {
      written += piece.length;
      if (!socket.write(piece)) return void socket.once('drain', pump);
    }
  };
  pump();
  const started = Date.now();
  const at = await within(LINGER_MS + 2000, 'close', closed);
  t.match(answer, /^HTTP\/1\.1 413 /, 'the answer went first');
  // What the client got written is the drain bound plus what the sockets' buffers hold.
  t.ok(written < DRAIN + 64 * 1024 * 1024, `the gateway stopped reading (${written} bytes written of ${declared})`);
  t.ok(at - started < LINGER_MS + 2000, `and closed the connection after LINGER_MS (${at - started} ms)`);
  await stillServes(t, gw.url);
});

t.test('a client that stops sending and never closes is let go after LINGER_MS', async (t) => {
  const { gw, port } = await setup(t);
  const connections = () => new Promise<number>((resolve, reject) => gw.app.server.getConnections((err, n) => (err ? reject(err) : resolve(n))));
  // The client keeps its side open (allowHalfOpen) and sends nothing after the start of its body.
  const socket: Socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  t.teardown(() => socket.destroy());
  let answer = '';
  let ended = 0;
  socket.on('error', () => {});
  socket.on('data', (d: Buffer) => (answer += d.toString('latin1')));
  socket.on('end', () => (ended = Date.now()));
  await new Promise((resolve) => socket.once('connect', resolve));
  socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: ${100 * LIMIT}\r\n\r\n{"model":`);
  const started = Date.now();
  await within(2000, 'answer', new Promise((resolve) => socket.once('data', resolve)));
  await within(LINGER_MS + 2000, 'close', (async () => {
    while ((await connections()) > 0) await new Promise((r) => setTimeout(r, 20));
  })());
  const gone = Date.now() - started;
  t.match(answer, /^HTTP\/1\.1 413 /);
  t.ok(ended > 0 && ended - started < 1000, 'the gateway closed its side right after the answer');
  t.ok(gone >= LINGER_MS - 100 && gone < LINGER_MS + 2000, `then waited LINGER_MS for the rest, and closed (${gone} ms)`);
  await stillServes(t, gw.url);
});

t.test('a stopping gateway does not wait out a refused client that is still connected', async (t) => {
  const { gw, port } = await setup(t);
  const socket: Socket = connect({ port, host: '127.0.0.1', allowHalfOpen: true });
  t.teardown(() => socket.destroy());
  socket.on('error', () => {});
  await new Promise((resolve) => socket.once('connect', resolve));
  socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ${100 * LIMIT}\r\n\r\n{"model":`);
  await within(2000, 'answer', new Promise((resolve) => socket.once('data', resolve)));
  const started = Date.now();
  await gw.app.close();
  t.ok(Date.now() - started < LINGER_MS / 2, `closed in ${Date.now() - started} ms, not after LINGER_MS`);
});

t.test('a gateway process survives bodies far past the limit, sent every way, and a client that leaves mid-body', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const { dir, configPath } = processConfig(t, upstream.url, 'tollgate-body-');
  writeFileSync(
    configPath,
    JSON.stringify({
      store: { kind: 'sqlite', path: join(dir, 'ledger.db') },
      upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstream.url}/v1`, models: ['gpt-*'], billing: 'local' }],
      limits: { maxBodyBytes: LIMIT },
      logging: { level: 'silent' },
    }),
  );
  const { url, child } = await startGatewayProcess(configPath);
  t.teardown(() => {
    child.kill('SIGKILL');
  });
  const port = Number(new URL(url).port);
  // 1. All at once: content-length and chunked, within and past the drain bound; a client that
  //    writes first; one that goes away after a little of its body.
  const leaver = new Promise<void>((resolve) => {
    const socket = connect(port, '127.0.0.1', () => {
      socket.write(`POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ${100 * LIMIT}\r\n\r\n${'a'.repeat(10_000)}`);
      setTimeout(() => socket.destroy(), 50);
    });
    socket.on('error', () => {});
    socket.on('close', () => resolve());
  });
  const statuses = await Promise.all([
    ...[10 * LIMIT, 100 * LIMIT, 4 * DRAIN].map(async (bytes) => (await post(url, chatBody(bytes))).status),
    ...[10 * LIMIT, 4 * DRAIN].map(async (bytes) => (await post(url, chunkedBody(bytes))).status),
    (async () => {
      const body = chatBody(50 * LIMIT);
      const res = await writeThenRead(port, `POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-length: ${body.length}\r\n\r\n`, Buffer.from(body));
      return parseAnswer(res.answer).status;
    })(),
  ]);
  await leaver;
  t.same(statuses, statuses.map(() => 413), 'every one answered 413');
  // 2. The process is alive and serving.
  t.equal(child.exitCode, null, 'the process did not exit');
  t.equal((await fetch(`${url}/healthz`)).status, 200);
  await stillServes(t, url);
  t.equal(upstream.requests.length, 1, 'only the small request reached the upstream');
});

// Regression (twentieth session): /v1/admission measured the request inside on JSON it wrote again
// — escapes, spaces and bytes that are not UTF-8 counted otherwise than the real request's — and
// checked its nesting before its size, where the real request answers the size first (SPEC §11).
t.test('/v1/admission holds the request inside to the limit as sent: the same bytes, the same verdict', async (t) => {
  const { gw } = await setup(t);
  const ask = async (inner: Buffer) => {
    const body = Buffer.concat([Buffer.from('{"endpoint":"/v1/chat/completions","request":'), inner, Buffer.from('}')]);
    const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: new Uint8Array(body) })).json()) as { verdict: { status: number; error: unknown } };
    const real = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: new Uint8Array(inner) });
    return { verdict: plan.verdict, status: real.status, body: real.status === 200 ? null : await real.json() };
  };
  const padded = (pad: string) => Buffer.from(`{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"x"}],"pad":"${pad}"}`);
  const cases: Array<[string, Buffer]> = [
    // 4,150 bytes sent, 1,000 characters once read: over the limit as sent.
    ['escaped characters', padded('\\u00e9'.repeat(690))],
    // Spaces between the tokens (a pretty-printed file): over the limit as sent.
    ['a pretty-printed body', Buffer.from(JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'x'.repeat(3900) }] }, null, 10))],
    // Bytes that are not UTF-8, one each as sent, three each once read: within the limit as sent.
    ['bytes that are not UTF-8', Buffer.concat([padded('').subarray(0, -2), Buffer.alloc(3500, 0xff), Buffer.from('"}')])],
    // Too deep and too large: the size is answered first.
    ['a body both too deep and too large', Buffer.from(`{"model":"gpt-4o","messages":[{"role":"user","content":"${'x'.repeat(4000)}"}],"metadata":${'['.repeat(140)}${']'.repeat(140)}}`)],
  ];
  for (const [what, inner] of cases) {
    const { verdict, status, body } = await ask(inner);
    t.equal(verdict.status, status, `${what}: ${status}, as the real request`);
    if (status !== 200) t.same(verdict.error, body, `${what}: the same envelope`);
  }
  t.equal((await ask(cases[0]![1])).status, 413, 'the escaped body is over the limit');
  t.equal((await ask(cases[1]![1])).status, 413, 'the pretty-printed body is over the limit');
  t.equal((await ask(cases[2]![1])).status, 200, 'the body with raw bytes is within it');
});
