// Tenants, hashed keys, conversation heads (inference by prefix chain), the ledger export, and
// migrations, on every store.
import t, { type Test } from 'tap';
import { createHash, randomUUID } from 'node:crypto';
import { chmodSync, mkdtempSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import Database from 'better-sqlite3';
import pg from 'pg';
import type { Ledger, Reservation } from '../../metering/ledger.js';
import { PostgresLedger } from '../../metering/stores/postgres-store.js';
import { SQLITE_MIGRATIONS, migrateSqlite } from '../../metering/stores/migrations-sqlite.js';
import { POSTGRES_MIGRATIONS } from '../../metering/stores/migrations-postgres.js';
import { reservationColumns } from '../../metering/stores/ledger-row.js';
import { openStore } from '../../metering/stores/open-store.js';
import { prepareSqlite } from '../../metering/stores/sqlite-statements.js';
import { collect, conversationHead as head, reservation, settlement, storeFactories } from '../helpers/stores.js';

const sha256 = (s: string) => createHash('sha256').update(s).digest('hex');

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a store says whether it made a new ledger, and where it is (no credentials)`, async (t) => {
    const { ledger, reopen, sqlitePath } = await factory.create(t);
    t.equal(ledger.createdNow, true, 'the first open made it');
    const again = await reopen();
    t.equal(again.createdNow, false, 'the next open found it');
    if (sqlitePath) t.equal(again.location, sqlitePath);
    else {
      t.match(again.location, /^127\.0\.0\.1:\d+\/\w+, schema tg_test_\w+$/);
      t.notMatch(again.location, /tollgate:tollgate|@/, 'no user or password');
    }
  });

  t.test(`${factory.kind}: API-made keys are known to exist until the last is deleted`, async (t) => {
    const { ledger } = await factory.create(t);
    t.equal(await ledger.hasKeys(), false);
    await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: null });
    await ledger.createKey({ id: 'k1', tenant: 'acme', name: null, hash: sha256('tg-one') });
    t.equal(await ledger.hasKeys(), true);
    await ledger.deleteKey('k1');
    t.equal(await ledger.hasKeys(), false);
  });

  t.test(`${factory.kind}: tenants and keys (stored as hashes only)`, async (t) => {
    const { ledger } = await factory.create(t);
    t.equal(await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 50 }), true, 'made');
    t.same(await ledger.getTenant('acme'), { id: 'acme', monthlyBudgetUsd: 50 });
    t.equal(await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: null }), false, 'exists');
    t.same(await ledger.getTenant('acme'), { id: 'acme', monthlyBudgetUsd: 50 }, 'making it again keeps its budget');
    t.equal(await ledger.setTenantBudget('acme', null), true);
    t.same(await ledger.getTenant('acme'), { id: 'acme', monthlyBudgetUsd: null }, 'the budget is set on its own');
    t.equal(await ledger.getTenant('nobody'), null);

    await ledger.createKey({ id: 'k1', tenant: 'acme', name: 'laptop', hash: sha256('tg-secret-1') });
    await ledger.createKey({ id: 'k2', tenant: 'acme', name: null, hash: sha256('tg-secret-2') });
    t.same(await ledger.findKeyByHash(sha256('tg-secret-1')), { id: 'k1', tenant: 'acme', name: 'laptop' });
    t.same(await ledger.findKeyByHash(sha256('tg-secret-2')), { id: 'k2', tenant: 'acme', name: null });
    t.equal(await ledger.findKeyByHash('tg-secret-1'), null, 'the plain key is not what is stored');
    await t.rejects(ledger.createKey({ id: 'k3', tenant: 'acme', name: null, hash: sha256('tg-secret-1') }), 'hashes are unique');
    t.equal(await ledger.deleteKey('k1'), true);
    t.equal(await ledger.deleteKey('k1'), false);
    t.equal(await ledger.findKeyByHash(sha256('tg-secret-1')), null, 'a deleted key no longer authenticates');
  });

  t.test(`${factory.kind}: heads and conversation inference by prefix chain`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.putHead(head({ conversation: 'c-old', chain: ['a1', 'a2'], time: 1000 }));
    await ledger.putHead(head({ conversation: 'c-new', chain: ['a1', 'a2'], time: 2000 }));
    await ledger.putHead(head({ conversation: 'c-other-key', keyId: 'key-2', chain: ['a1', 'a2', 'a3'], time: 3000 }));
    await ledger.putHead(head({ conversation: 'c-b', chain: ['b1'], prefix: [7, 19], lastCostUsd: 0.01, time: 1500 }));
    t.same(await ledger.getHead('c-b'), head({ conversation: 'c-b', chain: ['b1'], prefix: [7, 19], lastCostUsd: 0.01, time: 1500 }));
    t.equal(await ledger.getHead('missing'), null);
    // 1. A request resending a1,a2 + more: the most recent head of this key ending at a2.
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3', 'a4']), 'c-new');
    // 2. Only the LAST hash of a head counts: a head a1,a2 is not a prefix of a1 alone.
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1']), null);
    // 3. Another key's conversation is not inferred; with no key, the tenant's heads are searched.
    t.equal(await ledger.findConversationByChain('key-2', 'acme', ['a1', 'a2', 'a3', 'a4']), 'c-other-key');
    t.equal(await ledger.findConversationByChain(null, 'acme', ['a1', 'a2', 'a3']), 'c-other-key');
    t.equal(await ledger.findConversationByChain('key-1', 'other-tenant', ['a1', 'a2']), null);
    t.equal(await ledger.findConversationByChain('key-1', 'acme', []), null);
    // 4. A head moves on, and its earlier request still leads: the most recent request ending at a2
    // is c-new's, though c-new's head is now a1,a2,x3 (SPEC §8: a request, not a head).
    await ledger.putHead(head({ conversation: 'c-new', chain: ['a1', 'a2', 'x3'], time: 4000 }));
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3']), 'c-new');
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'x3', 'x4']), 'c-new');
    // A later request ending at a2 in another conversation takes the place over.
    await ledger.putHead(head({ conversation: 'c-old', chain: ['a1', 'a2'], time: 4500 }));
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3']), 'c-old');
    // An earlier write (a replica whose settlement came late) does not take it back.
    await ledger.putHead(head({ conversation: 'c-late', chain: ['a1', 'a2'], time: 4200 }));
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3']), 'c-old');
    // 5. The most recent head wins wherever in the chain it ends: a shorter list's head written
    // after a longer one's (SPEC §8).
    await ledger.putHead(head({ conversation: 'c-short', chain: ['a1'], time: 5000 }));
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'x3', 'x4']), 'c-short');
    t.equal(await ledger.findConversationByChain(null, 'acme', ['a1', 'a2', 'x3']), 'c-short');
  });

  t.test(`${factory.kind}: a head keeps the server that read it, and moves with it`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.putHead(head({ conversation: 'c-s', serverId: 'server-a' }));
    t.equal((await ledger.getHead('c-s'))?.serverId, 'server-a');
    await ledger.putHead(head({ conversation: 'c-s', chain: ['h1', 'h2'], prefix: [0, 10, 20], serverId: 'server-b', time: 2000 }));
    t.equal((await ledger.getHead('c-s'))?.serverId, 'server-b', 'the next turn on another server replaces it');
    await ledger.putHead(head({ conversation: 'c-s', serverId: null }));
    t.equal((await ledger.getHead('c-s'))?.serverId, null, 'none recorded reads as none, not as a server');
  });

  t.test(`${factory.kind}: a head keeps its token digests, and none reads as none`, async (t) => {
    const { ledger } = await factory.create(t);
    const digests = ['AAAAAAAAAAAAAAAA', 'bbbbbbbbbbbbbbbb', 'c-c_c-c_c-c_c-c_'];
    await ledger.putHead(head({ conversation: 'c-d', chain: ['h1', 'h2'], prefix: [0, 10, 20], prefixDigests: digests }));
    t.same((await ledger.getHead('c-d'))?.prefixDigests, digests);
    await ledger.putHead(head({ conversation: 'c-d', chain: ['h1', 'h2', 'h3'], prefix: [0, 10, 20, 30], prefixDigests: null, time: 2000 }));
    t.equal((await ledger.getHead('c-d'))?.prefixDigests, null, 'the next turn without digests (another counter) has none');
  });

  t.test(`${factory.kind}: export by time range, in time order, across pages`, async (t) => {
    const { ledger } = await factory.create(t);
    const base = Date.UTC(2025, 5, 1);
    // 1. 1,203 rows (more than two export pages), admitted out of time order.
    const times = Array.from({ length: 1203 }, (_, i) => base + ((i * 7919) % 1203) * 1000);
    for (const time of times) {
      const r = reservation({ time, run: 'export-run', runBudgetTokens: null });
      await ledger.admit(r);
      if (time % 2000 === 0) await ledger.settle(r.id, settlement(r, 1));
    }
    const all = await collect(ledger.exportRows(null, null));
    t.equal(all.length, 1203);
    t.ok(all.every((r, i) => i === 0 || r.time >= all[i - 1].time), 'time order');
    t.equal(all[0].time, new Date(base).toISOString(), 'ISO times');
    // 2. since inclusive, until exclusive.
    const slice = await collect(ledger.exportRows(base + 100_000, base + 700_000));
    t.equal(slice.length, 600);
    t.equal(slice[0].time, new Date(base + 100_000).toISOString());
    t.equal(slice[599].time, new Date(base + 699_000).toISOString());
    t.equal((await collect(ledger.exportRows(base + 5_000_000, null))).length, 0);
    t.ok(all.some((r) => r.state === 'settled') && all.some((r) => r.state === 'reserved'));
  });

  t.test(`${factory.kind}: migrations are idempotent (opened twice, migrated again)`, async (t) => {
    const store = await factory.create(t);
    await store.ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 3 });
    const second = await store.reopen();
    await second.migrate();
    await store.ledger.migrate();
    t.same(await second.getTenant('acme'), { id: 'acme', monthlyBudgetUsd: 3 }, 'nothing was recreated');
    await second.ping();
    if (store.sqlitePath) {
      const db = new Database(store.sqlitePath, { readonly: true });
      t.teardown(() => db.close());
      t.same(db.prepare('SELECT version FROM schema_version ORDER BY version').all(), SQLITE_MIGRATIONS.map((m) => ({ version: m.version })), 'each migration applied once');
      t.equal(db.pragma('journal_mode', { simple: true }), 'wal');
    }
  });
}

t.test('sqlite: a ledger a newer Tollgate wrote is refused before anything is read or written (regression: an older binary ran on it)', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-newer-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'ledger.db');
  const known = SQLITE_MIGRATIONS[SQLITE_MIGRATIONS.length - 1]!.version;
  const first = await openStore({ kind: 'sqlite', path });
  await first.createTenant({ id: 'acme', monthlyBudgetUsd: 3 });
  await first.close();
  const db = new Database(path);
  db.prepare('INSERT INTO schema_version (version, applied_at) VALUES (?, ?)').run(known + 1, Date.now());
  db.close();
  await t.rejects(openStore({ kind: 'sqlite', path }), {
    name: 'LedgerSchemaTooNewError',
    message: `the SQLite ledger is at schema version ${known + 1}, newer than this Tollgate knows (${known}): a newer Tollgate wrote it; run that version, or restore a backup taken before the upgrade`,
  });
  const after = new Database(path, { readonly: true });
  t.teardown(() => after.close());
  t.equal(after.prepare('SELECT MAX(version) FROM schema_version').pluck().get(), known + 1, 'left as it was');
});

t.test('sqlite: a new ledger file, and its WAL, are readable by their owner alone; an existing file keeps its mode', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-mode-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'ledger.db');
  const ledger = await openStore({ kind: 'sqlite', path });
  await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 3 });
  const mode = (p: string) => statSync(p).mode & 0o777;
  t.equal(mode(path), 0o600, 'key hashes and spend: owner only');
  t.equal(mode(`${path}-wal`), 0o600, 'the WAL takes the file\'s mode');
  await ledger.close();
  // A file the operator made (or opened to a group) is left as it is.
  const theirs = join(dir, 'theirs.db');
  writeFileSync(theirs, '');
  chmodSync(theirs, 0o640);
  const again = await openStore({ kind: 'sqlite', path: theirs });
  await again.close();
  t.equal(mode(theirs), 0o640);
});

t.test('sqlite: the conversation look-ups are answered from the chain ends\' key, and heads carry no index', async (t) => {
  const db = new Database(':memory:');
  t.teardown(() => db.close());
  migrateSqlite(db);
  const q = prepareSqlite(db);
  const plan = (sql: string, args: Record<string, unknown>) =>
    (db.prepare(`EXPLAIN QUERY PLAN ${sql}`).all(args) as { detail: string }[]).map((r) => r.detail).join(' | ');
  t.match(plan(q.findByKeyChain.source, { key: 'k', tenant: 't', hashes: '["a"]' }), /SEARCH chain_ends USING PRIMARY KEY \(tenant=\? AND last_hash=\? AND key_id=\?\)/);
  t.match(plan(q.findByTenantChain.source, { tenant: 't', hashes: '["a"]' }), /SEARCH chain_ends USING PRIMARY KEY \(tenant=\? AND last_hash=\?\)/);
  // Every index is written on every head written: one the look-ups never read is pure cost.
  const indexes = db.prepare("SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = 'heads' AND sql IS NOT NULL ORDER BY name").pluck().all();
  t.same(indexes, []);
});

const pgUrl = process.env.TOLLGATE_TEST_PG_URL;
if (pgUrl) {
  t.test('postgres: replicas migrating at once are serialised by the advisory lock', async (t) => {
    const schema = `tg_test_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
    const replicas = [0, 1, 2, 3].map(() => new PostgresLedger({ url: pgUrl, schema }));
    t.teardown(async () => {
      for (const r of replicas) await r.close();
      const admin = new pg.Client({ connectionString: pgUrl });
      await admin.connect();
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    await Promise.all(replicas.map((r) => r.migrate()));
    const admin = new pg.Client({ connectionString: pgUrl });
    await admin.connect();
    const { rows } = await admin.query(`SELECT version FROM ${schema}.schema_version ORDER BY version`);
    await admin.end();
    t.same(rows, POSTGRES_MIGRATIONS.map((m) => ({ version: m.version })), 'each migration applied once');
    t.same(await replicas[3].admit(reservation({ run: 'after-migrate' })), { ok: true });
  });
  t.test('postgres: a schema a newer Tollgate wrote is refused', async (t) => {
    const schema = `tg_test_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
    const known = POSTGRES_MIGRATIONS[POSTGRES_MIGRATIONS.length - 1]!.version;
    const admin = new pg.Client({ connectionString: pgUrl });
    await admin.connect();
    t.teardown(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    const first = new PostgresLedger({ url: pgUrl, schema });
    await first.migrate();
    await first.close();
    await admin.query(`INSERT INTO ${schema}.schema_version (version, applied_at) VALUES ($1, $2)`, [known + 1, Date.now()]);
    const newer = new PostgresLedger({ url: pgUrl, schema });
    t.teardown(() => newer.close());
    await t.rejects(newer.migrate(), { name: 'LedgerSchemaTooNewError', message: new RegExp(`^the PostgreSQL ledger is at schema version ${known + 1}, newer than this Tollgate knows \\(${known}\\)`) });
  });
  t.test('postgres: a schema name that is not a plain SQL name is refused', async (t) => {
    t.throws(() => new PostgresLedger({ url: pgUrl, schema: 'x; DROP TABLE y' }), /store\.schema/);
  });
}

/**
 * A child's turn still in flight in a ledger from before the conversations above a parent were
 * recorded (SQLite schema 3, PostgreSQL schema 2): its row, its conversation and its parent.
 */
function inFlightBeforeUpgrade(r: Reservation) {
  const { grandparents: _, ...row } = reservationColumns(r, [r.parent!]);
  const columns = Object.keys(row);
  return {
    conversations: `INSERT INTO conversations (id, tenant, parent, cap_usd, reserved_usd)
      VALUES ('${r.conversation}', 'acme', '${r.parent}', NULL, ${r.worstCaseUsd}), ('${r.parent}', 'acme', NULL, 1, ${r.worstCaseUsd})`,
    columns,
    values: columns.map((c) => row[c]!),
  };
}

/** After the upgrade the old row settles on its parent, and a grandchild counts at the top. */
async function settlesAfterUpgrade(t: Test, ledger: Ledger, r: Reservation) {
  await ledger.settle(r.id, settlement(r, 10, { costUsd: 0.2 }));
  t.match(await ledger.conversationSpend('top'), { reservedUsd: 0, tasksUsd: 0.2 });
  t.match(await ledger.conversationSpend('mid'), { reservedUsd: 0, spentUsd: 0.2 });
  const g = reservation({ conversation: 'low', parent: 'mid', run: 'low-run', worstCaseUsd: 0.9 });
  t.match(await ledger.admit(g), { ok: false, scope: 'parent', limitUsd: 1 }, "the top's cap holds two levels down");
  const fits = { ...g, worstCaseUsd: 0.1 };
  t.same(await ledger.admit(fits), { ok: true });
  await ledger.settle(fits.id, settlement(fits, 10, { costUsd: 0.1 }));
  t.ok(Math.abs((await ledger.conversationSpend('top'))!.tasksUsd - 0.3) < 1e-9);
}

/** An SQLite ledger as a build at schema `version` left it, seeded by `seed`, then opened by this one. */
async function olderSqlite(t: Test, version: number, seed: (db: Database.Database) => void): Promise<Ledger> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-upgrade-'));
  const path = join(dir, 'ledger.db');
  const old = new Database(path);
  old.exec('CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at INTEGER NOT NULL)');
  for (const m of SQLITE_MIGRATIONS.filter((m) => m.version <= version)) {
    old.exec(m.sql);
    old.prepare('INSERT INTO schema_version (version, applied_at) VALUES (?, 0)').run(m.version);
  }
  seed(old);
  old.close();
  const ledger = await openStore({ kind: 'sqlite', path });
  t.teardown(async () => {
    await ledger.close();
    rmSync(dir, { recursive: true, force: true });
  });
  return ledger;
}

/** The same on PostgreSQL, in a schema of its own (dropped at teardown). */
async function olderPostgres(t: Test, url: string, version: number, seed: (admin: pg.Client) => Promise<void>): Promise<Ledger> {
  const schema = `tg_test_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
  const admin = new pg.Client({ connectionString: url });
  await admin.connect();
  let ledger: Ledger | null = null;
  t.teardown(async () => {
    await ledger?.close();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  });
  await admin.query(`CREATE SCHEMA ${schema}`);
  await admin.query(`SET search_path TO ${schema}`);
  await admin.query('CREATE TABLE schema_version (version integer PRIMARY KEY, applied_at bigint NOT NULL)');
  for (const m of POSTGRES_MIGRATIONS.filter((m) => m.version <= version)) {
    await admin.query(m.sql);
    await admin.query('INSERT INTO schema_version (version, applied_at) VALUES ($1, 0)', [m.version]);
  }
  await seed(admin);
  ledger = await openStore({ kind: 'postgres', url, schema });
  return ledger;
}

t.test('sqlite: a ledger file from before grandparents were recorded upgrades, and its open rows settle', async (t) => {
  const r = reservation({ conversation: 'mid', parent: 'top', run: 'mid-run', worstCaseUsd: 0.5 });
  const ledger = await olderSqlite(t, 3, (old) => {
    const before = inFlightBeforeUpgrade(r);
    old.exec(before.conversations);
    old.prepare(`INSERT INTO ledger_rows (${before.columns.join(', ')}) VALUES (${before.columns.map(() => '?').join(', ')})`).run(...before.values);
  });
  await settlesAfterUpgrade(t, ledger, r);
});

if (pgUrl) {
  t.test('postgres: a ledger from before grandparents were recorded upgrades, and its open rows settle', async (t) => {
    const r = reservation({ conversation: 'mid', parent: 'top', run: 'mid-run', worstCaseUsd: 0.5 });
    const ledger = await olderPostgres(t, pgUrl, 2, async (admin) => {
      const before = inFlightBeforeUpgrade(r);
      await admin.query(before.conversations);
      await admin.query(`INSERT INTO ledger_rows (${before.columns.join(', ')}) VALUES (${before.columns.map((_, i) => `$${i + 1}`).join(', ')})`, before.values);
    });
    await settlesAfterUpgrade(t, ledger, r);
  });
}

/** A head as the builds before servers were recorded wrote it (SQLite schema 4, PostgreSQL 4). */
const OLD_HEAD = `INSERT INTO heads (conversation, key_id, tenant, model, tool_hash, chain, prefix, last_hash,
  last_cost_usd, last_prompt_tokens, last_output_tokens, time)
  VALUES ('c-old', 'key-1', 'acme', 'gpt-4o', '', '["h1","h2"]', '[0,10,20]', 'h2', NULL, 20, 5, 1000)`;

async function oldHeadReadable(t: Test, ledger: Ledger): Promise<void> {
  t.same(await ledger.getHead('c-old'), head({ conversation: 'c-old', serverId: null, chain: ['h1', 'h2'], prefix: [0, 10, 20], prefixDigests: null, lastPromptTokens: 20 }));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['h1', 'h2', 'h3']), 'c-old', 'and is still found');
}

