// The PostgreSQL ledger: several gateway replicas sharing budgets (SPEC §9, ADR 0005). This file
// holds the pool, transactions with retry, and the plain records; the locking admission and
// settlement are in postgres-budget.ts.
import pg from 'pg';
import type {
  AdmitResult,
  ConversationHead,
  ConversationSpend,
  HistoryTable,
  KeyRecord,
  Ledger,
  LedgerRow,
  MonthAfterSettle,
  Reservation,
  RunState,
  Settlement,
  TenantMonthSpend,
  TenantRecord,
  ExportWindow,
} from '../ledger.js';
import { EXPORT_PAGE, fromSettlement, recoveredSettlement, toLedgerRow } from './ledger-row.js';
import { DB_NOW_MS, admitLocked, settleLocked } from './postgres-budget.js';
import { assertSchemaName, migratePostgres } from './migrations-postgres.js';

export interface PostgresLedgerOptions {
  url: string;
  /** Schema holding the tables (default `public`); tests use one per file. */
  schema?: string;
  /** Pool size per replica. */
  maxConnections?: number;
  /** The connections' `application_name` (default `tollgate`; tests tell theirs apart by it). */
  applicationName?: string;
}

type Client = pg.PoolClient;

const INT8_OID = 20;
// bigint columns hold ms timestamps and token counts, far below 2^53: read them as numbers.
// Set on this pool only, not globally, so other pg users in the process are unaffected.
const types = {
  getTypeParser: ((oid: number, format?: 'text' | 'binary') =>
    oid === INT8_OID && format !== 'binary' ? (v: string) => Number(v) : pg.types.getTypeParser(oid, format)) as
    pg.CustomTypesConfig['getTypeParser'],
};

/** Serialization failures and deadlocks are safe to retry: the transaction did nothing. */
const RETRYABLE = new Set(['40001', '40P01']);

function pgCode(err: unknown): string | undefined {
  if (typeof err === 'object' && err !== null && 'code' in err && typeof err.code === 'string') return err.code;
  return undefined;
}

/** A PostgreSQL URL's host, port and database, without user or password (for a log line). */
function serverOf(url: string): string {
  try {
    const u = new URL(url);
    return `${u.host}${u.pathname}`;
  } catch {
    return 'postgres';
  }
}

export class PostgresLedger implements Ledger {
  readonly kind = 'postgres' as const;
  private readonly pool: pg.Pool;
  private readonly schema: string;
  readonly location: string;
  createdNow = false;

  constructor(opts: PostgresLedgerOptions) {
    this.schema = opts.schema ?? 'public';
    assertSchemaName(this.schema);
    this.location = `${serverOf(opts.url)}, schema ${this.schema}`;
    this.pool = new pg.Pool({
      connectionString: opts.url,
      max: opts.maxConnections ?? 10,
      // Bounds on waiting, so a server that is away or a lock held elsewhere fails a request with an
      // error instead of holding it (and a connection) for ever: a new connection in 5 s, a lock in
      // 10 s (admissions of one tenant queue on its month's row, well under that), a statement in
      // 30 s, and a transaction left idle by a lost client is ended by the server after 60 s.
      connectionTimeoutMillis: 5_000,
      options: `-c search_path=${this.schema} -c lock_timeout=10s -c statement_timeout=30s -c idle_in_transaction_session_timeout=60s`,
      application_name: opts.applicationName ?? 'tollgate',
      types,
    });
    // A pooled connection the server ends (a restart, a failover, pg_terminate_backend) is dropped
    // by the pool, which then says so on this event: unheard, it would end the process.
    this.pool.on('error', (err) => {
      this.lastConnectionError = err.message;
    });
    // Every connection is listened to for as long as it lives, from the moment it is made. The pool
    // stops listening to one when it hands it out, and hands a released one to a waiting request
    // at once: a listener added only once that request's `await` resumes missed an error that came
    // in the same read (a server's FATAL right after the last answer), which then ended the process.
    this.pool.on('connect', (client) => {
      client.on('error', (err) => {
        this.broken.set(client, err);
        this.lastConnectionError = err.message;
      });
    });
  }

  /** The last error of a pooled connection the server closed while it sat idle (the pool replaced it). */
  lastConnectionError: string | null = null;

  /** Connections the server has ended or broken: destroyed when released, not handed out again. */
  private readonly broken = new WeakMap<object, Error>();

  /** A connection of the pool: one the server closes while it is out fails its query, not the process. */
  private async connect(): Promise<{ client: Client; done: () => void }> {
    const client = await this.pool.connect();
    return { client, done: () => client.release(this.broken.get(client)) };
  }

