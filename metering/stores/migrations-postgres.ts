// Versioned schema of the PostgreSQL ledger. Each migration runs in its own transaction that
// first takes a transaction-scoped advisory lock, so replicas starting at once queue up and the
// second finds the work done. Money is double precision, as in SQLite (ADR 0005).
import type { PoolClient } from 'pg';
import type { Migration } from './migrations-sqlite.js';
import { LedgerSchemaTooNewError } from './schema-too-new.js';

export const POSTGRES_MIGRATIONS: readonly Migration[] = [
  {
    version: 1,
    sql: `
CREATE TABLE tenants (
  id text PRIMARY KEY,
  monthly_budget_usd double precision
);
CREATE TABLE api_keys (
  id text PRIMARY KEY,
  tenant text NOT NULL,
  name text,
  hash text NOT NULL UNIQUE
);
CREATE TABLE conversations (
  id text PRIMARY KEY,
  tenant text,
  parent text,
  cap_usd double precision,
  spent_usd double precision NOT NULL DEFAULT 0,
  saved_usd double precision NOT NULL DEFAULT 0,
  plan_turns integer NOT NULL DEFAULT 0,
  plan_work_usd double precision NOT NULL DEFAULT 0,
  tasks_usd double precision NOT NULL DEFAULT 0,
  turns integer NOT NULL DEFAULT 0,
  reserved_usd double precision NOT NULL DEFAULT 0
);
CREATE TABLE conversation_models (
  conversation text NOT NULL,
  model text NOT NULL,
  turns integer NOT NULL DEFAULT 0,
  spent_usd double precision NOT NULL DEFAULT 0,
  PRIMARY KEY (conversation, model)
);
CREATE TABLE runs (
  id text PRIMARY KEY,
  conversation text NOT NULL,
  started_at bigint NOT NULL,
  budget_tokens bigint,
  used_tokens bigint NOT NULL DEFAULT 0
);
CREATE TABLE tenant_months (
  tenant text NOT NULL,
  month text NOT NULL,
  spent_usd double precision NOT NULL DEFAULT 0,
  reserved_usd double precision NOT NULL DEFAULT 0,
  PRIMARY KEY (tenant, month)
);
CREATE TABLE budget_notices (
  tenant text NOT NULL,
  month text NOT NULL,
  PRIMARY KEY (tenant, month)
);
CREATE TABLE heads (
  conversation text PRIMARY KEY,
  key_id text,
  tenant text NOT NULL,
  model text NOT NULL,
  tool_hash text NOT NULL,
  chain jsonb NOT NULL,
  prefix jsonb NOT NULL,
  last_hash text NOT NULL,
  last_cost_usd double precision,
  last_prompt_tokens integer NOT NULL,
  last_output_tokens integer NOT NULL,
  time bigint NOT NULL
);
CREATE INDEX heads_by_key ON heads (key_id, last_hash, time);
CREATE INDEX heads_by_tenant ON heads (tenant, last_hash, time);
CREATE TABLE ledger_rows (
  id text PRIMARY KEY,
  time bigint NOT NULL,
  month text NOT NULL,
  tenant text NOT NULL,
  key_id text,
  conversation text NOT NULL,
  parent text,
  run text NOT NULL,
  model text NOT NULL,
  upstream text NOT NULL,
  endpoint text NOT NULL,
  mode text NOT NULL,
  final_reason text,
  status integer,
  state text NOT NULL,
  row_count integer NOT NULL,
  prompt_tokens integer NOT NULL,
  count_method text NOT NULL,
  shared_prefix_tokens integer NOT NULL,
  prompt_charge integer NOT NULL,
  allowance integer NOT NULL,
  reserved_tokens integer NOT NULL,
  generated_tokens integer,
  output_method text,
  charge_tokens integer,
  refund_tokens integer,
  worst_case_usd double precision,
  cost_usd double precision,
  saved_usd double precision,
  plan_work_usd double precision,
  billing text,
  upstream_prompt_tokens integer,
  upstream_completion_tokens integer,
  upstream_cached_tokens integer,
  upstream_prompt_n integer,
  upstream_cache_n integer,
  fallback boolean NOT NULL DEFAULT false,
  finished_at bigint
);
CREATE INDEX ledger_rows_by_time ON ledger_rows (time, id);
CREATE INDEX ledger_rows_open ON ledger_rows (time) WHERE state = 'reserved';
`,
  },
  {
    version: 2,
    // When a replica last said an open reservation is still in flight (ms; ADR 0011).
    sql: `ALTER TABLE ledger_rows ADD COLUMN alive_at bigint;`,
  },
  {
    version: 3,
    // The conversations above a reservation's parent it was drawn on, so settlement releases
    // exactly those (a JSON array as text, as on SQLite; ADR 0018). Rows written before have none.
    sql: `ALTER TABLE ledger_rows ADD COLUMN grandparents text;`,
  },
  {
    version: 4,
    // Token counts as wide as SQLite's integers: an allowance is max_tokens × n × rows, and with
    // no context window to bound it (nor a run budget) a reservation can pass 2^31 — a 500 on
    // PostgreSQL where SQLite admitted it. The upstream's own figures likewise.
    sql: `ALTER TABLE ledger_rows
  ALTER COLUMN prompt_tokens TYPE bigint, ALTER COLUMN shared_prefix_tokens TYPE bigint,
  ALTER COLUMN prompt_charge TYPE bigint, ALTER COLUMN allowance TYPE bigint,
  ALTER COLUMN reserved_tokens TYPE bigint, ALTER COLUMN generated_tokens TYPE bigint,
  ALTER COLUMN charge_tokens TYPE bigint, ALTER COLUMN refund_tokens TYPE bigint,
  ALTER COLUMN upstream_prompt_tokens TYPE bigint, ALTER COLUMN upstream_completion_tokens TYPE bigint,
  ALTER COLUMN upstream_cached_tokens TYPE bigint, ALTER COLUMN upstream_prompt_n TYPE bigint,
  ALTER COLUMN upstream_cache_n TYPE bigint;
ALTER TABLE heads ALTER COLUMN last_prompt_tokens TYPE bigint, ALTER COLUMN last_output_tokens TYPE bigint;`,
  },
  {
    version: 5,
    // The server that read a head's prefix (its kind and base URL, digested; ADR 0004): another
    // server shares none of it. Heads written before have none, and count as the same server. A
    // nullable column without a default: no rewrite of the table, only a moment's lock.
    sql: `ALTER TABLE heads ADD COLUMN server_id text;`,
  },
  {
    version: 6,
    // Digests of the token ids behind each prefix count (llama.cpp; ADR 0004): a rendering that
    // changed at the same count shares nothing from there. Heads written before have none.
    sql: `ALTER TABLE heads ADD COLUMN prefix_digests jsonb;`,
  },
  {
    version: 7,
    // Where a settled row's cost came from, and the price it used with its date (SPEC §7: every
    // price carries its source and date). Rows settled before have none.
    sql: `ALTER TABLE ledger_rows ADD COLUMN cost_source text, ADD COLUMN price_source text, ADD COLUMN price_date text;`,
  },
  {
    version: 8,
    // The export by settlement time (`GET /admin/ledger?by=settled`): settled rows in the order
    // they were settled. Built while the migration holds its lock: writes wait for it once, at the
    // upgrade (seconds for millions of rows).
    sql: `CREATE INDEX ledger_rows_by_finished ON ledger_rows (finished_at, id) WHERE finished_at IS NOT NULL;`,
  },
  {
    version: 9,
    // Where each request's message list ended, per key: the most recent request whose list leads
    // a new one's is the conversation it joins (SPEC §8), not only each conversation's latest
    // (ADR 0007). Filled from the heads; the heads' own look-up indexes are no longer read.
    sql: `CREATE TABLE chain_ends (
  tenant text NOT NULL,
  last_hash text NOT NULL,
  key_id text NOT NULL,
  conversation text NOT NULL,
  time bigint NOT NULL,
  PRIMARY KEY (tenant, last_hash, key_id)
);
INSERT INTO chain_ends (tenant, last_hash, key_id, conversation, time)
  SELECT DISTINCT ON (tenant, last_hash, COALESCE(key_id, '')) tenant, last_hash, COALESCE(key_id, ''), conversation, time
  FROM heads WHERE last_hash <> '' ORDER BY tenant, last_hash, COALESCE(key_id, ''), time DESC;
DROP INDEX IF EXISTS heads_by_tenant;
DROP INDEX IF EXISTS heads_by_key;`,
  },
  {
    version: 10,
    // The room past a conversation's own cap that a 402 there offered (ADR 0006): see the SQLite
    // migration of the same number.
    sql: `ALTER TABLE conversations ADD COLUMN room_ceiling_mtok double precision;`,
  },
  {
    version: 11,
    // Turns whose cost is unknown (ADR 0006): see the SQLite migration of the same number. A
    // constant default is kept in the catalogue (PostgreSQL 11 and later): no rewrite of the tables.
    // A ledger from before starts them at 0.
    sql: `ALTER TABLE conversations ADD COLUMN unpriced_turns integer NOT NULL DEFAULT 0,
  ADD COLUMN tasks_unpriced_turns integer NOT NULL DEFAULT 0;
ALTER TABLE conversation_models ADD COLUMN unpriced_turns integer NOT NULL DEFAULT 0;
ALTER TABLE tenant_months ADD COLUMN unpriced_turns integer NOT NULL DEFAULT 0;`,
  },
];

