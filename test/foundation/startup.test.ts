// Start-up (SPEC §8): server/main.ts run as a process. With no config it serves the zero-config
// default on TOLLGATE_PORT at 127.0.0.1; a non-loopback address is served only with client keys.
// (What start-up refuses, with a message naming the problem and a non-zero exit: startup-refusals.)

import t from 'tap';
import { readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { spawn } from 'node:child_process';
import { join } from 'node:path';
import { createServer } from 'node:net';
import { freePort } from '../helpers/process.js';
import { start, minimalConfig, startConfigured, waitHealthy, tempDir, exitedOrListening, root } from '../helpers/start-process.js';

// Every case starts a gateway process of its own (1–3 s each under tsx): a minute alone, more on a
// loaded machine, so the file has more than the suite's 120 s.
t.setTimeout(360_000);

t.test('no config: listens on TOLLGATE_PORT at 127.0.0.1 and /healthz answers', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = start(dir, { TOLLGATE_PORT: String(port) });
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  const url = `http://127.0.0.1:${port}`;
  await waitHealthy(url, s);
  const health = await fetch(`${url}/healthz`);
  t.same(await health.json(), { status: 'ok' });

  // 1. the zero-config upstream: a llama.cpp server on 127.0.0.1:8080, free, serving every model
  const models = (await (await fetch(`${url}/v1/models`)).json()) as { data: Array<Record<string, unknown>> };
  t.match(models.data, [{ id: '*', upstream: 'local', billing: 'local' }]);
  // 2. the listening line says where: loopback, the port asked for
  const listening = s
    .stdout()
    .split('\n')
    .filter((l) => l.includes('tollgate listening'))
    .map((l) => JSON.parse(l) as { host: string; port: number; store: string });
  t.equal(listening.length, 1);
  t.match(listening[0], { host: '127.0.0.1', port, store: 'sqlite' });
  // It says what the default chose, and where (regression: the upstream's name alone).
  t.same((listening[0] as unknown as { upstreams: unknown }).upstreams, [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:8080', models: ['*'] }]);
  t.notMatch(s.stdout(), /tokenizers loaded/, 'a llama.cpp upstream counts with its own tokenizer: no tiktoken to load');

  // 3. SIGTERM shuts down gracefully with exit code 0
  s.child.kill('SIGTERM');
  t.equal(await s.exited, 0);
});

t.test('the encodings an OpenAI upstream can need are loaded before the gateway listens', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = startConfigured(
    t,
    dir,
    {
      ...minimalConfig(dir, {}),
      upstreams: [
        { name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['*'] },
        { name: 'openai', kind: 'openai', baseUrl: 'http://127.0.0.1:9/v1', models: ['gpt-4o*'] },
      ],
    },
    { TOLLGATE_PORT: String(port) },
  );
  await waitHealthy(`http://127.0.0.1:${port}`, s);
  const lines = s
    .stdout()
    .split('\n')
    .filter((l) => l.startsWith('{'))
    .map((l) => JSON.parse(l) as { msg: string; encodings?: string[]; ms?: number });
  const loaded = lines.findIndex((l) => l.msg === 'tokenizers loaded');
  t.ok(loaded >= 0, 'a start-up line says which encodings were loaded');
  // gpt-4o* models use o200k_base only; every other model goes to llama.cpp, which counts itself.
  t.same(lines[loaded]?.encodings, ['o200k_base']);
  t.type(lines[loaded]?.ms, 'number');
  t.ok(loaded < lines.findIndex((l) => l.msg === 'tollgate listening'), 'before listening');
});

t.test('TOLLGATE_HOST=0.0.0.0 without auth.keys is refused at start', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = start(dir, { TOLLGATE_PORT: String(port), TOLLGATE_HOST: '0.0.0.0' });
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  const code = await s.exited;
  t.not(code, 0, 'non-zero exit');
  t.not(code, null);
  t.match(s.stderr(), /refusing to listen on 0\.0\.0\.0 without client keys/);
  t.match(s.stderr(), /auth\.keys/, 'says what to add');
  await t.rejects(fetch(`http://127.0.0.1:${port}/healthz`), 'nothing listens');
  t.same(readdirSync(dir), [], 'no ledger file was made for a refused start');
});

