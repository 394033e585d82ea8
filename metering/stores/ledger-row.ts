// One ledger row as both stores write and read it: the column values of a reservation, of a
// settlement (real or recovered), and the mapping from a stored record back to `LedgerRow`.
// Column names match `LedgerRow` except `row_count` (ROWS is a keyword in SQL) and the internal
// `month` and `grandparents`.
import type { LedgerRow, ModeName, Reservation, Settlement } from '../ledger.js';
import { reservedTokens } from './admission-check.js';

export type SqlValue = string | number | null;

/**
 * Values inserted when a request is admitted (state `reserved`). `ancestors` are the conversations
 * its worst case was reserved on besides its own, nearest first (the parent, then `grandparents`,
 * a JSON array, or null when there are none): settlement releases exactly those (ADR 0018).
 */
export function reservationColumns(r: Reservation, ancestors: readonly string[]): Record<string, SqlValue> {
  const parent = ancestors[0] ?? null;
  return {
    id: r.id,
    time: r.time,
    month: r.month,
    tenant: r.tenant,
    key_id: r.keyId,
    conversation: r.conversation,
    parent,
    grandparents: ancestors.length > 1 ? JSON.stringify(ancestors.slice(1)) : null,
    run: r.run,
    model: r.model,
    upstream: r.upstream,
    endpoint: r.endpoint,
    mode: r.mode,
    final_reason: r.finalReason,
    state: 'reserved',
    row_count: r.rows,
    prompt_tokens: r.promptTokens,
    count_method: r.countMethod,
    shared_prefix_tokens: r.sharedPrefixTokens,
    prompt_charge: r.promptCharge,
    allowance: r.allowance,
    reserved_tokens: reservedTokens(r),
    worst_case_usd: r.worstCaseUsd,
    billing: r.billing ?? null,
  };
}

/** A settlement reduced to what the counters and the row need. */
export interface SettleValues {
  state: 'settled' | 'recovered';
  status: number | null;
  generatedTokens: number;
  outputMethod: string;
  chargeTokens: number;
  refundTokens: number;
  costUsd: number | null;
  savedUsd: number | null;
  planWorkUsd: number | null;
  costSource: string | null;
  priceSource: string | null;
  priceDate: string | null;
  billing: string | null;
  promptTokens: number | null;
  completionTokens: number | null;
  cachedTokens: number | null;
  promptN: number | null;
  cacheN: number | null;
  fallback: boolean;
  finishedAt: number;
}

/**
 * Whether a settled request counts as one of its conversation's turns (`turns`, `plan_turns`,
 * `by_model`): the model worked on it — it answered, or was cut off or left by the client after
 * reading the prompt, or a crash left it charged in full. A request the upstream refused or failed
 * before any output is refunded in full and is no turn: bad input passed on to the upstream
 * changes nothing in a conversation's spend.
 */
export function countsAsTurn(v: Pick<SettleValues, 'status' | 'chargeTokens'>): boolean {
  return v.chargeTokens > 0 || (v.status !== null && v.status < 400);
}

/**
 * Whether a settled request is a turn whose cost is unknown (`unpriced_turns`): a turn settled
 * with no cost — a metered model without a price, or such a turn a crash left open, recovered at
 * its worst case, which is null too. Its cost adds nothing to `spent_usd`; this counter says that
 * something is missing from it (ADR 0006, SPEC §2: unknown is not 0).
 */
export function isUnpricedTurn(v: Pick<SettleValues, 'status' | 'chargeTokens' | 'costUsd'>): boolean {
  return v.costUsd === null && countsAsTurn(v);
}

/** What a stored row needs to be settled: the amounts it reserved and where. */
export interface OpenRow {
  state: string;
  /** When it was admitted, ms since the epoch (by the admitting process's clock). */
  time: number;
  run: string;
  conversation: string;
  parent: string | null;
  /** JSON array of the conversations above the parent, nearest first; null when none. */
  grandparents: string | null;
  tenant: string;
  month: string;
  model: string;
  prompt_charge: number;
  allowance: number;
  reserved_tokens: number;
  worst_case_usd: number | null;
  /** How its upstream is billed, when admission recorded it (`Reservation.billing`). */
  billing: string | null;
}

