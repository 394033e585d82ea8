// What start-up refuses (SPEC §8): a bad environment variable, config file, price file or ledger
// ends the process before it listens, with one line naming the problem (no stack) and a non-zero
// exit — 2 for configuration, 1 for a ledger it cannot use.

import t from 'tap';
import { chmodSync, existsSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { freePort } from '../helpers/process.js';
import Database from 'better-sqlite3';
import { start, minimalConfig, startConfigured, waitHealthy, tempDir, exitedOrListening } from '../helpers/start-process.js';

// Every case starts a gateway process of its own (1–3 s each under tsx): a minute alone, more on a
// loaded machine, so the file has more than the suite's 120 s.
t.setTimeout(360_000);

t.test('a PostgreSQL store that cannot be reached ends the start with one line naming it, no stack', async (t) => {
  const dir = tempDir(t);
  const closed = await freePort();
  const s = startConfigured(t, dir, { ...minimalConfig(dir, {}), store: { kind: 'postgres', url: `postgres://u:secret-pw@127.0.0.1:${closed}/db` } }, { TOLLGATE_PORT: String(await freePort()) });
  t.equal(await s.exited, 1);
  t.match(s.stderr(), /^tollgate: cannot open the ledger \(the PostgreSQL server of store\.url\): connect ECONNREFUSED 127\.0\.0\.1:\d+\n$/);
  t.notMatch(s.stderr(), /secret-pw/, 'the password is not repeated');
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
  t.equal(s.stderr().split('\n')[0], `tollgate: invalid configuration: prices.overrides ${prices}: models["gpt-4o"].input_mtok: must be a non-negative number`);
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
  // Nothing is made beside it (regression: the owner lock left `<folder>-lock` in its parent).
  t.notOk(existsSync(`${dir}-lock`), 'no stray lock file beside the folder');
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
