// Start-up (SPEC §8): server/main.ts run as a process. With no config it serves the zero-config
// default on TOLLGATE_PORT at 127.0.0.1; a non-loopback address without client keys and a bad
// config file are both refused at start with a message naming the problem and a non-zero exit.

import t, { type Test } from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdtempSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createServer } from 'node:net';
import { freePort } from '../helpers/process.js';
import Database from 'better-sqlite3';

const root = new URL('../..', import.meta.url).pathname;
// The process runs in a temp folder (the default ledger file lands there), so tsx is given by URL.
const tsx = import.meta.resolve('tsx');

interface Started {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<number | null>;
}

function start(cwd: string, env: Record<string, string>, uid?: number): Started {
  // Only what the test chooses: no TOLLGATE_CONFIG, OPENAI_* or TOLLGATE_HOST from the outer shell.
  const base: Record<string, string> = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? cwd };
  const child = spawn(process.execPath, ['--import', tsx, join(root, 'server/main.ts')], {
    cwd,
    env: { ...base, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(uid === undefined ? {} : { uid, gid: uid }),
  });
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString('utf8')));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return { child, stdout: () => out, stderr: () => err, exited };
}

/** A SQLite ledger in `dir` and one llama.cpp upstream that is not there, plus `extra`. */
const minimalConfig = (dir: string, extra: Record<string, unknown>) => ({
  store: { kind: 'sqlite', path: join(dir, 'ledger.db') },
  upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9' }],
  ...extra,
});

/** Writes `raw` as the config file in `dir` and starts the gateway with it; killed at teardown. */
function startConfigured(t: Test, dir: string, raw: unknown, env: Record<string, string>, uid?: number): Started {
  const config = join(dir, 'config.json');
  writeFileSync(config, JSON.stringify(raw));
  const s = start(dir, { ...env, TOLLGATE_CONFIG: config }, uid);
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  return s;
}

async function waitHealthy(url: string, s: Started): Promise<void> {
  let done = false;
  void s.exited.then(() => (done = true));
  while (!done) {
    try {
      if ((await fetch(`${url}/healthz`)).ok) {
        // What the start logged reaches this process by a pipe, which the answer can overtake: the
        // line Fastify writes once listening comes after every line of the start.
        for (let i = 0; i < 50 && !s.stdout().includes('Server listening at'); i++) await new Promise((r) => setTimeout(r, 20));
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gateway exited before answering: ${s.stderr()}`);
}

function tempDir(t: { teardown(fn: () => void): void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-start-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

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

t.test('a PostgreSQL store that cannot be reached ends the start with one line naming it, no stack', async (t) => {
  const dir = tempDir(t);
  const closed = await freePort();
  const s = startConfigured(t, dir, { ...minimalConfig(dir, {}), store: { kind: 'postgres', url: `postgres://u:secret-pw@127.0.0.1:${closed}/db` } }, { TOLLGATE_PORT: String(await freePort()) });
  t.equal(await s.exited, 1);
  t.match(s.stderr(), /^tollgate: cannot open the ledger \(the PostgreSQL server of store\.url\): connect ECONNREFUSED 127\.0\.0\.1:\d+\n$/);
  t.notMatch(s.stderr(), /secret-pw/, 'the password is not repeated');
});

/** Resolves with the exit code, or 'listening' once the start-up line says so (killed at teardown). */
async function exitedOrListening(t: Test, s: Started): Promise<number | null | 'listening'> {
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  let code: number | null | undefined;
  void s.exited.then((c) => (code = c));
  while (code === undefined && !s.stdout().includes('tollgate listening')) await new Promise((r) => setTimeout(r, 50));
  return code === undefined ? 'listening' : code;
}

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

t.test('a TOLLGATE_PORT that is not a port number exits 2 naming it', async (t) => {
  for (const value of ['abc', ' ', '0x1f90', '65536']) {
    const dir = tempDir(t);
    const s = start(dir, { TOLLGATE_PORT: value });
    t.equal(await exitedOrListening(t, s), 2, `TOLLGATE_PORT="${value}"`);
    t.match(s.stderr(), `tollgate: TOLLGATE_PORT must be a port number, got "${value}"`);
  }
});

t.test('a TOLLGATE_DRAIN_MS that is not a number exits 2 naming it (it was ignored)', async (t) => {
  for (const value of ['abc', '25s', '-1']) {
    const dir = tempDir(t);
    const s = start(dir, { TOLLGATE_PORT: '0', TOLLGATE_DRAIN_MS: value });
    t.equal(await exitedOrListening(t, s), 2, `TOLLGATE_DRAIN_MS="${value}"`);
    t.match(s.stderr(), `tollgate: TOLLGATE_DRAIN_MS must be a number of milliseconds, got "${value}"`);
  }
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

t.test('a ledger a newer Tollgate wrote: exit 1 saying so, no stack', async (t) => {
  const dir = tempDir(t);
  const path = join(dir, 'ledger.db');
  const db = new Database(path);
  db.exec('CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)');
  db.prepare('INSERT INTO schema_version (version, applied_at) VALUES (?, ?)').run(99, Date.now());
  db.close();
  const s = startConfigured(t, dir, minimalConfig(dir, {}), { TOLLGATE_PORT: '0' });
  t.equal(await exitedOrListening(t, s), 1);
  t.match(s.stderr(), /^tollgate: the SQLite ledger is at schema version 99, newer than this Tollgate knows \(\d+\): a newer Tollgate wrote it/m);
  t.notMatch(s.stderr(), /\n\s+at /, 'no stack trace');
});

t.test('a bad config file exits non-zero naming the field', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = startConfigured(
    t,
    dir,
    {
      upstreams: [
        { name: 'ok', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:8080' },
        { name: 'bad', kind: 'openai', baseUrl: 'api.openai.com' },
      ],
    },
    { TOLLGATE_PORT: String(port) },
  );
  const code = await s.exited;
  t.not(code, 0);
  t.not(code, null);
  t.match(s.stderr(), /invalid configuration: upstreams\[1\]\.baseUrl: must be a URL/);
  await t.rejects(fetch(`http://127.0.0.1:${port}/healthz`), 'nothing listens');
});

t.test('a price overrides file that cannot be read is a configuration error too: exit 2, no stack', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = startConfigured(
    t,
    dir,
    minimalConfig(dir, { prices: { overrides: join(dir, 'missing-prices.json') } }),
    { TOLLGATE_PORT: String(port) },
  );
  t.equal(await s.exited, 2);
  t.match(s.stderr(), /^tollgate: invalid configuration: prices\.overrides: cannot read /);
  t.notMatch(s.stderr(), /\n\s+at /, 'no stack trace');
});

t.test('a bad price overrides file is refused before the ledger is opened: exit 2, no ledger file left behind', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const prices = join(dir, 'prices.json');
  writeFileSync(prices, JSON.stringify({ models: { 'gpt-4o': { input_mtok: -1, output_mtok: 10, date: '2026-01-01' } } }));
  // The default store: tollgate.db in the working directory, where a refused start must leave nothing.
  const { store: _store, ...noStore } = minimalConfig(dir, { prices: { overrides: prices } });
  const s = startConfigured(t, dir, noStore, { TOLLGATE_PORT: String(port) });
  t.equal(await s.exited, 2);
  t.match(s.stderr(), /^tollgate: invalid configuration: prices\.models\["gpt-4o"\]\.input_mtok: /);
  t.same(readdirSync(dir).sort(), ['config.json', 'prices.json'], 'no tollgate.db, -wal, -shm or -lock file');
});

t.test('a ledger path in a folder that does not exist: exit 2, naming store.path and the file', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const missing = join(dir, 'no-such-folder', 'ledger.db');
  const s = startConfigured(t, dir, minimalConfig(dir, { store: { kind: 'sqlite', path: missing } }), { TOLLGATE_PORT: String(port) });
  t.equal(await s.exited, 2);
  t.match(s.stderr(), `tollgate: invalid configuration: store.path: cannot open the SQLite ledger ${missing}`);
  t.notMatch(s.stderr(), /\n\s+at /, 'no stack trace');
});

t.test('a store.path that is a folder: exit 2, saying to name a file', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  const s = startConfigured(t, dir, minimalConfig(dir, { store: { kind: 'sqlite', path: dir } }), { TOLLGATE_PORT: String(port) });
  t.equal(await s.exited, 2);
  t.match(s.stderr(), `tollgate: invalid configuration: store.path: ${dir} is a folder: name the ledger's file`);
});

