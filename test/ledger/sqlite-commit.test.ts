// The SQLite store's commit path: group commit without a savepoint per request (one request that
// throws costs the batch a replay, never another request's write), and the WAL checkpointed by a
// worker thread rather than by the gateway's own connection (ADR 0012).
import t from 'tap';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import Database from 'better-sqlite3';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { SqliteLedger } from '../../metering/stores/sqlite-store.js';
import { WalCheckpointer, DEFAULT_AUTOCHECKPOINT_PAGES, FALLBACK_AUTOCHECKPOINT_PAGES, type CheckpointEvent } from '../../metering/stores/sqlite-checkpointer.js';
import { reservation, settlement, collect } from '../helpers/stores.js';
import { HOUR_MS, steppableWallClock } from '../helpers/wall-clock.js';

function tempLedger(t: { teardown(fn: () => unknown): void }) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-commit-'));
  const path = join(dir, 'ledger.db');
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return path;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

t.test('a request that throws inside a group commit fails alone; the rest of its batch is written', async (t) => {
  const path = tempLedger(t);
  const ledger = new SqliteLedger({ path });
  t.teardown(() => ledger.close());
  const first = reservation({ run: 'run-batch', promptCharge: 100, allowance: 50 });
  t.same(await ledger.admit(first), { ok: true });

  // Three admissions in one turn of the event loop share one transaction; the middle one reuses an
  // id already in the ledger, so its row insert throws after it has touched the run's counters.
  const a = reservation({ run: 'run-batch', promptCharge: 10, allowance: 5 });
  const dup = { ...reservation({ run: 'run-batch', promptCharge: 1000, allowance: 1000 }), id: first.id };
  const b = reservation({ run: 'run-batch', promptCharge: 20, allowance: 5 });
  const [ra, rdup, rb] = await Promise.allSettled([ledger.admit(a), ledger.admit(dup), ledger.admit(b)]);
  t.same(ra, { status: 'fulfilled', value: { ok: true } });
  t.equal(rdup.status, 'rejected', 'the duplicate fails');
  t.match(String((rdup as PromiseRejectedResult).reason), /UNIQUE/);
  t.same(rb, { status: 'fulfilled', value: { ok: true } });

  const run = await ledger.getRun('run-batch');
  t.equal(run?.usedTokens, 150 + 15 + 25, 'the failed request left nothing behind in the run budget');
  await ledger.settle(a.id, settlement(a, 5));
  await ledger.settle(b.id, settlement(b, 0));
  const rows = await collect(ledger.exportRows(null, null));
  t.same(rows.map((r) => r.id).sort(), [first.id, a.id, b.id].sort(), 'exactly the three good rows');
});

t.test('past a megabyte of WAL, a worker thread checkpoints it and the data stays whole', async (t) => {
  const path = tempLedger(t);
  const ledger = new SqliteLedger({ path });
  t.equal(ledger.checkpointStats()?.running, false, 'no worker for a ledger that has written little');
  const ids: string[] = [];
  for (let batch = 0; batch < 80; batch++) {
    const rs = Array.from({ length: 8 }, (_, i) => reservation({ conversation: `conv-${batch}-${i}`, run: `run-${batch}-${i}`, worstCaseUsd: 0.001 }));
    await Promise.all(rs.map((r) => ledger.admit(r)));
    await Promise.all(rs.map((r) => ledger.settle(r.id, settlement(r, 10))));
    ids.push(...rs.map((r) => r.id));
    if ((ledger.checkpointStats()?.checkpoints ?? 0) > 0) break;
    if (ledger.checkpointStats()?.running) await sleep(5);
  }
  for (let i = 0; i < 200 && (ledger.checkpointStats()?.checkpoints ?? 0) === 0; i++) await sleep(10);
  const stats = ledger.checkpointStats()!;
  t.equal(stats.failed, null);
  t.ok(stats.checkpoints >= 1, `${stats.checkpoints} checkpoints by the worker`);
  t.ok(stats.framesCheckpointed > 0, `${stats.framesCheckpointed} WAL frames copied into the database`);
  await ledger.close();
  t.equal(ledger.checkpointStats()?.running, false, 'the worker stops with the ledger');

  const again = new SqliteLedger({ path });
  t.teardown(() => again.close());
  const rows = await collect(again.exportRows(null, null));
  t.equal(rows.length, ids.length, 'every row is there after reopening');
  t.ok(rows.every((r) => r.state === 'settled'));
});

