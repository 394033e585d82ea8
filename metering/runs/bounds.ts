// A run's bounds and the decision, per request, between a normal turn, the reserved final answer
// and a refusal (SPEC §5, §11; ADR 0007). Pure: the caller supplies the clock and the budget left.

import type { RunInspection } from './run-state.js';
import { ageMs } from '../clock-skew.js';

/** `null` turns a bound off. Field names match the `runs` section of the config file. */
export interface RunBounds {
  /** Tool rounds (assistant turns with tool calls) before the final answer; 1–64. */
  maxToolRounds: number | null;
  /** Tokens a run may charge. */
  tokenBudget: number | null;
  /** Wall time from the first request of the run the gateway saw. */
  timeBudgetSeconds: number | null;
  /** Identical read-only call/result batches in a row that end the research. */
  patience: number | null;
  /** Tokens of the budget kept back so the final answer always fits. Null (not configured): 1,024. */
  answerReserveTokens: number | null;
}

export const DEFAULT_RUN_BOUNDS: Readonly<RunBounds> = Object.freeze({
  maxToolRounds: 12,
  tokenBudget: 65_536,
  timeBudgetSeconds: 300,
  patience: 3,
  answerReserveTokens: null,
});

/** The reserve when none is configured (SPEC §11). */
export const DEFAULT_ANSWER_RESERVE_TOKENS = 1024;

/**
 * The answer reserve that applies: the configured one, else 1,024 tokens (SPEC §11) — whatever the
 * budget. A run whose budget is not larger than its reserve has no room for a tool round: every
 * request offering tools is sent as the final answer (ADR 0007).
 */
export function answerReserveFor(bounds: Pick<RunBounds, 'answerReserveTokens'>): number {
  return bounds.answerReserveTokens ?? DEFAULT_ANSWER_RESERVE_TOKENS;
}

// Ranges agree with server/config.ts, so an override accepted here is accepted there.
const RANGES: Record<keyof RunBounds, { min: number; max: number; nullable: boolean }> = {
  maxToolRounds: { min: 1, max: 64, nullable: true },
  tokenBudget: { min: 1, max: 1_073_741_824, nullable: true },
  timeBudgetSeconds: { min: 1, max: 86_400, nullable: true },
  patience: { min: 1, max: 100, nullable: true },
  answerReserveTokens: { min: 0, max: 1_048_576, nullable: false },
};

/** Fields a `runs` object may hold besides the bounds (validated by the config reader). */
const OTHER_FIELDS = new Set(['writeTools']);

export type RunBoundsValidation =
  | { ok: true; value: Partial<RunBounds> }
  | { ok: false; errors: string[] };

/**
 * Checks a partial set of bounds (a tenant's or key's override, or the config's `runs`). Every
 * error names its field: `runs.maxToolRounds: must be an integer from 1 to 64`. Unknown fields are
 * errors too, so a typo does not silently leave a bound at its default.
 */
export function validateRunBounds(input: unknown, path = 'runs'): RunBoundsValidation {
  if (input === undefined) return { ok: true, value: {} };
  if (input === null || typeof input !== 'object' || Array.isArray(input)) {
    return { ok: false, errors: [`${path}: must be an object`] };
  }
  const errors: string[] = [];
  const value: Partial<RunBounds> = {};
  for (const [key, v] of Object.entries(input)) {
    if (!(key in RANGES)) {
      if (!OTHER_FIELDS.has(key)) errors.push(`${path}.${key}: unknown field`);
      continue;
    }
    const field = key as keyof RunBounds;
    const { min, max, nullable } = RANGES[field];
    if (v === null && nullable) {
      (value as Record<string, number | null>)[field] = null;
    } else if (typeof v === 'number' && Number.isInteger(v) && v >= min && v <= max) {
      (value as Record<string, number | null>)[field] = v;
    } else {
      const off = nullable ? ', or null to turn it off' : '';
      errors.push(`${path}.${field}: must be an integer from ${min} to ${max}${off}`);
    }
  }
  if (
    typeof value.tokenBudget === 'number' &&
    typeof value.answerReserveTokens === 'number' &&
    value.answerReserveTokens >= value.tokenBudget
  ) {
    errors.push(`${path}.answerReserveTokens: must be less than ${path}.tokenBudget (${value.tokenBudget})`);
  }
  return errors.length > 0 ? { ok: false, errors } : { ok: true, value };
}