t.test('0.0.0.0 with auth.keys is allowed', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = startConfigured(
    t,
    dir,
    minimalConfig(dir, { auth: { keys: [{ key: 'tg-start', tenant: 'start' }] } }),
    { TOLLGATE_PORT: String(port), TOLLGATE_HOST: '0.0.0.0' },
  );
  await waitHealthy(`http://127.0.0.1:${port}`, s);
  const res = await fetch(`http://127.0.0.1:${port}/v1/models`);
  t.equal(res.status, 401, 'and the keys are required');
});

t.test('0.0.0.0 with keys made by the operator API only (none in the config) is allowed, and they are required', async (t) => {
  const dir = tempDir(t);
  const config = minimalConfig(dir, {});
  // A first start on loopback, where the operator makes a key…
  const port = await freePort();
  const first = startConfigured(t, dir, config, { TOLLGATE_PORT: String(port), TOLLGATE_ADMIN_TOKEN: 'admin-secret' });
  await waitHealthy(`http://127.0.0.1:${port}`, first);
  t.match(first.stdout(), /no client keys \(none in the config, none made with the operator API\): every request is tenant \\"local\\"/, 'an open start says so');
  const lineOf = (out: string, msg: string) => out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.msg === msg);
  t.match(lineOf(first.stdout(), 'created a new, empty ledger: no spend, keys or caps from any earlier ledger apply'), { level: 40, store: 'sqlite', location: join(dir, 'ledger.db') }, 'a new ledger is said to be new, with where it is');
  const made = await fetch(`http://127.0.0.1:${port}/admin/keys`, { method: 'POST', headers: { authorization: 'Bearer admin-secret', 'content-type': 'application/json' }, body: JSON.stringify({ tenant: 'acme' }) });
  const { key } = (await made.json()) as { key: string };
  first.child.kill('SIGTERM');
  await first.exited;
  // …then the same ledger on every address.
  const port2 = await freePort();
  const s = startConfigured(t, dir, config, { TOLLGATE_PORT: String(port2), TOLLGATE_HOST: '0.0.0.0' });
  await waitHealthy(`http://127.0.0.1:${port2}`, s);
  t.notMatch(s.stdout(), /no client keys/);
  t.match(lineOf(s.stdout(), 'ledger opened'), { level: 30, store: 'sqlite', location: join(dir, 'ledger.db') });
  t.notMatch(s.stdout(), /created a new/);
  t.equal((await fetch(`http://127.0.0.1:${port2}/v1/models`)).status, 401, 'no key: refused');
  t.equal((await fetch(`http://127.0.0.1:${port2}/v1/models`, { headers: { authorization: 'Bearer tg-made-up' } })).status, 401, 'an unknown key: refused');
  t.equal((await fetch(`http://127.0.0.1:${port2}/v1/models`, { headers: { authorization: `Bearer ${key}` } })).status, 200, 'the made key: served');
});

t.test('TOLLGATE_PORT set but empty is the default port 8787, not a random one', async (t) => {
  const dir = tempDir(t);
  // Hold 8787 (if something else already does, the same follows): the gateway must try it and fail.
  const holder = createServer();
  await new Promise<void>((resolve) => {
    holder.once('error', () => resolve());
    holder.listen(8787, '127.0.0.1', () => resolve());
  });
  t.teardown(() => new Promise<void>((resolve) => (holder.listening ? holder.close(() => resolve()) : resolve())));
  const s = start(dir, { TOLLGATE_PORT: '' });
  t.equal(await exitedOrListening(t, s), 1, 'it did not listen anywhere else');
  t.match(s.stderr(), /^tollgate: cannot listen on 127\.0\.0\.1:8787 \(EADDRINUSE\): it is already in use; set TOLLGATE_HOST \/ TOLLGATE_PORT$/m);
  t.notMatch(s.stderr(), /\n\s+at /, 'no stack trace');
});

