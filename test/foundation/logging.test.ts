// Logging (SPEC §10, STYLE §8): one pino JSON line per request — 'request settled' with id, tenant,
// model, upstream, status, tokens, charge, cost and overhead — and never a key or prompt text.

import t, { type Test } from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Writable } from 'node:stream';
import OpenAI from 'openai';
import { Registry } from 'prom-client';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { openaiUpstream, startGateway } from '../helpers/gateway.js';
import { sdkStatus } from '../helpers/sdk.js';

const KEY = 'tg-secret-4f9c2e7a1b';
const UPSTREAM_KEY = 'sk-upstream-9d3b';
const PROMPT = 'purple-elephant-sonata-7731 tell me about it';

type Line = Record<string, unknown>;

async function loggedGateway(t: Test, level: string, logging: Record<string, unknown> = {}, double: Parameters<typeof startOpenAiDouble>[0] = { completionTokens: 3 }) {
  const upstream = await startOpenAiDouble(double);
  t.teardown(upstream.close);
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-log-'));
  let output = '';
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      output += chunk.toString('utf8');
      done();
    },
  });
  const config = parseConfig(
    {
      store: { kind: 'sqlite', path: join(dir, 'ledger.db') },
      upstreams: [
        openaiUpstream(upstream.url, { billing: 'local' }),
        openaiUpstream(upstream.url, { name: 'metered', models: ['gpt-4.1'] }),
        { name: 'down', kind: 'openai', baseUrl: 'http://127.0.0.1:9/v1', models: ['down-*'], billing: 'local' },
        { name: 'llama-down', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['llama-*'], billing: 'local', contextWindow: 4096 },
      ],
      auth: { keys: [{ key: KEY, tenant: 'acme' }] },
      logging,
    },
    {},
  );
  const app = await buildApp({ config, registry: new Registry(), env: { DOUBLE_KEY: UPSTREAM_KEY, TOLLGATE_ADMIN_TOKEN: 'admin-secret' }, logger: { level, stream } });
  await app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(async () => {
    await app.close();
    rmSync(dir, { recursive: true, force: true });
  });
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  const lines = () =>
    output
      .split('\n')
      .filter(Boolean)
      .map((l) => JSON.parse(l) as Line);
  return { url: `http://127.0.0.1:${port}`, output: () => output, lines, upstream };
}

t.test("exactly one 'request settled' line per request, with the figures", async (t) => {
  const gw = await loggedGateway(t, 'info');
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: KEY, maxRetries: 0 });
  // 1. a non-streamed and a streamed chat request
  const { response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10 }).withResponse();
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: `${PROMPT} again` }], max_tokens: 10, stream: true });
  for await (const chunk of stream) void chunk;

  const settled = gw.lines().filter((l) => l.msg === 'request settled');
  t.equal(settled.length, 2, 'one line per request');
  const [first, second] = settled;
  t.match(first, {
    level: 30,
    id: String,
    tenant: 'acme',
    model: 'gpt-4o',
    upstream: 'openai',
    status: 200,
    prompt_tokens: Number,
    reserved_tokens: Number,
    charge_tokens: Number,
    cost_usd: 0,
    overhead_ms: Number,
  });
  t.equal(first.charge_tokens, Number(response.headers.get('x-tollgate-charge-tokens')), 'the charge the client was told');
  t.equal(first.reserved_tokens, Number(response.headers.get('x-tollgate-reserved-tokens')));
  // What was generated and refunded, as the client was told (regression: not on the line).
  t.equal(first.refund_tokens, Number(response.headers.get('x-tollgate-refund-tokens')));
  t.ok(typeof first.generated_tokens === 'number' && first.generated_tokens > 0 && first.generated_tokens <= (first.charge_tokens as number), `generated_tokens ${String(first.generated_tokens)}`);
  t.equal((first.charge_tokens as number) + (first.refund_tokens as number), first.reserved_tokens);
  t.ok((first.overhead_ms as number) >= 0);
  t.not(first.id, second.id, 'each request its own id');
  t.match(second, { status: 200, model: 'gpt-4o', tenant: 'acme' });

  // 2. a failing request is logged the same way, once
  const before = gw.lines().filter((l) => l.msg === 'request settled').length;
  t.equal(await sdkStatus(client.chat.completions.create({ model: 'down-1', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10 })), 502);
  const after = gw.lines().filter((l) => l.msg === 'request settled');
  t.equal(after.length, before + 1);
  t.match(after.at(-1), { status: 502, upstream: 'down', charge_tokens: 0 });

  // 3. a refused request (it never reaches the pipeline's settlement) still gets its one line
  t.equal(await sdkStatus(client.chat.completions.create({ model: 'no-such-model', messages: [{ role: 'user', content: PROMPT }] })), 404);
  const refused = gw.lines().filter((l) => l.msg === 'request refused');
  t.equal(refused.length, 1);
  t.match(refused[0], { route: 'chat', status: 404, code: 'model_not_found', tenant: 'acme', model: 'no-such-model', upstream: null });
  t.equal(gw.lines().filter((l) => l.msg === 'request settled').length, before + 1, 'and no settled line');
  // 4. a refusal of a model that routes names the model and its upstream (the window is 128,000)
  t.equal(await sdkStatus(client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }], max_tokens: 200_000 })), 413);
  t.match(gw.lines().filter((l) => l.msg === 'request refused').at(-1), { status: 413, code: 'context_window_exceeded', model: 'gpt-4o', upstream: 'openai' });
});