/**
 * The conversations above a row's own that its reservation was drawn on, nearest first. A row
 * written before grandparents were recorded has none: it reserved on its parent alone.
 */
export function ancestorsOfRow(row: Pick<OpenRow, 'parent' | 'grandparents'>): string[] {
  if (row.parent === null) return [];
  return row.grandparents === null ? [row.parent] : [row.parent, ...(JSON.parse(row.grandparents) as string[])];
}

/**
 * A client's settlement. The refund is bounded by what was reserved: settlement may give tokens
 * back but never takes more than admission reserved (SPEC §4).
 */
export function fromSettlement(row: OpenRow, s: Settlement): SettleValues {
  const f = s.upstreamFigures;
  return {
    state: 'settled',
    status: s.status,
    generatedTokens: s.generatedTokens,
    outputMethod: s.outputMethod,
    chargeTokens: s.chargeTokens,
    refundTokens: Math.max(0, Math.min(s.refundTokens, row.reserved_tokens)),
    costUsd: s.costUsd,
    savedUsd: s.savedUsd,
    planWorkUsd: s.planWorkUsd,
    costSource: s.costSource ?? null,
    priceSource: s.priceSource ?? null,
    priceDate: s.priceDate ?? null,
    billing: s.billing,
    promptTokens: f.promptTokens,
    completionTokens: f.completionTokens,
    cachedTokens: f.cachedTokens,
    promptN: f.promptN,
    cacheN: f.cacheN,
    fallback: s.fallback,
    finishedAt: s.finishedAt,
  };
}

/**
 * A reservation left open (a crash between admit and settle): charged in full, at its worst-case
 * cost, so no budget is ever under-counted (ADR 0005) — a local or plan turn at none, as it
 * would have settled (its plan work, unknown, is left out). It finishes at `now`, or at its own
 * time when that is later — a row stamped by a clock ahead of the recovering one's — so the export
 * never shows a request that ended before it began.
 */
export function recoveredSettlement(row: OpenRow, now: number): SettleValues {
  return {
    state: 'recovered',
    status: null,
    generatedTokens: row.allowance,
    outputMethod: 'recovered',
    chargeTokens: row.prompt_charge + row.allowance,
    refundTokens: 0,
    costUsd: row.billing === 'local' || row.billing === 'plan' ? 0 : row.worst_case_usd,
    savedUsd: null,
    planWorkUsd: null,
    costSource: 'worst-case',
    priceSource: null,
    priceDate: null,
    billing: row.billing,
    promptTokens: null,
    completionTokens: null,
    cachedTokens: null,
    promptN: null,
    cacheN: null,
    fallback: false,
    finishedAt: Math.max(now, row.time),
  };
}

/** Values written to the row when it is settled; `fallback` in the store's own boolean form. */
export function settlementColumns<B>(v: SettleValues, bool: (b: boolean) => B): Record<string, SqlValue | B> {
  return {
    state: v.state,
    status: v.status,
    generated_tokens: v.generatedTokens,
    output_method: v.outputMethod,
    charge_tokens: v.chargeTokens,
    refund_tokens: v.refundTokens,
    cost_usd: v.costUsd,
    saved_usd: v.savedUsd,
    plan_work_usd: v.planWorkUsd,
    cost_source: v.costSource,
    price_source: v.priceSource,
    price_date: v.priceDate,
    billing: v.billing,
    upstream_prompt_tokens: v.promptTokens,
    upstream_completion_tokens: v.completionTokens,
    upstream_cached_tokens: v.cachedTokens,
    upstream_prompt_n: v.promptN,
    upstream_cache_n: v.cacheN,
    fallback: bool(v.fallback),
    finished_at: v.finishedAt,
  };
}

