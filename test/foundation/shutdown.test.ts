// A stopping gateway (SIGTERM, server/main.ts): requests in flight finish and are settled, a
// keep-alive connection does not hold the process open, and a request still running at the drain
// deadline is stopped — settled for what was generated, its stream ended with a `shutting_down`
// error event — so none is left for the next start to recover and charge in full.

import t, { type Test } from 'tap';
import { Agent, request } from 'node:http';
import { connect } from 'node:net';
import type { ChildProcess } from 'node:child_process';
import { startOpenAiDouble } from '../doubles/openai.js';
import { processConfig, startGatewayProcess } from '../helpers/process.js';
import { startGateway, openaiUpstream, llamaUpstream } from '../helpers/gateway.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { collect } from '../helpers/stores.js';

// Many cases start a gateway process of their own (1–3 s each under tsx): over a minute alone,
// more on a loaded machine, so the file has more than the suite's 120 s.
t.setTimeout(360_000);

async function world(t: Test, tokens: number, env: NodeJS.ProcessEnv = {}) {
  const upstream = await startOpenAiDouble({ completionTokens: tokens, delayMs: 100 });
  t.teardown(upstream.close);
  const { configPath } = processConfig(t, upstream.url, 'tollgate-shutdown-');
  const started = await startGatewayProcess(configPath, env);
  t.teardown(() => started.child.kill('SIGKILL'));
  return { ...started, configPath, upstream };
}

const exited = (child: ChildProcess) => new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));

/** A streamed chat request on a keep-alive connection; resolves with the whole body once it ends. */
function streamOnKeepAlive(url: string, agent: Agent, onFirstChunk: () => void): Promise<string> {
  const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'Tell me a long story.' }] });
  return new Promise((resolve, reject) => {
    const req = request(`${url}/v1/chat/completions`, { method: 'POST', agent, headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body) } }, (res) => {
      let text = '';
      let first = true;
      res.setEncoding('utf8');
      res.on('data', (d: string) => {
        text += d;
        if (first) {
          first = false;
          onFirstChunk();
        }
      });
      res.on('end', () => resolve(text));
      res.on('error', reject);
    });
    req.on('error', reject);
    req.end(body);
  });
}

/**
 * A gateway process streaming `tokens` tokens (100 ms each) on a keep-alive connection, and
 * `signal(child)` called at the first chunk: the whole stream as received, and the exit code.
 */
async function streamWhileSignalled(t: Test, tokens: number, signal: (child: ChildProcess) => void, env: NodeJS.ProcessEnv = {}) {
  const { url, child, configPath } = await world(t, tokens, env);
  const agent = new Agent({ keepAlive: true });
  t.teardown(() => agent.destroy());
  const done = exited(child);
  const text = await streamOnKeepAlive(url, agent, () => signal(child));
  return { text, done, configPath };
}

async function ledgerRows(url: string): Promise<Array<Record<string, unknown>>> {
  const text = await (await fetch(`${url}/admin/ledger`, { headers: { authorization: 'Bearer admin-secret' } })).text();
  return text.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>);
}

// SIGHUP too: a closed terminal or ssh session sends it, and its default ended the process at once.
for (const signal of ['SIGTERM', 'SIGHUP'] as const) {
  t.test(`${signal} during a stream on a keep-alive connection: the stream ends whole and the process exits 0`, async (t) => {
    const { text, done } = await streamWhileSignalled(t, 5, (child) => child.kill(signal));
    t.ok(text.trimEnd().endsWith('data: [DONE]'), 'the stream in flight finished');
    t.match(text, /: tollgate \{"charge_tokens":\d+,"refund_tokens":95,/, 'and was settled: 5 of 100 generated');
    // The idle keep-alive socket does not hold the server open until the hard deadline (exit 1).
    t.equal(await done, 0, 'the process exits 0');
  });
}

t.test('a stream still running at the drain deadline is stopped, settled for what it generated, and told why', async (t) => {
  const { text, done, configPath } = await streamWhileSignalled(t, 200, (child) => child.kill('SIGTERM'), { TOLLGATE_DRAIN_MS: '500' });
  t.match(text, /"code":"shutting_down"/, 'the stream ends with a shutting_down error event');
  t.match(text, /: tollgate \{"charge_tokens":\d+,"refund_tokens":\d+/, 'with its settled figures');
  t.equal(await done, 0, 'the process exits 0, well before the hard deadline');

  // At the next start nothing is left to recover: the request was settled for what it generated.
  const again = await startGatewayProcess(configPath);
  t.teardown(() => again.child.kill('SIGKILL'));
  const rows = await ledgerRows(again.url);
  t.equal(rows.length, 1);
  t.equal(rows[0]!.state, 'settled', 'settled by the stopping gateway, not recovered at start');
  t.equal(rows[0]!.status, 503);
  const generated = rows[0]!.generated_tokens as number;
  t.ok(generated > 0 && generated < 200, `charged for the ${generated} tokens generated, not the whole allowance`);
});

t.test('many requests in flight listen for the drain without a listener-leak warning', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, delayMs: 50 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const warnings: string[] = [];
  const onWarning = (w: Error) => warnings.push(w.name);
  process.on('warning', onWarning);
  t.teardown(() => process.off('warning', onWarning));
  const requests = Array.from({ length: 16 }, (_, i) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 5, stream: true, messages: [{ role: 'user', content: `question ${i}` }] }),
    }).then((r) => r.text()),
  );
  await Promise.all(requests);
  await new Promise((r) => setImmediate(r)); // warnings are emitted on the next tick
  t.same(warnings.filter((w) => w === 'MaxListenersExceededWarning'), []);
});