t.test('TOLLGATE_HOST set but empty is the default 127.0.0.1', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = start(dir, { TOLLGATE_PORT: String(port), TOLLGATE_HOST: '' });
  t.equal(await exitedOrListening(t, s), 'listening', `listening (${s.stderr()})`);
  await waitHealthy(`http://127.0.0.1:${port}`, s);
  const line = s
    .stdout()
    .split('\n')
    .find((l) => l.includes('tollgate listening'));
  t.match(JSON.parse(line ?? '{}'), { host: '127.0.0.1', port });
});

// Regression (twenty-first session): a signal before the gateway served (its tokenizers loading, a
// wait for the SQLite file another process holds) ended it by the signal's default: exit 143, no line.
t.test('a signal while the start waits for the ledger stops it there: exit 0, said on stderr, the other gateway untouched', async (t) => {
  const dir = tempDir(t);
  const config = minimalConfig(dir, {});
  const first = startConfigured(t, dir, config, { TOLLGATE_PORT: String(await freePort()) });
  t.equal(await exitedOrListening(t, first), 'listening');
  const second = startConfigured(t, dir, config, { TOLLGATE_PORT: String(await freePort()) });
  while (!second.stdout().includes('waiting for it to stop')) {
    if (second.child.exitCode !== null) break;
    await new Promise((r) => setTimeout(r, 50));
  }
  t.match(second.stdout(), 'waiting for it to stop', 'the second start waits for the file');
  second.child.kill('SIGTERM');
  t.equal(await second.exited, 0, 'stopped, as a stop is');
  t.match(second.stderr(), 'tollgate: SIGTERM before the start finished: stopped');
  t.equal(first.child.exitCode, null, 'the gateway serving the file goes on');
  first.child.kill('SIGTERM');
  t.equal(await first.exited, 0);
});

t.test('TOLLGATE_PORT=0 listens on a free port, and the start line says which (it said 0)', async (t) => {
  const dir = tempDir(t);
  const s = start(dir, { TOLLGATE_PORT: '0' });
  t.equal(await exitedOrListening(t, s), 'listening');
  const line = s.stdout().split('\n').find((l) => l.includes('tollgate listening'))!;
  const port = (JSON.parse(line) as { port: number }).port;
  t.ok(port > 0, `port ${port}`);
  t.equal((await fetch(`http://127.0.0.1:${port}/healthz`)).status, 200);
});

// Regression (nineteenth session): `npm start` ran the gateway under `sh -c`, which does not pass
// SIGTERM on: npm stopped, and the gateway went on serving, orphaned. The start script, as written
// in package.json, is run by npm here with the gateway swapped for a program that says it was
// stopped.
t.test('npm start passes SIGTERM on to the gateway (the script execs it)', async (t) => {
  const dir = tempDir(t);
  const script = (JSON.parse(readFileSync(join(root, 'package.json'), 'utf8')) as { scripts: { start: string } }).scripts.start;
  t.match(script, /dist\/server\/main\.js/);
  writeFileSync(
    join(dir, 'main.mjs'),
    "import { writeFileSync } from 'node:fs'; writeFileSync('pid', String(process.pid)); process.on('SIGTERM', () => { console.log('stopped by SIGTERM'); process.exit(0); }); console.log('started'); setInterval(() => {}, 1000);\n",
  );
  writeFileSync(join(dir, 'package.json'), JSON.stringify({ name: 'start-probe', version: '1.0.0', scripts: { start: script.replace('dist/server/main.js', 'main.mjs') } }));
  const npm = spawn('npm', ['start', '--silent'], { cwd: dir, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  npm.stdout.on('data', (d: Buffer) => (out += d.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => npm.on('exit', (code) => resolve(code)));
  t.teardown(() => {
    npm.kill('SIGKILL');
    // The program itself, had it been left running (the fault this test is about).
    try {
      process.kill(Number(readFileSync(join(dir, 'pid'), 'utf8')), 'SIGKILL');
    } catch {
      // already gone
    }
  });
  while (!out.includes('started')) await new Promise((r) => setTimeout(r, 50));
  npm.kill('SIGTERM');
  await exited;
  // The program's own line comes before npm has gone; give the pipe a moment.
  for (let i = 0; i < 40 && !out.includes('stopped by SIGTERM'); i++) await new Promise((r) => setTimeout(r, 50));
  t.match(out, 'stopped by SIGTERM', 'the gateway was told to stop, not left running');
});