// Column lists derived from the mappers themselves, so the SQL can never drift from them.
const SAMPLE_RESERVATION: Reservation = {
  id: '', time: 0, tenant: '', keyId: null, conversation: '', parent: null, run: '', model: '',
  upstream: '', endpoint: '', mode: 'normal', finalReason: null, rows: 0, promptTokens: 0,
  countMethod: '', sharedPrefixTokens: 0, promptCharge: 0, allowance: 0, runBudgetTokens: null,
  worstCaseUsd: null, month: '',
};
export const RESERVATION_COLUMNS = Object.keys(reservationColumns(SAMPLE_RESERVATION, []));
const SAMPLE_SETTLEMENT: SettleValues = {
  state: 'settled', status: null, generatedTokens: 0, outputMethod: '', chargeTokens: 0,
  refundTokens: 0, costUsd: null, savedUsd: null, planWorkUsd: null, costSource: null, priceSource: null, priceDate: null, billing: null,
  promptTokens: null, completionTokens: null, cachedTokens: null, promptN: null, cacheN: null,
  fallback: false, finishedAt: 0,
};
export const SETTLEMENT_COLUMNS = Object.keys(settlementColumns(SAMPLE_SETTLEMENT, (b) => b));

function str(rec: Record<string, unknown>, k: string): string {
  return String(rec[k]);
}
function strOrNull(rec: Record<string, unknown>, k: string): string | null {
  const v = rec[k];
  return v === null || v === undefined ? null : String(v);
}
function num(rec: Record<string, unknown>, k: string): number {
  return Number(rec[k]);
}
function numOrNull(rec: Record<string, unknown>, k: string): number | null {
  const v = rec[k];
  return v === null || v === undefined ? null : Number(v);
}
function isoOrNull(rec: Record<string, unknown>, k: string): string | null {
  const v = numOrNull(rec, k);
  return v === null ? null : new Date(v).toISOString();
}

function asState(v: string): LedgerRow['state'] {
  return v === 'settled' || v === 'recovered' ? v : 'reserved';
}

/** A stored record (either store) as the exported `LedgerRow`; times become ISO strings. */
export function toLedgerRow(rec: Record<string, unknown>): LedgerRow {
  return {
    id: str(rec, 'id'),
    time: new Date(num(rec, 'time')).toISOString(),
    tenant: str(rec, 'tenant'),
    key_id: strOrNull(rec, 'key_id'),
    conversation: str(rec, 'conversation'),
    parent: strOrNull(rec, 'parent'),
    run: str(rec, 'run'),
    model: str(rec, 'model'),
    upstream: str(rec, 'upstream'),
    endpoint: str(rec, 'endpoint'),
    mode: str(rec, 'mode') as ModeName,
    final_reason: strOrNull(rec, 'final_reason'),
    status: numOrNull(rec, 'status'),
    state: asState(str(rec, 'state')),
    rows: num(rec, 'row_count'),
    prompt_tokens: num(rec, 'prompt_tokens'),
    count_method: str(rec, 'count_method'),
    shared_prefix_tokens: num(rec, 'shared_prefix_tokens'),
    prompt_charge: num(rec, 'prompt_charge'),
    allowance: num(rec, 'allowance'),
    reserved_tokens: num(rec, 'reserved_tokens'),
    generated_tokens: numOrNull(rec, 'generated_tokens'),
    output_method: strOrNull(rec, 'output_method'),
    charge_tokens: numOrNull(rec, 'charge_tokens'),
    refund_tokens: numOrNull(rec, 'refund_tokens'),
    worst_case_usd: numOrNull(rec, 'worst_case_usd'),
    cost_usd: numOrNull(rec, 'cost_usd'),
    saved_usd: numOrNull(rec, 'saved_usd'),
    plan_work_usd: numOrNull(rec, 'plan_work_usd'),
    cost_source: strOrNull(rec, 'cost_source'),
    price_source: strOrNull(rec, 'price_source'),
    price_date: strOrNull(rec, 'price_date'),
    billing: strOrNull(rec, 'billing'),
    upstream_prompt_tokens: numOrNull(rec, 'upstream_prompt_tokens'),
    upstream_completion_tokens: numOrNull(rec, 'upstream_completion_tokens'),
    upstream_cached_tokens: numOrNull(rec, 'upstream_cached_tokens'),
    upstream_prompt_n: numOrNull(rec, 'upstream_prompt_n'),
    upstream_cache_n: numOrNull(rec, 'upstream_cache_n'),
    fallback: Boolean(rec.fallback),
    finished_at: isoOrNull(rec, 'finished_at'),
  };
}

/** Rows fetched per page when exporting: keyset pages keep memory flat on any ledger size. */
export const EXPORT_PAGE = 500;