t.test('a request that reaches a closing gateway gets a 503 in the OpenAI envelope', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, delayMs: 300 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'slow one' }] });
  const inFlight = fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body });
  while (upstream.requests.length === 0) await new Promise((r) => setTimeout(r, 5));
  // A request whose head is still arriving when the gateway starts closing (its connection is
  // not idle, so it is not closed under it).
  // (The server's parser reads a socket's bytes before a listener added after it does.)
  const headRead = new Promise<void>((r) => gw.app.server.once('connection', (s) => s.once('data', () => r())));
  const socket = connect(Number(new URL(gw.url).port), '127.0.0.1');
  let text = '';
  socket.on('data', (b) => (text += b.toString()));
  const ended = new Promise<void>((r) => socket.on('close', () => r()));
  socket.write('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n');
  await headRead;
  const closing = gw.app.close();
  socket.write(`Content-Type: application/json\r\nContent-Length: ${Buffer.byteLength(body)}\r\n\r\n${body}`);
  await ended;
  t.equal((await inFlight).status, 200, 'the request in flight finished');
  await closing;
  t.match(text, /^HTTP\/1\.1 503 /);
  t.match(text, /\r\nconnection: close\r\n/i);
  t.notMatch(text, /x-should-retry/i, 'retryable: another replica, or this one restarted, takes it');
  t.match(text, /\r\n\r\n\{"error":\{"message":"the gateway is shutting down: the request was not started; send it again","type":"server_error","param":null,"code":"shutting_down"\}\}$/);
  t.equal(upstream.requests.length, 1, 'it was not sent upstream');
});

t.test('at the drain deadline, a request still being counted or admitted is answered 503 shutting_down and leaves nothing reserved', async (t) => {
  // 1. A llama.cpp server slow to tokenize: the request is still being planned at the deadline.
  const llama = await startLlamaCppDouble({ tokenizeDelayMs: 3_000 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] }, { store: 'sqlite' });
  const post = () =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', max_tokens: 5, messages: [{ role: 'user', content: 'hello' }] }) });
  const counting = post();
  while (!llama.requests.some((r) => r.path === '/tokenize')) await new Promise((r) => setTimeout(r, 5));
  gw.app.gateway.drain.abort();
  const res = await counting;
  t.equal(res.status, 503, 'answered, not left for the hard exit to cut');
  t.match(await res.json(), { error: { code: 'shutting_down' } });
  t.notOk(llama.requests.some((r) => r.path === '/v1/chat/completions'), 'nothing was sent to the model');
  t.same(await collect(gw.ledger.exportRows(null, null)), [], 'nothing was reserved');
});

t.test('a request admitted after the drain deadline is not sent, and its reservation is refunded whole', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] }, { store: 'sqlite' });
  // The ledger is slow to admit (a lock held elsewhere): the deadline passes meanwhile.
  const ledger = gw.app.gateway.ledger;
  const admit = ledger.admit.bind(ledger);
  ledger.admit = async (r) => {
    gw.app.gateway.drain.abort();
    return admit(r);
  };
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: 'hello' }] }) });
  t.equal(res.status, 503);
  t.match(await res.json(), { error: { code: 'shutting_down' } });
  t.equal(upstream.requests.filter((r) => r.method === 'POST').length, 0, 'not sent');
  const rows = await collect(gw.ledger.exportRows(null, null));
  t.match(rows, [{ state: 'settled', status: 503, charge_tokens: 0, refund_tokens: 13 }], 'settled, all of it refunded: no model read it');
});

t.test('a second signal stops the requests still running at once instead of after the drain', async (t) => {
  const { text, done } = await streamWhileSignalled(
    t,
    400,
    (child) => {
      child.kill('SIGINT');
      setTimeout(() => child.kill('SIGINT'), 1_500);
    },
    { TOLLGATE_DRAIN_MS: '60000' },
  );
  // 400 tokens at 100 ms each take 40 s, well inside the 60 s drain: only the second signal stops it.
  t.match(text, /"code":"shutting_down"/, 'the stream ends with a shutting_down error event');
  const refund = Number(/: tollgate \{"charge_tokens":\d+,"refund_tokens":(\d+)/.exec(text)?.[1]);
  t.ok(refund > 0, `stopped part way, settled for what it generated (${400 - refund} of 400)`);
  t.equal(await done, 0);
});

// npm passes on to its child the signal the whole process group was sent (systemd, Ctrl-C): the
// gateway gets it twice, milliseconds apart, and that is one request to stop, not two.
t.test('the same signal twice within a second drains once, as one signal', async (t) => {
  const { text, done } = await streamWhileSignalled(t, 5, (child) => {
    child.kill('SIGTERM');
    // (Apart: a signal sent while the first is still pending is merged with it by the kernel.)
    setTimeout(() => child.kill('SIGTERM'), 20);
  });
  t.notMatch(text, /shutting_down/, 'not stopped');
  t.match(text, /: tollgate \{"charge_tokens":\d+,"refund_tokens":95,/, 'it ran to its end and was settled');
  t.equal(await done, 0);
});