/** Identifiers we put into SQL ourselves (a schema name from configuration): plain names only. */
export function assertSchemaName(schema: string): void {
  if (!/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) {
    throw new Error(`store.schema: must be a lower-case SQL name (letters, digits, _), got "${schema}"`);
  }
}

/** Apply pending migrations to `schema` (created if missing). */
export async function migratePostgres(client: PoolClient, schema: string): Promise<void> {
  assertSchemaName(schema);
  for (const m of POSTGRES_MIGRATIONS) {
    await client.query('BEGIN');
    try {
      // Per-schema lock so separate test schemas in one database do not wait on each other.
      await client.query('SELECT pg_advisory_xact_lock(hashtext($1))', [`tollgate.migrate.${schema}`]);
      await client.query(`CREATE SCHEMA IF NOT EXISTS ${schema}`);
      await client.query(`CREATE TABLE IF NOT EXISTS ${schema}.schema_version (
        version integer PRIMARY KEY, applied_at bigint NOT NULL)`);
      const { rows } = await client.query<{ v: number }>(
        `SELECT COALESCE(MAX(version), 0)::integer AS v FROM ${schema}.schema_version`,
      );
      const known = POSTGRES_MIGRATIONS[POSTGRES_MIGRATIONS.length - 1]!.version;
      if (rows[0].v > known) throw new LedgerSchemaTooNewError('PostgreSQL', rows[0].v, known);
      if (rows[0].v < m.version) {
        await client.query(`SET LOCAL search_path TO ${schema}`);
        await client.query(m.sql);
        await client.query(`INSERT INTO ${schema}.schema_version (version, applied_at) VALUES ($1, $2)`, [
          m.version,
          Date.now(),
        ]);
      }
      await client.query('COMMIT');
    } catch (err) {
      await client.query('ROLLBACK');
      throw err;
    }
  }
}