// A volume first written by root, served by a container running as another user: SQLite opens the
// file read-only without a word, the start succeeded, and every request was a 503 SQLITE_READONLY.
t.test('a ledger file this user cannot write: exit 2 at start, naming store.path', { skip: process.getuid?.() !== 0 ? 'needs root, to start the gateway as another user' : false }, async (t) => {
  const dir = tempDir(t);
  chmodSync(dir, 0o777);
  const path = join(dir, 'ledger.db');
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE made_by_root (x)');
  db.close();
  const config = minimalConfig(dir, {});
  const port = await freePort();
  // tap's process tracking writes a record from every child at exit, by default into the project's
  // .tap folder, which this user may not write: pointed at the test's folder instead.
  const s = startConfigured(t, dir, config, { TOLLGATE_PORT: String(port), HOME: dir, _TAPJS_PROCESSINFO_CWD_: dir }, 65534);
  t.equal(await s.exited, 2, s.stderr());
  t.match(s.stderr(), `tollgate: invalid configuration: store.path: the SQLite ledger ${path} cannot be written by this user`);
  t.notMatch(s.stderr(), /\n\s+at /, 'no stack trace');
});

// An outside audit: a host that does not resolve was a stack trace and exit 1, with a ledger left
// behind; `127.example.invalid` counted as loopback (it starts with "127.").
t.test('a TOLLGATE_HOST that is no address and does not resolve: exit 2 naming it, nothing created', async (t) => {
  for (const host of ['nonexistent.invalid', '127.0.0.1 ', '127.0.0.256']) {
    const dir = tempDir(t);
    const s = start(dir, { TOLLGATE_PORT: '0', TOLLGATE_HOST: host });
    t.equal(await exitedOrListening(t, s), 2, `TOLLGATE_HOST="${host}"`);
    t.match(s.stderr(), `tollgate: TOLLGATE_HOST "${host}" is neither an IP address nor a name that resolves (`);
    t.notMatch(s.stderr(), /\n\s+at /, 'no stack');
    t.same(readdirSync(dir), [], 'no ledger file');
  }
});

t.test('a config file saved with a byte-order mark is read', async (t) => {
  const dir = tempDir(t);
  const port = await freePort();
  writeFileSync(join(dir, 'config.json'), '\uFEFF' + JSON.stringify(minimalConfig(dir, {})));
  const s = start(dir, { TOLLGATE_PORT: String(port), TOLLGATE_CONFIG: join(dir, 'config.json') });
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  await waitHealthy(`http://127.0.0.1:${port}`, s);
  s.child.kill('SIGTERM');
  t.equal(await s.exited, 0);
  t.match(s.stdout(), /"msg":"stopped"/, 'a clean stop says so in its last line');
});