t.test('an upstream that cannot be reached: still one line for the request, at warn, saying why', async (t) => {
  const gw = await loggedGateway(t, 'info');
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'down-1', messages: [{ role: 'user', content: 'Hello' }], max_tokens: 10 }),
  });
  t.equal(res.status, 502);
  await res.text();
  const lines = gw.lines().filter((l) => l.reqId !== undefined && l.msg !== 'incoming request' && l.msg !== 'request completed');
  t.equal(lines.length, 1, `one line: ${lines.map((l) => l.msg).join(', ')}`);
  t.match(lines[0], { msg: 'request settled', level: 40, status: 502, code: 'upstream_unreachable', upstream: 'down' });
  t.type(lines[0]!.err, 'string');
});

t.test('a llama.cpp server that is down: its tokenizer warning is written once, not on every request', async (t) => {
  const gw = await loggedGateway(t, 'info');
  for (let i = 0; i < 3; i++) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: 'llama-x', messages: [{ role: 'user', content: `Hello ${i}` }], max_tokens: 10 }),
    });
    t.equal(res.status, 502);
    await res.text();
  }
  const warnings = gw.lines().filter((l) => l.msg === 'tokenizer unavailable, using byte estimate');
  t.equal(warnings.length, 1, 'one warning for the state, not one per request');
  t.match(warnings[0], { level: 40, upstream: 'llama-down', held_back: 0 });
  t.equal(gw.lines().filter((l) => l.msg === 'request settled').length, 3, 'each request still has its own line');
});

t.test('neither the key nor the prompt text appears anywhere in the log, even at trace level', async (t) => {
  const gw = await loggedGateway(t, 'trace');
  const post = (body: unknown, key = KEY) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` }, body: JSON.stringify(body) });
  t.equal((await post({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10 })).status, 200);
  t.equal((await post({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10, stream: true })).status, 200);
  t.equal((await post({ model: 'down-1', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10 })).status, 502);
  t.equal((await post({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }] }, `${KEY}-wrong`)).status, 401);
  t.equal((await post({ model: 'gpt-4o', messages: 'not a list', note: PROMPT })).status, 400);
  const completions = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'gpt-4o', prompt: PROMPT, max_tokens: 5 }),
  });
  t.equal(completions.status, 200);
  const out = gw.output();
  t.ok(out.length > 0, 'something was logged');
  t.equal(gw.lines().filter((l) => l.msg === 'request settled').length, 4, 'the four requests that reached the pipeline');
  t.equal(gw.lines().filter((l) => l.msg === 'request refused').length, 2, 'the 401 and the 400, one line each');
  for (const secret of [KEY, 'tg-secret', UPSTREAM_KEY, 'purple-elephant', 'sonata-7731']) {
    t.notOk(out.includes(secret), `"${secret}" is not in the log`);
  }
});

t.test('logging.prompts: true adds the prompt to the request line (off by default, as above)', async (t) => {
  const gw = await loggedGateway(t, 'info', { prompts: true });
  const post = (body: unknown) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` }, body: JSON.stringify(body) });
  t.equal((await post({ model: 'gpt-4o', messages: [{ role: 'user', content: PROMPT }], max_tokens: 10 })).status, 200);
  const line = gw.lines().find((l) => l.msg === 'request settled');
  t.same(line?.prompt, [{ role: 'user', content: PROMPT }]);
  t.notOk(gw.output().includes(KEY), 'the key still is not');
});