t.test('sqlite: heads written before servers were recorded upgrade to none recorded', async (t) => {
  await oldHeadReadable(t, await olderSqlite(t, 4, (old) => old.exec(OLD_HEAD)));
});

if (pgUrl) {
  t.test('postgres: heads written before servers were recorded upgrade to none recorded', async (t) => {
    await oldHeadReadable(t, await olderPostgres(t, pgUrl, 4, async (admin) => void (await admin.query(OLD_HEAD))));
  });
}

// Migration 9 fills the chain ends from the heads: two heads of one key that end at the same hash
// are one chain end, the more recent head's.
const TWO_HEADS_ONE_END = `INSERT INTO heads (conversation, key_id, tenant, model, tool_hash, chain, prefix, last_hash,
    last_cost_usd, last_prompt_tokens, last_output_tokens, time)
  VALUES ('c-early', 'key-1', 'acme', 'gpt-4o', '', '["h1","h2"]', '[0,10,20]', 'h2', NULL, 20, 5, 1000),
    ('c-late', 'key-1', 'acme', 'gpt-4o', '', '["h1","h2"]', '[0,10,20]', 'h2', NULL, 20, 5, 3000),
    ('c-mid', 'key-1', 'acme', 'gpt-4o', '', '["h1","h2"]', '[0,10,20]', 'h2', NULL, 20, 5, 2000)`;

