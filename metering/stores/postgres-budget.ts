// Admission and settlement on PostgreSQL, each run inside one transaction by the store
// (ADR 0005). Admission locks the rows it checks — run, conversations in id order (its own, its
// parent and every one above: ADR 0018), tenant month — before reading them, so concurrent
// admissions on any replica queue on those locks and no read-then-write race can cross a budget.
// Settlement locks the ledger row first, then the same rows in the same order (the conversation's
// head before the month), so the two never deadlock each other. The tenant month, which all of a
// tenant's requests share, is always taken last and held for as few round trips as possible.
import type pg from 'pg';
import type { AdmitResult, MonthAfterSettle, Reservation } from '../ledger.js';
import { MAX_ANCESTORS, checkAdmission, effectiveParent, familyNow, reservedTokens, type MoneyScopeState } from './admission-check.js';
import {
  RESERVATION_COLUMNS,
  ancestorsOfRow,
  countsAsTurn,
  isUnpricedTurn,
  SETTLEMENT_COLUMNS,
  reservationColumns,
  settlementColumns,
  type OpenRow,
  type SettleValues,
} from './ledger-row.js';

type Client = pg.PoolClient;

/**
 * The database's time, ms since the epoch. Replicas' clocks differ (one ran 11 minutes ahead and
 * recovered another's live stream), so whether a reservation is stale is judged on this one clock
 * alone: it stamps `alive_at` and sets the cutoff (ADR 0011). `clock_timestamp()`, not `now()`: the
 * moment the statement runs, not when its transaction began (an admission may wait on locks).
 */
export const DB_NOW_MS = `(extract(epoch FROM clock_timestamp()) * 1000)::bigint`;

// A new reservation is alive as of the database's time, not of its `time` (the admitting
// replica's clock): one replica's clock behind would make its fresh rows look stale to the others.
const INSERT_ROW = `INSERT INTO ledger_rows (${RESERVATION_COLUMNS.join(', ')}, alive_at)
  VALUES (${RESERVATION_COLUMNS.map((_, i) => `$${i + 1}`).join(', ')}, ${DB_NOW_MS})`;
const SETTLE_ROW = `UPDATE ledger_rows SET ${SETTLEMENT_COLUMNS.map((c, i) => `${c} = $${i + 2}`).join(', ')}
  WHERE id = $1`;

interface ConversationRecord extends MoneyScopeState {
  id: string;
  parent: string | null;
}

