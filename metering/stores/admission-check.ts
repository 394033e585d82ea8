// The budget checks of admission, shared by both stores so SQLite and PostgreSQL refuse for the
// same reasons in the same order (the brief's order: run tokens, conversation cap, parent cap,
// monthly budget). Pure: each store reads the locked counters, calls this, then writes.
import type { AdmitResult, Reservation } from '../ledger.js';

/**
 * Money is kept as double precision in both stores (ADR 0005). Reserving and releasing the same
 * amount can leave float dust (1e-17), so a check tolerates a nano-dollar; nothing measurable.
 */
export const USD_EPSILON = 1e-9;

export interface MoneyScopeState {
  capUsd: number | null;
  spentUsd: number;
  tasksUsd: number;
  reservedUsd: number;
}

export interface AdmissionState {
  budgetTokens: number | null;
  usedTokens: number;
  conversation: MoneyScopeState;
  /** Null when the request names no parent. */
  parent: MoneyScopeState | null;
  monthlyBudgetUsd: number | null;
  month: { spentUsd: number; reservedUsd: number };
}

/** The tokens a reservation draws from its run: the prompt charge plus the whole allowance. */
export function reservedTokens(r: Reservation): number {
  return r.promptCharge + r.allowance;
}

function capRefusal(
  scope: 'conversation' | 'parent',
  s: MoneyScopeState,
  needed: number,
): AdmitResult | null {
  if (s.capUsd === null) return null;
  const committed = s.spentUsd + s.tasksUsd + s.reservedUsd;
  if (committed + needed <= s.capUsd + USD_EPSILON) return null;
  return { ok: false, scope, spentUsd: committed, limitUsd: s.capUsd, neededUsd: needed };
}

/** The first budget the reservation would cross, or `{ok: true}`. */
export function checkAdmission(r: Reservation, s: AdmissionState): AdmitResult {
  const neededTokens = reservedTokens(r);
  if (s.budgetTokens !== null && s.usedTokens + neededTokens > s.budgetTokens) {
    return {
      ok: false,
      scope: 'run',
      remainingTokens: Math.max(0, s.budgetTokens - s.usedTokens),
      neededTokens,
      limitTokens: s.budgetTokens,
    };
  }
  // A request that costs no money (local, plan, or unpriced-allowed) passes every money check.
  const needed = r.worstCaseUsd;
  if (needed === null) return { ok: true };
  const own = capRefusal('conversation', s.conversation, needed);
  if (own) return own;
  if (s.parent) {
    const parent = capRefusal('parent', s.parent, needed);
    if (parent) return parent;
  }
  if (s.monthlyBudgetUsd !== null) {
    const committed = s.month.spentUsd + s.month.reservedUsd;
    if (committed + needed > s.monthlyBudgetUsd + USD_EPSILON) {
      return {
        ok: false,
        scope: 'monthly',
        spentUsd: committed,
        limitUsd: s.monthlyBudgetUsd,
        neededUsd: needed,
      };
    }
  }
  return { ok: true };
}

/**
 * The parent whose cap a request shares. A conversation's first parent is its parent for good
 * (`stored`): a later request that names another, or none, still draws on it — otherwise a child
 * could leave its parent's cap by dropping the header (SPEC §6: no child conversation can raise
 * a limit). A conversation naming itself has none.
 */
export function effectiveParent(r: Reservation, stored: string | null = null): string | null {
  const parent = stored ?? r.parent;
  return parent !== null && parent !== r.conversation ? parent : null;
}