  async migrate(): Promise<void> {
    const { client, done } = await this.connect();
    try {
      const { rows } = await client.query<{ t: string | null }>('SELECT to_regclass($1)::text AS t', [`${this.schema}.schema_version`]);
      this.createdNow = rows[0]?.t === null;
      // A migration may rewrite a large table, and waits for another replica's: not bounded.
      await client.query('SET statement_timeout = 0; SET lock_timeout = 0');
      await migratePostgres(client, this.schema);
      await client.query('RESET statement_timeout; RESET lock_timeout');
    } finally {
      done();
    }
  }

  async ping(): Promise<void> {
    await this.pool.query('SELECT 1');
  }

  async close(): Promise<void> {
    // Idempotent, as SQLite's is: shutdown paths may close twice.
    if (this.pool.ending) return;
    await this.pool.end();
  }

  /** Runs `fn` in a transaction, committed when `keep` says so (by default always), else rolled back. */
  private async tx<T>(fn: (c: Client) => Promise<T>, keep: (out: T) => boolean = () => true): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      const { client: c, done } = await this.connect();
      try {
        await c.query('BEGIN');
        const out = await fn(c);
        await c.query(keep(out) ? 'COMMIT' : 'ROLLBACK');
        return out;
      } catch (err) {
        await c.query('ROLLBACK').catch(() => undefined);
        if (attempt >= 5 || !RETRYABLE.has(pgCode(err) ?? '')) throw err;
      } finally {
        done();
      }
    }
  }

  async admit(r: Reservation): Promise<AdmitResult> {
    // A refusal is rolled back: admission inserts the rows it locks (a new conversation, its
    // parent, the run, the month) before it can check, and a refusal must leave none of them
    // (SPEC §2.4) — a kept run would start its clock at the refusal. The same round trip as COMMIT.
    return this.tx((c) => admitLocked(c, r), (verdict) => verdict.ok);
  }

  async settle(id: string, s: Settlement, head?: ConversationHead): Promise<MonthAfterSettle | null> {
    return this.tx(async (c) => {
      const write = head ? () => upsertHead(c, head) : undefined;
      const settled = await settleLocked(c, id, (row) => fromSettlement(row, s), write);
      // A row already settled (recovered, say) still moves the conversation's head on, as on SQLite.
      if (!settled && write) await write();
      return settled;
    });
  }

  async recoverStale(olderThanMs: number, now: number): Promise<number> {
    // Judged on the database's clock, cutoff and `alive_at` alike, never on this replica's `now`
    // (ADR 0011). A row's `time` is the admitting replica's clock: it counts only for a row an
    // older build admitted without `alive_at` and no replica has said alive since.
    const { rows } = await this.pool.query<{ id: string }>(
      `SELECT id FROM ledger_rows WHERE state = 'reserved' AND COALESCE(alive_at, time) < ${DB_NOW_MS} - $1::bigint ORDER BY time`,
      [olderThanMs],
    );
    // The settlement's time is still this replica's: it is what the export shows, not a decision.
    return this.recoverRows(rows, now);
  }

  async recoverOpen(now: number): Promise<number> {
    const { rows } = await this.pool.query<{ id: string }>(`SELECT id FROM ledger_rows WHERE state = 'reserved' ORDER BY time`);
    return this.recoverRows(rows, now);
  }

  private async recoverRows(ids: readonly { id: string }[], now: number): Promise<number> {
    let recovered = 0;
    for (const { id } of ids) {
      // Another replica may recover (or the request settle) the same row: the row lock decides.
      if (await this.tx((c) => settleLocked(c, id, (row) => recoveredSettlement(row, now)))) recovered++;
    }
    return recovered;
  }

  /** Stamped with the database's time: the replica's own `now` is not used (see recoverStale). */
  async keepAlive(ids: readonly string[], _now: number): Promise<void> {
    if (ids.length === 0) return;
    await this.pool.query(`UPDATE ledger_rows SET alive_at = ${DB_NOW_MS} WHERE id = ANY($1::text[]) AND state = 'reserved'`, [ids]);
  }

  async getHead(conversation: string): Promise<ConversationHead | null> {
    const { rows } = await this.pool.query<ConversationHead>(
      `SELECT conversation, key_id AS "keyId", tenant, model, tool_hash AS "toolHash",
         server_id AS "serverId", chain, prefix, prefix_digests AS "prefixDigests", last_cost_usd AS "lastCostUsd", last_prompt_tokens AS "lastPromptTokens",
         last_output_tokens AS "lastOutputTokens", time
       FROM heads WHERE conversation = $1`,
      [conversation],
    );
    return rows[0] ?? null;
  }

  async putHead(h: ConversationHead): Promise<void> {
    await upsertHead(this.pool, h);
  }


  async findConversationByChain(keyId: string | null, tenant: string, chain: string[]): Promise<string | null> {
    if (chain.length === 0) return null;
    const key = keyId === null ? '' : ' AND key_id = $3';
    const { rows } = await this.pool.query<{ conversation: string }>(
      `SELECT conversation FROM chain_ends WHERE tenant = $2 AND last_hash = ANY($1::text[])${key} ORDER BY time DESC LIMIT 1`,
      keyId === null ? [chain, tenant] : [chain, tenant, keyId],
    );
    return rows[0]?.conversation ?? null;
  }

  async getRun(run: string): Promise<RunState | null> {
    const { rows } = await this.pool.query<RunState>(
      `SELECT id AS run, conversation, started_at AS "startedAt", budget_tokens AS "budgetTokens",
         used_tokens AS "usedTokens" FROM runs WHERE id = $1`,
      [run],
    );
    return rows[0] ?? null;
  }

  async conversationSpend(conversation: string): Promise<ConversationSpend | null> {
    const { rows } = await this.pool.query<Omit<ConversationSpend, 'byModel' | 'tenant'> & { tenant: string | null }>(
      `SELECT id AS conversation, tenant, parent, spent_usd AS "spentUsd", saved_usd AS "savedUsd",
         plan_turns AS "planTurns", plan_work_usd AS "planWorkUsd", tasks_usd AS "tasksUsd", reserved_usd AS "reservedUsd", turns,
         cap_usd AS "capUsd", room_ceiling_mtok AS "roomCeilingMtok", unpriced_turns AS "unpricedTurns",
         tasks_unpriced_turns AS "tasksUnpricedTurns"
       FROM conversations WHERE id = $1`,
      [conversation],
    );
    const c = rows[0];
    if (!c) return null;
    const models = await this.pool.query<{ model: string; turns: number; spent_usd: number; unpriced_turns: number }>(
      'SELECT model, turns, spent_usd, unpriced_turns FROM conversation_models WHERE conversation = $1 ORDER BY model',
      [conversation],
    );
    const byModel: ConversationSpend['byModel'] = {};
    for (const m of models.rows) byModel[m.model] = { turns: m.turns, spentUsd: m.spent_usd, unpricedTurns: m.unpriced_turns };
    return { ...c, tenant: c.tenant ?? '', byModel };
  }

  async setConversationCap(conversation: string, tenant: string | null, capUsd: number | null): Promise<string | null> {
    // One statement: a first request claiming the row meanwhile either comes first (and the cap is
    // not written for another owner) or after (and finds the owner set here).
    const { rows } = await this.pool.query<{ tenant: string | null }>(
      `WITH up AS (
         INSERT INTO conversations (id, tenant, cap_usd) VALUES ($1, $2, $3)
         ON CONFLICT (id) DO UPDATE SET cap_usd = excluded.cap_usd, room_ceiling_mtok = NULL,
           tenant = COALESCE(conversations.tenant, excluded.tenant)
         WHERE excluded.tenant IS NULL OR conversations.tenant IS NULL OR conversations.tenant = excluded.tenant
         RETURNING tenant
       )
       SELECT tenant FROM up UNION ALL SELECT tenant FROM conversations WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM up)`,
      [conversation, tenant, capUsd],
    );
    return rows[0]?.tenant ?? null;
  }

  async offerCapRoom(conversation: string, ceilingMtok: number, capUsd: number): Promise<void> {
    await this.pool.query(
      'UPDATE conversations SET room_ceiling_mtok = GREATEST(COALESCE(room_ceiling_mtok, 0), $2) WHERE id = $1 AND cap_usd = $3',
      [conversation, ceilingMtok, capUsd],
    );
  }

  async tenantMonth(tenant: string, month: string): Promise<TenantMonthSpend> {
    const { rows } = await this.pool.query<TenantMonthSpend>(
      `SELECT spent_usd AS "spentUsd", reserved_usd AS "reservedUsd", unpriced_turns AS "unpricedTurns" FROM tenant_months
       WHERE tenant = $1 AND month = $2`,
      [tenant, month],
    );
    return rows[0] ?? { spentUsd: 0, reservedUsd: 0, unpricedTurns: 0 };
  }

  async claimBudgetNearNotice(tenant: string, month: string): Promise<boolean> {
    // The primary key decides: of concurrent inserts exactly one reports a row.
    const res = await this.pool.query(
      'INSERT INTO budget_notices (tenant, month) VALUES ($1, $2) ON CONFLICT DO NOTHING',
      [tenant, month],
    );
    return res.rowCount === 1;
  }

  async createTenant(t: TenantRecord): Promise<boolean> {
    const res = await this.pool.query('INSERT INTO tenants (id, monthly_budget_usd) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING', [
      t.id,
      t.monthlyBudgetUsd,
    ]);
    return res.rowCount === 1;
  }

  async getTenant(id: string): Promise<TenantRecord | null> {
    const { rows } = await this.pool.query<TenantRecord>(
      'SELECT id, monthly_budget_usd AS "monthlyBudgetUsd" FROM tenants WHERE id = $1',
      [id],
    );
    return rows[0] ?? null;
  }

  async setTenantBudget(id: string, monthlyBudgetUsd: number | null): Promise<boolean> {
    const res = await this.pool.query('UPDATE tenants SET monthly_budget_usd = $2 WHERE id = $1', [
      id,
      monthlyBudgetUsd,
    ]);
    return res.rowCount === 1;
  }

  async createKey(k: KeyRecord & { hash: string }): Promise<void> {
    await this.pool.query('INSERT INTO api_keys (id, tenant, name, hash) VALUES ($1, $2, $3, $4)', [
      k.id,
      k.tenant,
      k.name,
      k.hash,
    ]);
  }

  async deleteKey(id: string): Promise<boolean> {
    const res = await this.pool.query('DELETE FROM api_keys WHERE id = $1', [id]);
    return res.rowCount === 1;
  }

  async findKeyByHash(hash: string): Promise<KeyRecord | null> {
    const { rows } = await this.pool.query<KeyRecord>('SELECT id, tenant, name FROM api_keys WHERE hash = $1', [
      hash,
    ]);
    return rows[0] ?? null;
  }

  async hasKeys(): Promise<boolean> {
    const { rowCount } = await this.pool.query('SELECT 1 FROM api_keys LIMIT 1');
    return (rowCount ?? 0) > 0;
  }

  async listTenants(): Promise<TenantRecord[]> {
    // Ordered bytewise, as SQLite orders text, whatever the database's collation.
    const { rows } = await this.pool.query<TenantRecord>('SELECT id, monthly_budget_usd AS "monthlyBudgetUsd" FROM tenants ORDER BY id COLLATE "C"');
    return rows;
  }

  async listKeys(tenant?: string): Promise<KeyRecord[]> {
    const { rows } =
      tenant === undefined
        ? await this.pool.query<KeyRecord>('SELECT id, tenant, name FROM api_keys ORDER BY tenant COLLATE "C", id COLLATE "C"')
        : await this.pool.query<KeyRecord>('SELECT id, tenant, name FROM api_keys WHERE tenant = $1 ORDER BY id COLLATE "C"', [tenant]);
    return rows;
  }

  async pruneRows(untilMs: number, limit: number): Promise<number> {
    const { rowCount } = await this.pool.query(
      `DELETE FROM ledger_rows WHERE id IN (SELECT id FROM ledger_rows
         WHERE finished_at < $1 AND state <> 'reserved' ORDER BY finished_at, id LIMIT $2)`,
      [untilMs, limit],
    );
    return rowCount ?? 0;
  }

  async pruneHistory(table: HistoryTable, untilMs: number, after: string, limit: number): Promise<{ deleted: number; next: string | null }> {
    if (table === 'chain_ends') {
      // Walked in primary-key order; the key to go on from is the last one seen, as JSON.
      const from = after === '' ? ['', '', ''] : (JSON.parse(after) as string[]);
      const page = (
        await this.pool.query<{ tenant: string; last_hash: string; key_id: string }>(
          `SELECT tenant, last_hash, key_id FROM chain_ends WHERE (tenant, last_hash, key_id) > ($1, $2, $3)
           ORDER BY tenant, last_hash, key_id LIMIT $4`,
          [...from, limit],
        )
      ).rows;
      if (page.length === 0) return { deleted: 0, next: null };
      const last = page[page.length - 1]!;
      const { rowCount } = await this.pool.query(
        `DELETE FROM chain_ends WHERE (tenant, last_hash, key_id) > ($1, $2, $3) AND (tenant, last_hash, key_id) <= ($4, $5, $6)
           AND time < $7
           AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = chain_ends.conversation AND (c.cap_usd IS NOT NULL OR c.parent IS NOT NULL))`,
        [...from, last.tenant, last.last_hash, last.key_id, untilMs],
      );
      return { deleted: rowCount ?? 0, next: page.length < limit ? null : JSON.stringify([last.tenant, last.last_hash, last.key_id]) };
    }
    const scan =
      table === 'heads'
        ? 'SELECT conversation AS k FROM heads WHERE conversation > $1 ORDER BY conversation LIMIT $2'
        : 'SELECT id AS k FROM runs WHERE id > $1 ORDER BY id LIMIT $2';
    const keys = (await this.pool.query<{ k: string }>(scan, [after, limit])).rows.map((r) => r.k);
    if (keys.length === 0) return { deleted: 0, next: null };
    const prune =
      table === 'heads'
        ? `DELETE FROM heads WHERE conversation = ANY($1::text[]) AND time < $2
           AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = heads.conversation AND (c.cap_usd IS NOT NULL OR c.parent IS NOT NULL))`
        : `DELETE FROM runs WHERE id = ANY($1::text[]) AND started_at < $2
           AND id NOT IN (SELECT run FROM ledger_rows WHERE state = 'reserved')
           AND NOT EXISTS (SELECT 1 FROM heads h WHERE h.conversation = runs.conversation AND h.time >= $2)`;
    const { rowCount } = await this.pool.query(prune, [keys, untilMs]);
    return { deleted: rowCount ?? 0, next: keys.length < limit ? null : keys[keys.length - 1]! };
  }

  async *exportRows(sinceMs: number | null, untilMs: number | null, by: ExportWindow = 'time'): AsyncIterable<LedgerRow> {
    // Keyset pages: no long-lived cursor or transaction, memory bounded by one page.
    const column = by === 'settled' ? 'finished_at' : 'time';
    let after = { time: Number.MIN_SAFE_INTEGER, id: '' };
    const since = sinceMs ?? Number.MIN_SAFE_INTEGER;
    const until = untilMs ?? Number.MAX_SAFE_INTEGER;
    for (;;) {
      const { rows } = await this.pool.query<Record<string, unknown>>(
        `SELECT * FROM ledger_rows WHERE ${column} >= $1 AND ${column} < $2 AND (${column}, id) > ($3, $4)
         ORDER BY ${column}, id LIMIT $5`,
        [Math.max(since, after.time), until, after.time, after.id, EXPORT_PAGE],
      );
      for (const rec of rows) yield toLedgerRow(rec);
      if (rows.length < EXPORT_PAGE) return;
      const last = rows[rows.length - 1];
      after = { time: Number(last[column]), id: String(last.id) };
    }
  }
}

