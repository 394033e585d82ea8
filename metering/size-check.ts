// The 413 checks on a request's own size, in the order SPEC §11 fixes (the first failure answers):
// too_many_rows → row_too_large → request_tokens_exceeded → context_window_exceeded.
// `body_too_large` comes earlier still, in the HTTP layer, before the body is parsed.
//
// A figure that is an upper bound says so: the planner counts a request exactly before refusing it
// wherever it can (ADR 0010, 0019), so a bound reaches a refusal only when the exact count was out
// of reach, and the client is told why the figure is not exact.
import type { RowPlan } from './row-plan.js';
import type { CountMethod } from './types.js';

export type SizeRefusalCode =
  | 'too_many_rows'
  | 'row_too_large'
  | 'request_tokens_exceeded'
  | 'context_window_exceeded';

export interface SizeRefusal {
  code: SizeRefusalCode;
  message: string;
  /** Figures for the error envelope, beside `message` (SPEC §11). */
  details: Record<string, number | string>;
}

export interface SizeLimits {
  maxRows: number;
  maxRowTokens: number;
  maxRequestTokens: number;
}

export const DEFAULT_SIZE_LIMITS: Readonly<SizeLimits> = Object.freeze({
  maxRows: 1024,
  maxRowTokens: 36_864,
  maxRequestTokens: 1_048_576,
});

type PlanFigures = Pick<
  RowPlan,
  'rows' | 'rowTokens' | 'sumTokens' | 'countMethod' | 'upperBound' | 'rowUpperBound' | 'explicitAllowance' | 'perRowAllowance'
>;

const BOUND_SUFFIX = ':upper-bound';
const BOUND_WHY = 'an upper bound: text without spaces too long to count exactly';

/** Whether row `i`'s count is an upper bound, and the label of how it was counted. */
function rowCount(plan: PlanFigures, i: number): { bound: boolean; method: CountMethod } {
  const bound = plan.rowUpperBound[i] ?? plan.upperBound;
  // The request's label is an upper bound's when any row is one; an exact row keeps the exact label.
  const method = !bound && plan.countMethod.endsWith(BOUND_SUFFIX) ? (plan.countMethod.slice(0, -BOUND_SUFFIX.length) as CountMethod) : plan.countMethod;
  return { bound, method };
}

/** The first size refusal that applies, or null. `limits` may carry other fields (maxBodyBytes). */
export function checkSizes(
  plan: PlanFigures,
  limits: Partial<SizeLimits> = {},
  contextWindow: number | null = null,
  /** False for embeddings: a row may then fill the whole window, nothing is generated after it. */
  generates = true,
): SizeRefusal | null {
  const { maxRows, maxRowTokens, maxRequestTokens } = { ...DEFAULT_SIZE_LIMITS, ...limits };
  const method = plan.countMethod;

  if (plan.rows > maxRows) {
    return {
      code: 'too_many_rows',
      message: `too many rows: ${plan.rows}, the limit is ${maxRows}`,
      details: { rows: plan.rows, limit: maxRows },
    };
  }

  // The first row over the limit is reported, so the client can find it.
  const big = plan.rowTokens.findIndex((t) => t > maxRowTokens);
  if (big >= 0) {
    const t = plan.rowTokens[big];
    const row = rowCount(plan, big);
    return {
      code: 'row_too_large',
      message: row.bound
        ? `too many tokens: one row has up to ${t} tokens, the limit is ${maxRowTokens} per row (${BOUND_WHY})`
        : `too many tokens: one row has ${t} tokens, the limit is ${maxRowTokens} per row`,
      details: { row_index: big, row_tokens: t, limit: maxRowTokens, count_method: row.method },
    };
  }

  if (plan.sumTokens > maxRequestTokens) {
    return {
      code: 'request_tokens_exceeded',
      message: plan.upperBound
        ? `too many tokens: the rows add up to as many as ${plan.sumTokens} tokens, the limit is ${maxRequestTokens} (${BOUND_WHY})`
        : `too many tokens: the rows add up to ${plan.sumTokens} tokens, the limit is ${maxRequestTokens}`,
      details: { rows: plan.rows, sum_tokens: plan.sumTokens, limit: maxRequestTokens, count_method: method },
    };
  }

  if (contextWindow !== null) return checkWindow(plan, contextWindow, generates);
  return null;
}

/**
 * Each row must fit the window with the output asked of it. An explicit allowance counts in full;
 * a default one was clamped to what is left (row-plan.ts), so only a prompt that leaves nothing
 * (prompt ≥ window: llama.cpp refuses exactly that, fixtures error-prompt-equals-ctx) is refused.
 * An embedding row generates nothing: it may fill the window.
 */
function checkWindow(plan: PlanFigures, window: number, generates: boolean): SizeRefusal | null {
  const allowance = plan.explicitAllowance ? plan.perRowAllowance : 0;
  const index = plan.rowTokens.findIndex((t) => (allowance > 0 ? t + allowance > window : generates ? t >= window : t > window));
  if (index < 0) return null;
  const prompt = plan.rowTokens[index]!;
  const row = rowCount(plan, index);
  const asks = allowance > 0 ? ` and max_tokens asks for ${allowance} more` : '';
  const needs = row.bound ? `up to ${prompt}` : `${prompt}`;
  // A prompt exactly the window's size is not "more" than it: it leaves nothing to generate.
  const message =
    (allowance === 0 && prompt === window
      ? `request too large: the prompt needs ${needs} tokens, all of the model's context window of ${window} tokens, leaving none to generate`
      : `request too large: the prompt needs ${needs} tokens${asks}, more than the model's context window of ${window} tokens`) +
    (row.bound ? ` (${BOUND_WHY})` : '');
  return {
    code: 'context_window_exceeded',
    message,
    details: {
      row_index: index,
      prompt_tokens: prompt,
      allowance,
      context_window: window,
      count_method: row.method,
    },
  };
}