t.test('operator calls, admission and the info routes get one line each, without their tokens', async (t) => {
  const gw = await loggedGateway(t, 'info');
  const made = await fetch(`${gw.url}/admin/keys`, { method: 'POST', headers: { authorization: 'Bearer admin-secret', 'content-type': 'application/json' }, body: JSON.stringify({ tenant: 'acme' }) });
  t.equal(made.status, 201);
  const key = ((await made.json()) as { key: string }).key;
  t.equal((await fetch(`${gw.url}/v1/models`, { headers: { authorization: `Bearer ${KEY}` } })).status, 200);
  t.equal((await fetch(`${gw.url}/healthz`)).status, 200);
  const lines = gw.lines().filter((l) => l.msg === 'request');
  t.match(lines, [
    { level: 30, route: '/admin/keys', method: 'POST', status: 201, ms: Number },
    { level: 30, route: '/v1/models', method: 'GET', status: 200, tenant: 'acme' },
  ]);
  t.equal(lines.length, 2, 'probes are logged at debug only');
  t.notMatch(gw.output(), /admin-secret/, 'no admin token');
  t.notMatch(gw.output(), new RegExp(key), 'no key made');
  t.notMatch(gw.output(), new RegExp(KEY), 'no client key');
});

t.test('a refusal outside a model request is one line at info; a failure is one line at warn', async (t) => {
  const gw = await loggedGateway(t, 'info');
  const admin = { authorization: 'Bearer admin-secret', 'content-type': 'application/json' };
  // Regression: each of these also wrote a warn line "upstream or gateway failure" (two lines, SPEC §10).
  const refusals: Array<[string, string, Record<string, string>, unknown, number, string]> = [
    ['GET', '/admin/ledger', { authorization: `Bearer ${KEY}` }, undefined, 403, 'forbidden'],
    ['GET', '/admin/ledger', {}, undefined, 401, 'admin_token_required'],
    ['GET', '/admin/ledger?since=yesterday', admin, undefined, 400, 'invalid_request'],
    ['PUT', '/admin/tenants/nobody/budget', admin, { monthly_budget_usd: 1 }, 404, 'not_found'],
    ['GET', '/v1/conversations/none-such/spend', { authorization: `Bearer ${KEY}` }, undefined, 404, 'not_found'],
  ];
  // 1. every gateway-made refusal: one 'request refused' line at info with its status and code
  for (const [method, path, headers, body, status, code] of refusals) {
    const seen = gw.lines().length;
    const res = await fetch(`${gw.url}${path}`, { method, headers, body: body === undefined ? undefined : JSON.stringify(body) });
    t.equal(res.status, status, `${method} ${path}`);
    await res.text();
    const lines = gw.lines().slice(seen);
    t.equal(lines.length, 1, `${method} ${path} → ${status}: one line (${lines.map((l) => l.msg).join(', ')})`);
    t.match(lines[0], { msg: 'request refused', level: 30, status, code });
  }
  // 2. an upstream failure the pipeline did not log (a 200 whose body is an error): one line, at
  // warn, saying why
  // Its message repeats the prompt, as some upstreams' do: the client gets it, the log does not.
  gw.upstream.options.failWith = { status: 200, body: { error: { message: 'could not process: Hello PROMPT-TEXT-4711', code: 404 } } };
  const seen = gw.lines().length;
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'Hello PROMPT-TEXT-4711' }], max_tokens: 10 }),
  });
  t.equal(res.status, 502);
  t.match(await res.text(), /PROMPT-TEXT-4711/, "the client is told the upstream's own message");
  const lines = gw.lines().slice(seen);
  t.equal(lines.length, 1, `one line: ${lines.map((l) => l.msg).join(', ')}`);
  // Its one line is the settled request's, with its figures (a whole refund) and the failure.
  t.match(lines[0], { msg: 'request settled', level: 40, status: 502, code: 'upstream_bad_response', tenant: 'acme', model: 'gpt-4o', upstream: 'openai', err: /answered 200 with an error \(its message is not logged/, charge_tokens: 0 });
  t.notMatch(JSON.stringify(lines), /PROMPT-TEXT-4711/, 'no prompt text in the log');
});