t.test('a checkpoint worker that fails hands checkpointing back to the connection', async (t) => {
  const settings: number[] = [];
  const events: CheckpointEvent[] = [];
  const cp = new WalCheckpointer(join(tmpdir(), 'no-such-dir-tollgate', 'ledger.db'), 'NORMAL', (p) => settings.push(p), 0, undefined, (e) => events.push(e));
  t.teardown(() => cp.close());
  for (let i = 0; i < 64; i++) cp.afterCommit();
  for (let i = 0; i < 300 && cp.stats().failed === null; i++) await sleep(10);
  t.match(cp.stats().failed, /./, `failed: ${cp.stats().failed}`);
  t.same(settings, [FALLBACK_AUTOCHECKPOINT_PAGES, DEFAULT_AUTOCHECKPOINT_PAGES], 'raised while it ran, restored when it failed');
  t.equal(cp.stats().running, false);
  t.match(events, [{ event: 'worker-failed', reason: /./, retryInMs: 30_000 }], 'said once, for the log');
});

t.test('checkpoints that fail are said once when they start failing and once when they succeed again', async (t) => {
  const events: CheckpointEvent[] = [];
  const cp = new WalCheckpointer(join(tmpdir(), 'unused-ledger.db'), 'NORMAL', () => {}, 0, undefined, (e) => events.push(e));
  t.teardown(() => cp.close());
  cp.replied({ ok: true, busy: 0, log: 10, checkpointed: 10 });
  t.same(events, [], 'nothing to say while checkpoints succeed');
  cp.replied({ ok: false, error: 'database or disk is full' });
  cp.replied({ ok: false, error: 'database or disk is full' });
  t.same(events, [{ event: 'checkpoint-failed', reason: 'database or disk is full' }], 'the first failure is said; the next ones are not');
  t.equal(cp.stats().lastError, 'database or disk is full');
  cp.replied({ ok: true, busy: 0, log: 10, checkpointed: 10 });
  cp.replied({ ok: true, busy: 0, log: 10, checkpointed: 10 });
  t.same(events, [{ event: 'checkpoint-failed', reason: 'database or disk is full' }, { event: 'checkpoint-recovered' }]);
});

t.test('a checkpoint worker that failed is replaced once its cause has gone', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-cp-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'later', 'ledger.db');
  const settings: number[] = [];
  const cp = new WalCheckpointer(path, 'NORMAL', (p) => settings.push(p), 0, 50);
  t.teardown(() => cp.close());
  for (let i = 0; i < 32; i++) cp.afterCommit();
  for (let i = 0; i < 300 && cp.stats().failed === null; i++) await sleep(10);
  t.match(cp.stats().failed, /./, 'the first worker failed: its folder is not there');
  // The cause goes: the folder and a ledger in WAL mode appear.
  mkdirSync(join(dir, 'later'));
  const db = new Database(path);
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE t (x); INSERT INTO t VALUES (1)');
  t.teardown(() => db.close());
  await sleep(60);
  for (let i = 0; i < 300 && cp.stats().checkpoints === 0; i++) {
    cp.afterCommit();
    await sleep(10);
  }
  t.match(cp.stats(), { failed: null, running: true, restarts: 1 }, 'a new worker runs');
  t.ok(cp.stats().checkpoints >= 1, 'and checkpoints');
  t.same(settings, [FALLBACK_AUTOCHECKPOINT_PAGES, DEFAULT_AUTOCHECKPOINT_PAGES, FALLBACK_AUTOCHECKPOINT_PAGES], 'the connection’s own threshold raised again');
});

t.test('the worker goes on checkpointing after the wall clock is stepped back an hour (regression)', async (t) => {
  const wall = steppableWallClock(t);
  const path = tempLedger(t);
  const db = new Database(path);
  t.teardown(() => db.close());
  db.pragma('journal_mode = WAL');
  db.exec('CREATE TABLE t (x)');
  const cp = new WalCheckpointer(path, 'NORMAL', () => {}, 0);
  t.teardown(() => cp.close());
  const write = () => {
    db.exec('INSERT INTO t VALUES (1)');
    cp.afterCommit();
  };
  // 1. Commits until the worker has checkpointed once.
  for (let i = 0; i < 300 && cp.stats().checkpoints === 0; i++) {
    write();
    await sleep(10);
  }
  const before = cp.stats().checkpoints;
  t.ok(before >= 1, 'checkpointed');
  // 2. NTP steps the wall clock back an hour; commits go on for longer than a checkpoint's interval.
  wall.step(-HOUR_MS);
  for (let i = 0; i < 300 && cp.stats().checkpoints === before; i++) {
    write();
    await sleep(10);
  }
  t.ok(cp.stats().checkpoints > before, 'checkpointed again, not an hour later (the -wal file grew meanwhile)');
});