/** Later overrides win field by field; an absent (undefined) field keeps the earlier value. */
export function mergeRunBounds(base: Readonly<RunBounds>, ...overrides: Array<Partial<RunBounds> | undefined>): RunBounds {
  const out: RunBounds = { ...base };
  for (const o of overrides) {
    if (!o) continue;
    for (const key of Object.keys(RANGES) as Array<keyof RunBounds>) {
      const v = o[key];
      if (v !== undefined) (out as Record<keyof RunBounds, number | null>)[key] = v;
    }
  }
  return out;
}

export type FinalReason = 'rounds' | 'patience' | 'time' | 'tokens';

/**
 * Whether a run that started at `startedAt` has spent its time. A start further in the future than
 * clocks differ (a clock stepped back since) has no elapsed time to tell: it counts as spent, so the
 * run ends now with its final answer. Taken as no time at all, it ran on unbounded for the whole
 * step; SPEC §5 wants every run bounded and ending with an answer (ADR 0007).
 */
export function runTimeSpent(now: number, startedAt: number, budgetSeconds: number): boolean {
  const elapsed = ageMs(now, startedAt);
  return elapsed === null || elapsed >= budgetSeconds * 1000;
}

export type ModeDecision =
  | { mode: 'normal' }
  | { mode: 'final-answer'; reason: FinalReason }
  | { mode: 'refuse-tokens'; remainingTokens: number; neededTokens: number };

export interface ModeInput {
  bounds: Readonly<RunBounds>;
  run: Pick<RunInspection, 'toolRounds' | 'identicalStreak'>;
  /** Whether the request offers tools (`tools` or legacy `functions`). */
  offersTools: boolean;
  /** ms since the epoch */
  now: number;
  /** When the gateway saw the run's first request (ms); null when this request is the first. */
  runStartedAt: number | null;
  /** Tokens left in the run's budget after in-flight reservations; null when there is no budget. */
  remainingTokens: number | null;
  /** Prompt charge + allowance of the request as sent by the client. */
  neededTokens: number;
  /** The same for the final-answer request (no tool definitions: often smaller). */
  finalNeededTokens?: number;
}

/**
 * Normal, final answer, or refusal. When several bounds are reached, the reason reported is the
 * first of: rounds, patience, time, tokens — the structural bounds before the resource ones, so
 * the reason names what the research did rather than what it happened to cost.
 */
export function decideMode(input: ModeInput): ModeDecision {
  const { bounds, run, remainingTokens: remaining } = input;

  // A request without tools is itself an answer: it needs no reserve, only room for itself.
  if (!input.offersTools) {
    if (remaining !== null && input.neededTokens > remaining) {
      return { mode: 'refuse-tokens', remainingTokens: remaining, neededTokens: input.neededTokens };
    }
    return { mode: 'normal' };
  }

  const reason = finalReason(input);
  if (reason === null) return { mode: 'normal' };

  // The final answer may use the reserve; if even the whole remainder cannot hold it, refuse.
  const finalNeeded = input.finalNeededTokens ?? input.neededTokens;
  if (remaining !== null && finalNeeded > remaining) {
    return { mode: 'refuse-tokens', remainingTokens: remaining, neededTokens: finalNeeded };
  }
  return { mode: 'final-answer', reason };

  function finalReason(i: ModeInput): FinalReason | null {
    // With N rounds allowed, the request that follows the N-th round is the answer.
    if (bounds.maxToolRounds !== null && run.toolRounds >= bounds.maxToolRounds) return 'rounds';
    if (bounds.patience !== null && run.identicalStreak >= bounds.patience) return 'patience';
    if (
      bounds.timeBudgetSeconds !== null &&
      i.runStartedAt !== null &&
      runTimeSpent(i.now, i.runStartedAt, bounds.timeBudgetSeconds)
    ) {
      return 'time';
    }
    // One more round must leave the answer's reserve untouched.
    if (remaining !== null && i.neededTokens > remaining - answerReserveFor(bounds)) return 'tokens';
    return null;
  }
}
