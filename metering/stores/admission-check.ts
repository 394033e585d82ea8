// The budget checks of admission, shared by both stores so SQLite and PostgreSQL refuse for the
// same reasons in the same order (the brief's order: run tokens, conversation cap, parent cap,
// monthly budget — "parent" being every conversation above, nearest first: ADR 0018). Pure: each
// store reads the locked counters, calls this, then writes.
import type { AdmitResult, Reservation } from '../ledger.js';

/**
 * Money is kept as double precision in both stores (ADR 0005). Reserving and releasing the same
 * amount can leave float dust (1e-17), so a check tolerates a nano-dollar; nothing measurable.
 */
export const USD_EPSILON = 1e-9;

export interface MoneyScopeState {
  /** The conversation's id and owner, where the store read a row (a row not made yet has neither). */
  id?: string;
  tenant?: string | null;
  capUsd: number | null;
  spentUsd: number;
  tasksUsd: number;
  reservedUsd: number;
}

export interface AdmissionState {
  budgetTokens: number | null;
  usedTokens: number;
  conversation: MoneyScopeState;
  /** The parent, its parent, … up to the top (see `familyOf`); empty when there is no parent. */
  ancestors: MoneyScopeState[];
  /** More than MAX_ANCESTORS conversations above this one: refused before any budget. */
  tooDeep: boolean;
  monthlyBudgetUsd: number | null;
  month: { spentUsd: number; reservedUsd: number };
}

/**
 * The token budget a request of a run is held to: the run's own, set by its first request, and the
 * budget of the key now asking, whichever is lower (null: none). A key with a lower budget that
 * joins a run another key began must not take the other's budget with it.
 */
export function runBudgetFor(runBudget: number | null | undefined, askerBudget: number | null): number | null {
  if (runBudget === undefined) return askerBudget;
  if (runBudget === null || askerBudget === null) return runBudget ?? askerBudget;
  return Math.min(runBudget, askerBudget);
}

/** The tokens a reservation draws from its run: the prompt charge plus the whole allowance. */
export function reservedTokens(r: Reservation): number {
  return r.promptCharge + r.allowance;
}

/**
 * Whether `needed` fits beside what a limit already holds. A cost that is unknown (null) fits only
 * while some of the limit is left: it can cross the limit once, as the operator allowed, but no
 * request of unknown cost starts at or past it.
 */
function fits(committed: number, needed: number | null, limit: number): boolean {
  return needed === null ? committed < limit - USD_EPSILON : committed + needed <= limit + USD_EPSILON;
}

function capRefusal(
  scope: 'conversation' | 'parent',
  s: MoneyScopeState,
  needed: number | null,
  room = 0,
): AdmitResult | null {
  if (s.capUsd === null) return null;
  const spent = s.spentUsd + s.tasksUsd;
  if (fits(spent + s.reservedUsd, needed, s.capUsd + room)) return null;
  return { ok: false, scope, spentUsd: spent, reservedUsd: s.reservedUsd, limitUsd: s.capUsd, neededUsd: needed, ...(room > 0 ? { roomUsd: room } : {}) };
}