t.test('an upstream key variable the environment lacks is warned about at start, by name only', async (t) => {
  let output = '';
  const stream = new Writable({
    write(chunk: Buffer, _enc, done) {
      output += chunk.toString('utf8');
      done();
    },
  });
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-log-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const config = parseConfig(
    { store: { kind: 'sqlite', path: join(dir, 'ledger.db') }, upstreams: [openaiUpstream('http://127.0.0.1:9', { apiKeyEnv: 'NOT_SET_KEY' })] },
    {},
  );
  const app = await buildApp({ config, registry: new Registry(), env: { DOUBLE_KEY: UPSTREAM_KEY }, logger: { level: 'info', stream } });
  t.teardown(() => app.close());
  const warned = output
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as Line)
    .filter((l) => l.level === 40 && !/new, empty ledger/.test(String(l.msg)));
  t.match(warned, [{ upstream: 'openai', apiKeyEnv: 'NOT_SET_KEY', msg: /API key variable is not set/ }]);
});

t.test('a model name past 256 characters is a 400 naming it, and is neither logged nor stored (regression: a megabyte a request)', async (t) => {
  const gw = await loggedGateway(t, 'info');
  const huge = `gpt-4o-${'x'.repeat(1_000_000)}`;
  const send = (authorization: string) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization },
      body: JSON.stringify({ model: huge, messages: [{ role: 'user', content: 'hi' }] }),
    });
  const res = await send(`Bearer ${KEY}`);
  t.equal(res.status, 400);
  t.match(await res.json(), { error: { code: 'invalid_request', param: 'model', message: 'model: must be at most 256 characters (it has 1000007)' } });
  // Without a key, a body this large is not even read (server/body.ts).
  t.equal((await send('Bearer tg-nobody')).status, 401);
  t.ok(gw.output().length < 10_000, `the log holds ${gw.output().length} characters`);
  t.equal(gw.upstream.requests.length, 0);
  const longest = `gpt-4o-${'x'.repeat(249)}`;
  const ok = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ model: longest, messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(ok.status, 200, 'a name of 256 characters is a name');
});

t.test('a turn that cost more than its reservation is logged with both figures', async (t) => {
  // The upstream ignores max_tokens: 40 tokens written against an allowance of 4.
  const gw = await loggedGateway(t, 'info', {}, { completionTokens: 40, ignoreMaxTokens: true });
  const ask = (max_tokens: number) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: 'gpt-4.1', max_tokens, messages: [{ role: 'user', content: 'Talk on.' }] }),
    });
  const cost = Number((await ask(4)).headers.get('x-tollgate-cost-usd'));
  const [line, ...more] = gw.lines().filter((l) => l.msg === 'turn cost more than its reservation');
  t.equal(more.length, 0, 'once');
  t.match(line, { level: 40, upstream: 'metered', model: 'gpt-4.1', cost_usd: cost, generated: 40, allowance: 4 });
  t.ok((line!.reserved_usd as number) < cost, `reserved ${line!.reserved_usd}, cost ${cost}`);
  await ask(100);
  t.equal(gw.lines().filter((l) => l.msg === 'turn cost more than its reservation').length, 1, 'not when the turn stayed within it');
});