export async function admitLocked(c: Client, r: Reservation): Promise<AdmitResult> {
  const named = effectiveParent(r);
  // 1. Make sure every row exists, so it can be locked, in one round trip (no locks taken on rows
  // that already exist), and read the parent links up from the conversation and from the parent
  // it names — as far as a request may reach (MAX_ANCESTORS), a loop stopped by the same bound.
  // The parent the conversation already has holds, whatever the request names. Rows made here are
  // only kept if the request is admitted.
  const starts = named === null ? [r.conversation] : [r.conversation, named];
  const links = await c.query<{ id: string; parent: string | null; made: boolean }>(
    `WITH RECURSIVE conv AS (
       INSERT INTO conversations (id, tenant) SELECT id, $2 FROM unnest($1::text[]) AS id ON CONFLICT (id) DO NOTHING
       RETURNING id
     ), run AS (
       INSERT INTO runs (id, conversation, started_at, budget_tokens) VALUES ($3, $4, $5, $6) ON CONFLICT (id) DO NOTHING
     ), mon AS (
       INSERT INTO tenant_months (tenant, month) VALUES ($2, $7) ON CONFLICT DO NOTHING
     ), up (id, parent, depth) AS (
       SELECT id, parent, 0 FROM conversations WHERE id = ANY($1::text[])
       UNION ALL
       SELECT c.id, c.parent, up.depth + 1 FROM conversations c JOIN up ON c.id = up.parent WHERE up.depth < $8
     )
     SELECT id, parent, false AS made FROM (SELECT DISTINCT id, parent FROM up) AS read
     UNION ALL SELECT id, NULL, true FROM conv`,
    [starts, r.tenant, r.run, r.conversation, r.time, r.runBudgetTokens, r.month, MAX_ANCESTORS],
  );
  const parentOf = new Map(links.rows.filter((x) => !x.made).map((x) => [x.id, x.parent]));
  const family = familyNow(r, parentOf.get(r.conversation) ?? null, (id) => parentOf.get(id) ?? null);
  // A parent the request names but the conversation's own parent overrules is no part of this
  // request: a row made for it here goes again, as SQLite never makes it (ADR 0018).
  const stray = named !== null && !family.ancestors.includes(named) && links.rows.some((x) => x.made && x.id === named) ? named : null;
  const convIds = [r.conversation, ...family.ancestors].sort();
  // 2. Lock in a fixed order: run, conversations by id, tenant month. The tenant month is the row
  // every request of a tenant queues on, so it is locked last and held for two round trips only:
  // the writes (one statement) and the commit.
  const run = await c.query<{ budget_tokens: number | null; used_tokens: number }>(
    'SELECT budget_tokens, used_tokens FROM runs WHERE id = $1 FOR UPDATE',
    [r.run],
  );
  const convs = await c.query<ConversationRecord>(
    `SELECT id, tenant, parent, cap_usd AS "capUsd", spent_usd AS "spentUsd", tasks_usd AS "tasksUsd",
       reserved_usd AS "reservedUsd"
     FROM conversations WHERE id = ANY($1::text[]) ORDER BY id FOR UPDATE`,
    [convIds],
  );
  // A link changed between the read above and the lock: two first requests of one conversation
  // naming different parents at the same moment on two replicas, or the top conversation gaining
  // a parent. Rather than check the wrong caps, fail as a serialization failure does: the store
  // runs the admission again, and it then reads the links that hold. A link once set is never
  // replaced, so only an empty one can have changed — the conversation's own and the top's, both
  // locked now; the others (a loop's, through rows not locked) are as read.
  const byId = new Map(convs.rows.map((x) => [x.id, x]));
  const now = (id: string) => (byId.has(id) ? byId.get(id)!.parent : (parentOf.get(id) ?? null));
  const locked = familyNow(r, now(r.conversation), now);
  if (locked.tooDeep !== family.tooDeep || locked.ancestors.join('\n') !== family.ancestors.join('\n')) {
    throw Object.assign(new Error(`the conversations above ${r.conversation} changed during its admission`), { code: '40001' });
  }
  const month = await c.query<{ spent_usd: number; reserved_usd: number; monthly_budget_usd: number | null }>(
    `SELECT m.spent_usd, m.reserved_usd, t.monthly_budget_usd
     FROM tenant_months m LEFT JOIN tenants t ON t.id = m.tenant
     WHERE m.tenant = $1 AND m.month = $2 FOR UPDATE OF m`,
    [r.tenant, r.month],
  );
  const own = byId.get(r.conversation);
  if (!own) throw new Error(`conversation ${r.conversation} vanished during admission`);
  const verdict = checkAdmission(r, {
    budgetTokens: run.rows[0].budget_tokens,
    usedTokens: run.rows[0].used_tokens,
    conversation: own,
    ancestors: family.ancestors.map((id) => {
      const row = byId.get(id);
      if (!row) throw new Error(`conversation ${id} vanished during admission`);
      return row;
    }),
    tooDeep: family.tooDeep,
    monthlyBudgetUsd: month.rows[0].monthly_budget_usd ?? null,
    month: { spentUsd: month.rows[0].spent_usd, reservedUsd: month.rows[0].reserved_usd },
  });
  if (!verdict.ok) return verdict;

  // 3. Reserve: the row, the run's tokens, the claim of the conversation (an owner and a first
  // parent, never replaced) and the money, on it and on every conversation above — one statement
  // (every row it writes is already locked above, so the order inside it does not matter). Only
  // now: a refusal returns above, and the store rolls its transaction back, rows made sure of in
  // step 1 included.
  const cols = reservationColumns(r, family.ancestors);
  const parent = family.ancestors[0] ?? null;
  const n = RESERVATION_COLUMNS.length;
  const w = r.worstCaseUsd;
  const money = w === null ? '' : `, mon AS (UPDATE tenant_months SET reserved_usd = reserved_usd + $${n + 3} WHERE tenant = $${n + 5} AND month = $${n + 8})`;
  await c.query(
    `WITH ins AS (${INSERT_ROW})
     , run AS (UPDATE runs SET used_tokens = used_tokens + $${n + 1}::bigint WHERE id = $${n + 2})
     , conv AS (UPDATE conversations SET reserved_usd = reserved_usd + $${n + 3}::double precision,
         tenant = COALESCE(tenant, $${n + 5}::text),
         parent = CASE WHEN id = $${n + 4}::text THEN COALESCE(parent, $${n + 6}::text) ELSE parent END
       WHERE id = ANY($${n + 7}::text[]))${money}${stray === null ? '' : `, stray AS (DELETE FROM conversations WHERE id = $${n + (w === null ? 8 : 9)})`}
     SELECT 1`,
    [
      ...RESERVATION_COLUMNS.map((k) => cols[k]),
      reservedTokens(r),
      r.run,
      w ?? 0,
      r.conversation,
      r.tenant,
      parent,
      // Every conversation above is written, money or not: one no tenant owns yet is claimed.
      convIds,
      ...(w === null ? [] : [r.month]),
      ...(stray === null ? [] : [stray]),
    ],
  );
  return { ok: true };
}