/** The first budget the reservation would cross, or `{ok: true}`. */
export function checkAdmission(r: Reservation, s: AdmissionState): AdmitResult {
  if (s.tooDeep) return { ok: false, scope: 'nesting', limitAncestors: MAX_ANCESTORS };
  // Ids are global: the first tenant to use a conversation owns it, and no request of another is
  // admitted into it or under it. The planner says so first; this holds it in the atomic step,
  // where two first requests of two tenants may both have passed the planner.
  for (const scope of [s.conversation, ...s.ancestors]) {
    if (scope.tenant && scope.tenant !== r.tenant) return { ok: false, scope: 'owner', conversation: scope.id ?? r.conversation };
  }
  const neededTokens = reservedTokens(r);
  const budget = runBudgetFor(s.budgetTokens, r.runBudgetTokens);
  if (budget !== null && s.usedTokens + neededTokens > budget) {
    return {
      ok: false,
      scope: 'run',
      remainingTokens: Math.max(0, budget - s.usedTokens),
      neededTokens,
      limitTokens: budget,
    };
  }
  const keep = r.keepTokens ?? 0;
  if (budget !== null && keep > 0 && s.usedTokens + neededTokens + keep > budget) {
    return { ok: false, scope: 'keep', remainingTokens: budget - s.usedTokens, neededTokens, keepTokens: keep };
  }
  // A request that costs no money (local, plan, an excerpt the gateway writes) passes every money
  // check; one whose cost is unknown (`costUnknown`) passes those that still have room.
  const needed = r.worstCaseUsd;
  if (needed === null && r.costUnknown !== true) return { ok: true };
  const own = capRefusal('conversation', s.conversation, needed, r.capRoomUsd ?? 0);
  if (own) return own;
  for (const ancestor of s.ancestors) {
    const refusal = capRefusal('parent', ancestor, needed);
    if (refusal) return refusal;
  }
  if (s.monthlyBudgetUsd !== null) {
    if (!fits(s.month.spentUsd + s.month.reservedUsd, needed, s.monthlyBudgetUsd)) {
      return {
        ok: false,
        scope: 'monthly',
        spentUsd: s.month.spentUsd,
        reservedUsd: s.month.reservedUsd,
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
export function effectiveParent(r: Pick<Reservation, 'conversation' | 'parent'>, stored: string | null = null): string | null {
  const parent = stored ?? r.parent;
  return parent !== null && parent !== r.conversation ? parent : null;
}

/**
 * Conversations a request may have above it. Each level is one more row read, reserved on and
 * settled on per request, so a chain is bounded; past it the request is refused (ADR 0018).
 */
export const MAX_ANCESTORS = 16;

export interface Family {
  /** The parent, its parent, … up to the top: every cap the request is held by, nearest first. */
  ancestors: string[];
  /** More than MAX_ANCESTORS above: `ancestors` holds the first MAX_ANCESTORS of them. */
  tooDeep: boolean;
}

/**
 * The conversations above a request, walked along the stored parent links as they are now (ADR
 * 0018): a conversation that gains a parent after its children were admitted brings them under
 * that parent's cap too. `parentOf(id)` is the parent stored for `id` (null: none, or no such
 * conversation), or undefined when the caller has not read `id` yet — the walk then answers
 * `{unread: id}`, and a caller reading row by row reads it and walks again.
 */
export function familyOf(
  r: Pick<Reservation, 'conversation' | 'parent'>,
  /** The parent the conversation already has (see `effectiveParent`). */
  stored: string | null,
  parentOf: (id: string) => string | null | undefined,
): Family | { unread: string } {
  const first = effectiveParent(r, stored);
  if (first === null) return { ancestors: [], tooDeep: false };
  const ancestors = [first];
  for (;;) {
    const last = ancestors[ancestors.length - 1]!;
    const up = parentOf(last);
    if (up === undefined) return { unread: last };
    // The top; or a loop above, written before loops were refused (or by a race): stop there.
    if (up === null || ancestors.includes(up)) break;
    if (up === r.conversation) {
      // The named parent is this conversation's own descendant: linking them would make a loop,
      // so it is no parent, as a conversation naming itself has none. A link already stored stays.
      if (stored === null) return { ancestors: [], tooDeep: false };
      break;
    }
    if (ancestors.length === MAX_ANCESTORS) return { ancestors, tooDeep: true };
    ancestors.push(up);
  }
  return { ancestors, tooDeep: false };
}

/** `familyOf` for a caller that can read any conversation's parent at once (never unread). */
export function familyNow(
  r: Pick<Reservation, 'conversation' | 'parent'>,
  stored: string | null,
  parentOf: (id: string) => string | null,
): Family {
  const family = familyOf(r, stored, parentOf);
  if ('unread' in family) throw new Error(`conversation ${family.unread} was not read`);
  return family;
}