t.test('sqlite: heads of one key ending at one hash upgrade to one chain end, the most recent', async (t) => {
  const ledger = await olderSqlite(t, 8, (old) => old.exec(TWO_HEADS_ONE_END));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['h1', 'h2', 'h3']), 'c-late');
});

if (pgUrl) {
  t.test('postgres: heads of one key ending at one hash upgrade to one chain end, the most recent', async (t) => {
    const ledger = await olderPostgres(t, pgUrl, 8, async (admin) => void (await admin.query(TWO_HEADS_ONE_END)));
    t.equal(await ledger.findConversationByChain('key-1', 'acme', ['h1', 'h2', 'h3']), 'c-late');
  });
}

// Migration 11 adds the counters of turns whose cost is unknown (ADR 0006). A ledger from before
// has spend and no such counters: it opens with them at 0 — its unpriced turns were added as $0
// and cannot be told apart now — and counts from there.
const SPEND_BEFORE_UNPRICED = [
  `INSERT INTO conversations (id, tenant, parent, spent_usd, turns) VALUES ('c-then', 'acme', 'p-then', 0.4, 2), ('p-then', 'acme', NULL, 0, 0)`,
  `UPDATE conversations SET tasks_usd = 0.4 WHERE id = 'p-then'`,
  `INSERT INTO conversation_models (conversation, model, turns, spent_usd) VALUES ('c-then', 'gpt-4o', 2, 0.4)`,
  `INSERT INTO tenant_months (tenant, month, spent_usd) VALUES ('acme', '2025-06', 0.4)`,
];