export async function settleLocked(
  c: Client,
  id: string,
  build: (row: OpenRow) => SettleValues,
  /** More writes in the same transaction (the conversation's head), before the month is locked. */
  alsoWrite?: () => Promise<void>,
): Promise<MonthAfterSettle | null> {
  const found = await c.query<OpenRow>(
    `SELECT state, time, run, conversation, parent, grandparents, tenant, month, model, prompt_charge,
       allowance, reserved_tokens, worst_case_usd, billing FROM ledger_rows WHERE id = $1 FOR UPDATE`,
    [id],
  );
  const row = found.rows[0];
  if (!row || row.state !== 'reserved') return null;
  const v = build(row);
  const w = row.worst_case_usd ?? 0;
  const cost = v.costUsd ?? 0;
  const turn = countsAsTurn(v);
  // A turn of unknown cost adds nothing to the sums, and 1 to the counters that say so.
  const unpriced = isUnpricedTurn(v) ? 1 : 0;
  await c.query('UPDATE runs SET used_tokens = used_tokens - $2 WHERE id = $1', [row.run, v.refundTokens]);
  // Conversations in id order, as in admission: its own, and the ones above as admission reserved
  // on them — whose tasks_usd is what those below spend (ADR 0018).
  const targets = [row.conversation, ...ancestorsOfRow(row)].sort();
  for (const target of targets) {
    if (target === row.conversation) {
      await c.query(
        `UPDATE conversations SET reserved_usd = reserved_usd - $2, spent_usd = spent_usd + $3,
           saved_usd = saved_usd + $4, turns = turns + $7, plan_turns = plan_turns + $5,
           plan_work_usd = plan_work_usd + $6, unpriced_turns = unpriced_turns + $8 WHERE id = $1`,
        [target, w, cost, v.savedUsd ?? 0, turn && v.billing === 'plan' ? 1 : 0, v.planWorkUsd ?? 0, turn ? 1 : 0, unpriced],
      );
    } else {
      await c.query(
        `UPDATE conversations SET reserved_usd = reserved_usd - $2, tasks_usd = tasks_usd + $3,
           tasks_unpriced_turns = tasks_unpriced_turns + $4 WHERE id = $1`,
        [target, w, cost, unpriced],
      );
    }
  }
  if (turn) await c.query(
    `INSERT INTO conversation_models (conversation, model, turns, spent_usd, unpriced_turns) VALUES ($1, $2, 1, $3, $4)
     ON CONFLICT (conversation, model) DO UPDATE SET turns = conversation_models.turns + 1,
       spent_usd = conversation_models.spent_usd + excluded.spent_usd,
       unpriced_turns = conversation_models.unpriced_turns + excluded.unpriced_turns`,
    [row.conversation, row.model, cost, unpriced],
  );
  const cols = settlementColumns(v, (b) => b);
  await c.query(SETTLE_ROW, [id, ...SETTLEMENT_COLUMNS.map((k) => cols[k])]);
  if (alsoWrite) await alsoWrite();
  // The tenant month last: every request of the tenant queues on it, so it is held only for this
  // statement and the commit. It reports the month as this settlement leaves it.
  const month = await c.query<{ spent_usd: number; monthly_budget_usd: number | null }>(
    `INSERT INTO tenant_months (tenant, month, spent_usd, unpriced_turns) VALUES ($1, $2, $4, $5)
     ON CONFLICT (tenant, month) DO UPDATE SET reserved_usd = tenant_months.reserved_usd - $3,
       spent_usd = tenant_months.spent_usd + $4, unpriced_turns = tenant_months.unpriced_turns + $5
     RETURNING spent_usd, (SELECT monthly_budget_usd FROM tenants WHERE id = $1) AS monthly_budget_usd`,
    [row.tenant, row.month, w, cost, unpriced],
  );
  return { spentUsd: month.rows[0]!.spent_usd, monthlyBudgetUsd: month.rows[0]!.monthly_budget_usd ?? null };
}