/** Records a conversation's head (the previous request's chain, counts and cost). */
async function upsertHead(db: pg.Pool | pg.PoolClient, h: ConversationHead): Promise<void> {
  // The head, and where this request's list ended (migration 9), in one statement.
  await db.query(
    `WITH head AS (
       INSERT INTO heads (conversation, key_id, tenant, model, tool_hash, chain, prefix, last_hash,
         last_cost_usd, last_prompt_tokens, last_output_tokens, time, server_id, prefix_digests)
       VALUES ($1, $2, $3, $4, $5, $6::jsonb, $7::jsonb, $8, $9, $10, $11, $12, $13, $14::jsonb)
       ON CONFLICT (conversation) DO UPDATE SET key_id = excluded.key_id, tenant = excluded.tenant,
         model = excluded.model, tool_hash = excluded.tool_hash, server_id = excluded.server_id,
         chain = excluded.chain,
         prefix = excluded.prefix, prefix_digests = excluded.prefix_digests, last_hash = excluded.last_hash,
         last_cost_usd = excluded.last_cost_usd, last_prompt_tokens = excluded.last_prompt_tokens,
         last_output_tokens = excluded.last_output_tokens, time = excluded.time)
     INSERT INTO chain_ends AS e (tenant, last_hash, key_id, conversation, time)
       SELECT $3, $8, COALESCE($2, ''), $1, $12 WHERE $8 <> ''
     ON CONFLICT (tenant, last_hash, key_id) DO UPDATE SET conversation = excluded.conversation, time = excluded.time
       WHERE excluded.time >= e.time`,
    [
      h.conversation,
      h.keyId,
      h.tenant,
      h.model,
      h.toolHash,
      JSON.stringify(h.chain),
      JSON.stringify(h.prefix),
      h.chain.length > 0 ? h.chain[h.chain.length - 1] : '',
      h.lastCostUsd,
      h.lastPromptTokens,
      h.lastOutputTokens,
      h.time,
      h.serverId,
      h.prefixDigests === null ? null : JSON.stringify(h.prefixDigests),
    ],
  );
}