async function unpricedCountsFromZero(t: Test, ledger: Ledger): Promise<void> {
  const c = await ledger.conversationSpend('c-then');
  t.match(c, { spentUsd: 0.4, turns: 2, unpricedTurns: 0, tasksUnpricedTurns: 0 }, 'the spend is kept, no turn of unknown cost');
  t.same(c?.byModel, { 'gpt-4o': { turns: 2, spentUsd: 0.4, unpricedTurns: 0 } });
  t.match(await ledger.conversationSpend('p-then'), { tasksUsd: 0.4, unpricedTurns: 0, tasksUnpricedTurns: 0 });
  t.same(await ledger.tenantMonth('acme', '2025-06'), { spentUsd: 0.4, reservedUsd: 0, unpricedTurns: 0 });
  // A turn of unknown cost after the upgrade is counted from 0.
  const r = reservation({ conversation: 'c-then', parent: 'p-then', run: 'after-upgrade', model: 'gpt-unpriced-x' });
  t.same(await ledger.admit(r), { ok: true });
  await ledger.settle(r.id, settlement(r, 10, { costUsd: null }));
  t.match(await ledger.conversationSpend('c-then'), { unpricedTurns: 1, turns: 3 });
  t.match(await ledger.conversationSpend('p-then'), { tasksUnpricedTurns: 1 });
  t.equal((await ledger.tenantMonth('acme', '2025-06')).unpricedTurns, 1);
}

t.test('sqlite: a ledger from before turns of unknown cost were counted opens with them at 0', async (t) => {
  const ledger = await olderSqlite(t, 10, (old) => {
    for (const sql of SPEND_BEFORE_UNPRICED) old.exec(sql);
  });
  await unpricedCountsFromZero(t, ledger);
});

if (pgUrl) {
  t.test('postgres: a ledger from before turns of unknown cost were counted opens with them at 0', async (t) => {
    const ledger = await olderPostgres(t, pgUrl, 10, async (admin) => {
      for (const sql of SPEND_BEFORE_UNPRICED) await admin.query(sql);
    });
    await unpricedCountsFromZero(t, ledger);
  });
}
