// Versioned schema of the SQLite ledger. Each migration runs in its own BEGIN IMMEDIATE
// transaction and re-reads the version inside it, so two processes opening one file at once
// apply each step exactly once. Append new steps; never edit a released one.
import type Database from 'better-sqlite3';
import { LedgerSchemaTooNewError } from './schema-too-new.js';

export interface Migration {
  version: number;
  sql: string;
}

export const SQLITE_MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    sql: `
CREATE TABLE tenants (
  id TEXT PRIMARY KEY,
  monthly_budget_usd REAL
);
CREATE TABLE api_keys (
  id TEXT PRIMARY KEY,
  tenant TEXT NOT NULL,
  name TEXT,
  hash TEXT NOT NULL UNIQUE
);
-- Counters, not sums over ledger_rows: admission reads a handful of rows whatever the history.
CREATE TABLE conversations (
  id TEXT PRIMARY KEY,
  tenant TEXT,
  parent TEXT,
  cap_usd REAL,
  spent_usd REAL NOT NULL DEFAULT 0,
  saved_usd REAL NOT NULL DEFAULT 0,
  plan_turns INTEGER NOT NULL DEFAULT 0,
  plan_work_usd REAL NOT NULL DEFAULT 0,
  tasks_usd REAL NOT NULL DEFAULT 0,
  turns INTEGER NOT NULL DEFAULT 0,
  reserved_usd REAL NOT NULL DEFAULT 0
);
CREATE TABLE conversation_models (
  conversation TEXT NOT NULL,
  model TEXT NOT NULL,
  turns INTEGER NOT NULL DEFAULT 0,
  spent_usd REAL NOT NULL DEFAULT 0,
  PRIMARY KEY (conversation, model)
);
CREATE TABLE runs (
  id TEXT PRIMARY KEY,
  conversation TEXT NOT NULL,
  started_at INTEGER NOT NULL,
  budget_tokens INTEGER,
  used_tokens INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE tenant_months (
  tenant TEXT NOT NULL,
  month TEXT NOT NULL,
  spent_usd REAL NOT NULL DEFAULT 0,
  reserved_usd REAL NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, month)
);
CREATE TABLE budget_notices (
  tenant TEXT NOT NULL,
  month TEXT NOT NULL,
  PRIMARY KEY (tenant, month)
);
CREATE TABLE heads (
  conversation TEXT PRIMARY KEY,
  key_id TEXT,
  tenant TEXT NOT NULL,
  model TEXT NOT NULL,
  tool_hash TEXT NOT NULL,
  chain TEXT NOT NULL,
  prefix TEXT NOT NULL,
  last_hash TEXT NOT NULL,
  last_cost_usd REAL,
  last_prompt_tokens INTEGER NOT NULL,
  last_output_tokens INTEGER NOT NULL,
  time INTEGER NOT NULL
);
-- Conversation inference looks a head up by its last chain hash: indexed, never scanned.
CREATE INDEX heads_by_key ON heads (key_id, last_hash, time);
CREATE INDEX heads_by_tenant ON heads (tenant, last_hash, time);
CREATE TABLE ledger_rows (
  id TEXT PRIMARY KEY,
  time INTEGER NOT NULL,
  month TEXT NOT NULL,
  tenant TEXT NOT NULL,
  key_id TEXT,
  conversation TEXT NOT NULL,
  parent TEXT,
  run TEXT NOT NULL,
  model TEXT NOT NULL,
  upstream TEXT NOT NULL,
  endpoint TEXT NOT NULL,
  mode TEXT NOT NULL,
  final_reason TEXT,
  status INTEGER,
  state TEXT NOT NULL,
  row_count INTEGER NOT NULL,
  prompt_tokens INTEGER NOT NULL,
  count_method TEXT NOT NULL,
  shared_prefix_tokens INTEGER NOT NULL,
  prompt_charge INTEGER NOT NULL,
  allowance INTEGER NOT NULL,
  reserved_tokens INTEGER NOT NULL,
  generated_tokens INTEGER,
  output_method TEXT,
  charge_tokens INTEGER,
  refund_tokens INTEGER,
  worst_case_usd REAL,
  cost_usd REAL,
  saved_usd REAL,
  plan_work_usd REAL,
  billing TEXT,
  upstream_prompt_tokens INTEGER,
  upstream_completion_tokens INTEGER,
  upstream_cached_tokens INTEGER,
  upstream_prompt_n INTEGER,
  upstream_cache_n INTEGER,
  fallback INTEGER NOT NULL DEFAULT 0,
  finished_at INTEGER
);
CREATE INDEX ledger_rows_by_time ON ledger_rows (time, id);
-- Recovery only ever looks for open reservations; a partial index stays tiny.
CREATE INDEX ledger_rows_open ON ledger_rows (time) WHERE state = 'reserved';
`,
  },
  {
    version: 2,
    // When a process last said an open reservation is still in flight (ms; ADR 0011).
    sql: `ALTER TABLE ledger_rows ADD COLUMN alive_at INTEGER;`,
  },
  {
    version: 3,
    // Both look-ups name the tenant, and SQLite answers both from heads_by_tenant (a key belongs
    // to one tenant; its filter is checked on the few rows found). heads_by_key was never read,
    // and every head written changed one of its pages at random: a third of the pages a group
    // commit wrote (bench/RESULTS.md).
    sql: `DROP INDEX IF EXISTS heads_by_key;`,
  },
  {
    version: 4,
    // The conversations above a reservation's parent it was drawn on, so settlement releases
    // exactly those (JSON array; ADR 0018). Rows written before have none: they drew on the parent.
    sql: `ALTER TABLE ledger_rows ADD COLUMN grandparents TEXT;`,
  },
  {
    version: 5,
    // The server that read a head's prefix (its kind and base URL, digested; ADR 0004): another
    // server shares none of it. Heads written before have none, and count as the same server.
    sql: `ALTER TABLE heads ADD COLUMN server_id TEXT;`,
  },
  {
    version: 6,
    // Digests of the token ids behind each prefix count (llama.cpp; ADR 0004): a rendering that
    // changed at the same count shares nothing from there. Heads written before have none.
    sql: `ALTER TABLE heads ADD COLUMN prefix_digests TEXT;`,
  },
  {
    version: 7,
    // Where a settled row's cost came from, and the price it used with its date (SPEC §7: every
    // price carries its source and date). Rows settled before have none.
    sql: `ALTER TABLE ledger_rows ADD COLUMN cost_source TEXT;
ALTER TABLE ledger_rows ADD COLUMN price_source TEXT;
ALTER TABLE ledger_rows ADD COLUMN price_date TEXT;`,
  },
  {
    version: 8,
    // The export by settlement time (`GET /admin/ledger?by=settled`): settled rows in the order
    // they were settled. Open rows have no finished_at and are not in it.
    sql: `CREATE INDEX ledger_rows_by_finished ON ledger_rows (finished_at, id) WHERE finished_at IS NOT NULL;`,
  },
  {
    version: 9,
    // Where each request's message list ended, per key: the most recent request whose list leads
    // a new one's is the conversation it joins (SPEC §8), not only each conversation's latest
    // (ADR 0007). Filled from the heads; the heads' own look-up index is no longer read.
    sql: `CREATE TABLE chain_ends (
  tenant TEXT NOT NULL,
  last_hash TEXT NOT NULL,
  key_id TEXT NOT NULL,
  conversation TEXT NOT NULL,
  time INTEGER NOT NULL,
  PRIMARY KEY (tenant, last_hash, key_id)
) WITHOUT ROWID;
INSERT INTO chain_ends (tenant, last_hash, key_id, conversation, time)
  SELECT tenant, last_hash, COALESCE(key_id, ''), conversation, time FROM heads WHERE last_hash <> '' ORDER BY time
  ON CONFLICT (tenant, last_hash, key_id) DO UPDATE SET conversation = excluded.conversation, time = excluded.time
  WHERE excluded.time >= chain_ends.time;
DROP INDEX IF EXISTS heads_by_tenant;`,
  },
  {
    version: 10,
    // The room past a conversation's own cap that a 402 there offered with a metered model at a
    // third of the refused one's price (ADR 0006): the dearest price such a model may have. Set
    // only by a refusal that offered it; cleared when an operator sets the cap again.
    sql: `ALTER TABLE conversations ADD COLUMN room_ceiling_mtok REAL;`,
  },
  {
    version: 11,
    // How many turns had a cost no one knows (a metered model without a price, allowed while no
    // money limit applies; ADR 0006): spent_usd sums the known costs only, and these say how many
    // it left out — the conversation's own turns, each model's, those of the conversations below
    // (beside tasks_usd), and the tenant's month. Counters kept by settlement, as spent_usd is.
    // A ledger from before starts them at 0: its turns of unknown cost were not counted.
    sql: `ALTER TABLE conversations ADD COLUMN unpriced_turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversations ADD COLUMN tasks_unpriced_turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE conversation_models ADD COLUMN unpriced_turns INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tenant_months ADD COLUMN unpriced_turns INTEGER NOT NULL DEFAULT 0;`,
  },
];

/** Apply every pending migration; returns the schema version afterwards. */
export function migrateSqlite(db: Database.Database): number {
  db.exec(`CREATE TABLE IF NOT EXISTS schema_version (
    version INTEGER PRIMARY KEY,
    applied_at INTEGER NOT NULL
  )`);
  const current = db.prepare('SELECT COALESCE(MAX(version), 0) AS v FROM schema_version');
  const record = db.prepare('INSERT INTO schema_version (version, applied_at) VALUES (?, ?)');
  const known = SQLITE_MIGRATIONS[SQLITE_MIGRATIONS.length - 1]!.version;
  const found = (current.get() as { v: number }).v;
  if (found > known) throw new LedgerSchemaTooNewError('SQLite', found, known);
  for (const m of SQLITE_MIGRATIONS) {
    const apply = db.transaction(() => {
      // Re-read under the write lock: another process may have applied it meanwhile.
      const { v } = current.get() as { v: number };
      if (v >= m.version) return;
      db.exec(m.sql);
      record.run(m.version, Date.now());
    });
    apply.immediate();
  }
  return (current.get() as { v: number }).v;
}