t.test("a head's chain is stored back to back when its hashes share a width, and read back either way", async (t) => {
  const { encodeChain, decodeChain } = await import('../../metering/stores/sqlite-store.js');
  const gateway = ['AAAAAAAAAAAAAAAAAAAAAA', 'b-_b-_b-_b-_b-_b-_b-_b', 'c:cccccccccccccccccccc'];
  t.equal(encodeChain(gateway), `22:${gateway.join('')}`);
  for (const chain of [gateway, ['h1'], ['a1', 'a22', 'x'], [], ['[odd', 'ones']]) {
    t.same(decodeChain(encodeChain(chain)), chain, JSON.stringify(chain));
  }
  t.same(decodeChain('["legacy","json"]'), ['legacy', 'json'], 'heads written before stay readable');
});

t.test('a head kept in memory is used only while the row still ends on it; another writer wins', async (t) => {
  const path = tempLedger(t);
  const a = new SqliteLedger({ path });
  const b = new SqliteLedger({ path });
  t.teardown(async () => {
    await a.close();
    await b.close();
  });
  // A llama.cpp head carries digests of its counts' token ids; others have none.
  const head = (chain: string[], time: number, model = 'gpt-4o') => ({
    conversation: 'c', keyId: 'key-1', tenant: 'acme', model, toolHash: '', serverId: 'server-a', chain, prefix: chain.map((_, i) => i * 10).concat(chain.length * 10),
    prefixDigests: model === 'gpt-4o' ? null : [0, ...chain].map((h) => `digest-${h}-000000`.slice(0, 16)), lastCostUsd: null, lastPromptTokens: 10, lastOutputTokens: 5, time,
  });
  await a.putHead(head(['aaaa', 'bbbb'], 1000));
  t.same(await a.getHead('c'), head(['aaaa', 'bbbb'], 1000), 'its own write');
  // Another process on the same file moves the conversation on.
  await b.putHead(head(['aaaa', 'bbbb', 'cccc'], 2000, 'gpt-4o-mini'));
  t.same(await a.getHead('c'), head(['aaaa', 'bbbb', 'cccc'], 2000, 'gpt-4o-mini'), "the other writer's head, chain and digests and all");
  t.same(await a.getHead('c'), head(['aaaa', 'bbbb', 'cccc'], 2000, 'gpt-4o-mini'), 'and again, from the head kept in memory');
  await b.putHead(head(['aaaa', 'dddd'], 2000));
  t.same(await a.getHead('c'), head(['aaaa', 'dddd'], 2000), 'same time, another last hash: read again');
  await b.putHead({ ...head(['aaaa', 'dddd'], 2000), lastCostUsd: 0.25 });
  t.equal((await a.getHead('c'))?.lastCostUsd, 0.25, 'the short columns are always read fresh');
  await b.putHead({ ...head(['aaaa', 'dddd'], 2000), serverId: 'server-b' });
  t.equal((await a.getHead('c'))?.serverId, 'server-b', 'the server among them: a head kept in memory never stands for another server');
  t.equal(await a.getHead('nope'), null);
});

// Regression: every export page entered the time index at `since` and walked again over all the
// rows before its cursor — a 1.5 M-row export took 453 s, its last pages 300 ms each on the event loop.
t.test('an export page enters the time index at its cursor, not at the start of the window', async (t) => {
  const path = tempLedger(t);
  const ledger = new SqliteLedger({ path });
  t.teardown(() => ledger.close());
  const ids: string[] = [];
  for (let i = 0; i < 1_100; i++) {
    const r = reservation({ time: Date.UTC(2026, 0, 1) + i * 1000, conversation: `conv-${i}`, run: `run-${i}` });
    if ((await ledger.admit(r)).ok) ids.push(r.id);
  }
  t.equal(ids.length, 1_100, 'every reservation admitted');
  const q = (ledger as unknown as { q: { exportPage: { all: (p: { since: number; t: number }) => unknown[] } } }).q;
  const all = q.exportPage.all.bind(q.exportPage);
  const pages: Array<{ since: number; t: number }> = [];
  q.exportPage.all = (p) => {
    pages.push({ since: p.since, t: p.t });
    return all(p);
  };
  const rows = await collect(ledger.exportRows(null, null));
  t.same(rows.map((r) => r.id), ids, 'every row once, in time order');
  t.equal(pages.length, 3);
  for (const p of pages.slice(1)) t.equal(p.since, p.t, 'a later page starts its index range at its cursor');
  const windowed = await collect(ledger.exportRows(Date.UTC(2026, 0, 1) + 700_000, null));
  t.equal(windowed.length, 400, 'a window still starts at its own time');
});
