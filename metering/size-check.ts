// The 413 checks on a request's own size, in the order SPEC §11 fixes (the first failure answers):
// too_many_rows → row_too_large → request_tokens_exceeded → context_window_exceeded.
// `body_too_large` comes earlier still, in the HTTP layer, before the body is parsed.
import type { RowPlan } from './row-plan.js';

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
  'rows' | 'rowTokens' | 'sumTokens' | 'countMethod' | 'explicitAllowance' | 'perRowAllowance'
>;

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
    return {
      code: 'row_too_large',
      message: `too many tokens: one row has ${t} tokens, the limit is ${maxRowTokens} per row`,
      details: { row_index: big, row_tokens: t, limit: maxRowTokens, count_method: method },
    };
  }

  if (plan.sumTokens > maxRequestTokens) {
    return {
      code: 'request_tokens_exceeded',
      message: `too many tokens: the rows add up to ${plan.sumTokens} tokens, the limit is ${maxRequestTokens}`,
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
  const asks = allowance > 0 ? ` and max_tokens asks for ${allowance} more` : '';
  // A prompt exactly the window's size is not "more" than it: it leaves nothing to generate.
  const message =
    allowance === 0 && prompt === window
      ? `request too large: the prompt needs ${prompt} tokens, all of the model's context window of ${window} tokens, leaving none to generate`
      : `request too large: the prompt needs ${prompt} tokens${asks}, more than the model's context window of ${window} tokens`;
  return {
    code: 'context_window_exceeded',
    message,
    details: {
      row_index: index,
      prompt_tokens: prompt,
      allowance,
      context_window: window,
      count_method: plan.countMethod,
    },
  };
}