// An outside audit: an upstream listed after a catch-all never served a request, and nothing said
// so; a run budget below the default allowance refused every request without max_tokens, silently
// at start and with a message that named a figure the client never asked for.
t.test('the start warns of models an earlier upstream takes, and of run budgets below defaults.maxTokens', async (t) => {
  let output = '';
  const logStream = new Writable({
    write(chunk: Buffer, _enc, done) {
      output += chunk.toString('utf8');
      done();
    },
  });
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(
    t,
    {
      upstreams: [
        openaiUpstream(upstream.url, { name: 'a', models: ['gpt-*'], billing: 'local' }),
        openaiUpstream(upstream.url, { name: 'b', models: ['gpt-4o', 'o3'], billing: 'local' }),
        openaiUpstream(upstream.url, { name: 'c', models: ['*'], billing: 'local' }),
        openaiUpstream(upstream.url, { name: 'd', models: ['*', 'claude-x', 'gpt-4o'], billing: 'local' }),
        openaiUpstream(upstream.url, { name: 'e', models: ['gpt-*', 'claude-*'], billing: 'local' }),
      ],
      runs: { tokenBudget: 2000 },
      logging: { level: 'warn' },
    },
    { logStream },
  );
  const lines = output.trim().split('\n').map((l) => JSON.parse(l) as Line);
  const shadow = (name: string) => lines.find((l) => l.upstream === name && String(l.msg).includes('an earlier upstream lists these'));
  // The most specific entry routes (exact names, then longer patterns): b's names are its own, and
  // c's catch-all serves what the rest do not; d's `*` and `gpt-4o` are c's and b's.
  t.notOk(shadow('b'));
  t.notOk(shadow('c'));
  t.same(shadow('d')?.models, ['gpt-4o', '*'], "claude-x is d's own");
  t.same(shadow('d')?.routedTo, ['b', 'c']);
  // A review: a pattern after a catch-all is not shadowed when it is more specific (it routes first).
  t.notOk(lines.some((l) => l.upstream === 'a' && String(l.msg).includes('an earlier upstream lists these')));
  t.same([shadow('e')?.models, shadow('e')?.routedTo], [['gpt-*'], ['a']], "e's claude-* routes to it, past c's catch-all");
  t.match(lines.find((l) => String(l.msg).startsWith('runs.tokenBudget is below defaults.maxTokens')), { 'runs.tokenBudget': 2000, 'defaults.maxTokens': 4096 });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'o3', messages: [{ role: 'user', content: 'hello' }] }) });
  t.equal(res.status, 402);
  const body = (await res.json()) as { error: { message: string; prompt_tokens: number } };
  t.match(body.error.message, /\+ max output 4096: defaults\.maxTokens 4096, as the request named no max_tokens\), more than the run's whole budget of 2000 tokens; max_tokens \d+ or less would fit what the run has left$/);
  t.ok(body.error.message.endsWith(`; max_tokens ${2000 - body.error.prompt_tokens} or less would fit what the run has left`), 'the fix, with its figure: what the run has left after the prompt');
  // A review: with n = 2 the figure is twice the default, and says so; the fix is per choice.
  const two = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'o3', n: 2, messages: [{ role: 'user', content: 'hello' }] }) });
  const twoError = ((await two.json()) as { error: { message: string; prompt_tokens: number } }).error;
  t.match(twoError.message, /\+ max output 8192: defaults\.maxTokens 4096 × 2, as the request named no max_tokens\)/);
  t.ok(twoError.message.endsWith(`; max_tokens ${Math.floor((2000 - twoError.prompt_tokens) / 2)} or less (per choice) would fit what the run has left`));
});

t.test("a final answer's unnamed allowance, cut to the run's budget, is said so in the token 402", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local', contextWindow: 400000 })], runs: { tokenBudget: 100, answerReserveTokens: 50 } });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', tools, messages: [{ role: 'user', content: 'word '.repeat(200) }] }),
  });
  t.equal(res.status, 402);
  t.match(((await res.json()) as { error: { message: string } }).error.message, /max output 1: 1, the default cut to what the run's budget and the model's window leave, as the request named no max_tokens/);
  t.equal(upstream.requests.length, 0);
});
