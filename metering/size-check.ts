// The 413 checks on a request's own size, in the order SPEC §11 fixes (the first failure answers):
// too_many_rows → row_too_large → request_tokens_exceeded → context_window_exceeded.
// `body_too_large` comes earlier still, in the HTTP layer, before the body is parsed.
//
// A figure that is an upper bound says so: the planner counts a request exactly before refusing it
// wherever it can (ADR 0010, 0019), so a bound reaches a refusal only when the exact count was out
// of reach, and the client is told why the figure is not exact. Images, whose size the gateway
// does not know, are taken at the least they can cost here (ADR 0022): a request is refused for its
// size only when it is too large whatever its images turn out to cost, and the figure says so.
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
  | 'rows'
  | 'rowTokens'
  | 'sumTokens'
  | 'countMethod'
  | 'upperBound'
  | 'rowUpperBound'
  | 'rowImageSlack'
  | 'textUpperBound'
  | 'explicitAllowance'
  | 'perRowAllowance'
>;

const BOUND_SUFFIX = ':upper-bound';
const PARTIAL_SUFFIX = ':partial';
const BOUND_WHY = 'an upper bound: text without spaces too long to count exactly';
const LEAST_WHY = 'a lower bound: images counted at the least they can cost';
const BOTH_WHY = 'text without spaces too long to count exactly counted as an upper bound, images at the least they can cost';
const ESTIMATE_WHY = 'an estimate, UTF-8 bytes ÷ 4: no tokenizer here knows this model';

/** A size figure as a refusal states it: the tokens, a word saying what kind of figure, why, and its label. */
interface SizeFigure {
  tokens: number;
  kind: 'exact' | 'upper' | 'lower' | 'mixed' | 'estimate';
  method: CountMethod;
}

/**
 * `tokens` with `slack` image tokens above their least taken off, as a refusal may rest on it:
 * exact, an upper bound (text), a lower bound (images), or both at once.
 */
function sizeFigure(plan: PlanFigures, tokens: number, slack: number, textBound: boolean): SizeFigure {
  // A count that leaves out files or audio (`:partial`, server/pipeline/endpoints.ts) is at least
  // what it says: a refusal on it stands, and its exact figure keeps the label.
  const partial = plan.countMethod.endsWith(PARTIAL_SUFFIX);
  const base = plan.countMethod.replace(/:(upper-bound|partial)$/, '');
  // No tokenizer here knows the model: the figure is the byte estimate, and is said to be one
  // (SPEC §2: never a guess presented as a measurement). The limits still hold on it — it is the
  // only figure there is, and a request past them by it is large by any count (ADR 0010).
  if (base.startsWith('estimate:')) return { tokens: tokens - slack, kind: 'estimate', method: plan.countMethod };
  if (slack > 0 && !textBound) return { tokens: tokens - slack, kind: 'lower', method: `${base}:lower-bound` as CountMethod };
  if (slack > 0) return { tokens: tokens - slack, kind: 'mixed', method: plan.countMethod };
  // The request's label is an upper bound's when any row is one; an exact row keeps the exact label.
  if (textBound) return { tokens, kind: 'upper', method: `${base}${BOUND_SUFFIX}` as CountMethod };
  return { tokens, kind: 'exact', method: (partial ? `${base}${PARTIAL_SUFFIX}` : base) as CountMethod };
}

/** Row `i` as its size is checked. */
function rowFigure(plan: PlanFigures, i: number): SizeFigure {
  const slack = plan.rowImageSlack[i] ?? 0;
  const bound = plan.rowUpperBound[i] ?? plan.upperBound;
  // A row with images is a bound because of them; its text is a bound only if the request's is.
  return sizeFigure(plan, plan.rowTokens[i]!, slack, bound && (slack === 0 || plan.textUpperBound));
}

const why = (f: SizeFigure): string =>
  f.kind === 'upper' ? ` (${BOUND_WHY})` : f.kind === 'lower' ? ` (${LEAST_WHY})` : f.kind === 'mixed' ? ` (${BOTH_WHY})` : f.kind === 'estimate' ? ` (${ESTIMATE_WHY})` : '';

/** How a refusal's sentence states a figure of its kind. */
const stated = (f: SizeFigure, upper: string): string =>
  f.kind === 'upper' ? `${upper} ${f.tokens}` : f.kind === 'lower' ? `at least ${f.tokens}` : f.kind === 'estimate' ? `about ${f.tokens}` : `${f.tokens}`;

/** `too_many_rows`, or null: decided on the number of rows alone, before any is counted. */
export function tooManyRows(rows: number, maxRows: number = DEFAULT_SIZE_LIMITS.maxRows): SizeRefusal | null {
  if (rows <= maxRows) return null;
  return { code: 'too_many_rows', message: `too many rows: ${rows}, the limit is ${maxRows}`, details: { rows, limit: maxRows } };
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

  const rowsRefusal = tooManyRows(plan.rows, maxRows);
  if (rowsRefusal) return rowsRefusal;

  // The first row over the limit is reported, so the client can find it.
  const big = plan.rowTokens.findIndex((_, i) => rowFigure(plan, i).tokens > maxRowTokens);
  if (big >= 0) {
    const row = rowFigure(plan, big);
    const t = row.tokens;
    const has = stated(row, 'up to');
    return {
      code: 'row_too_large',
      message: `too many tokens: one row has ${has} tokens, the limit is ${maxRowTokens} per row${why(row)}`,
      details: { row_index: big, row_tokens: t, limit: maxRowTokens, count_method: row.method },
    };
  }

  const slack = plan.rowImageSlack.reduce((a, b) => a + b, 0);
  const sum = sizeFigure(plan, plan.sumTokens, slack, slack > 0 ? plan.textUpperBound : plan.upperBound);
  if (sum.tokens > maxRequestTokens) {
    const addUp = stated(sum, 'as many as');
    return {
      code: 'request_tokens_exceeded',
      message: `too many tokens: the rows add up to ${addUp} tokens, the limit is ${maxRequestTokens}${why(sum)}`,
      details: { rows: plan.rows, sum_tokens: sum.tokens, limit: maxRequestTokens, count_method: sum.kind === 'exact' ? method : sum.method },
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
  const over = (t: number) => (allowance > 0 ? t + allowance > window : generates ? t >= window : t > window);
  const index = plan.rowTokens.findIndex((_, i) => over(rowFigure(plan, i).tokens));
  if (index < 0) return null;
  const row = rowFigure(plan, index);
  const prompt = row.tokens;
  // A prompt over the window is refused for itself, in the shape of SPEC §11's first message, whatever
  // max_tokens asks; the output asked is named where it is what crosses the window. A prompt
  // exactly the window's size is not "more" than it: the one token it must leave to generate is.
  const asks = prompt > window ? '' : allowance > 0 ? ` and max_tokens asks for ${allowance} more` : generates && prompt === window ? ' and 1 more to generate' : '';
  const needs = stated(row, 'up to');
  const message = `request too large: the prompt needs ${needs} tokens${asks}, more than the model's context window of ${window} tokens` + why(row);
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

/** Tokens every chat message costs in an OpenAI-family count, whatever it says (the cookbook's 3). */
export const TOKENS_PER_MESSAGE = 3;

/**
 * Messages and tool parameters below which a request is always counted before it is refused: that
 * costs a few milliseconds, and the refusal then has its exact figures (SPEC §6) and its place in
 * the order of checks (a floor can tell only that a row is too large, not which check comes first).
 */
export const FLOOR_MIN_UNITS = 4096;

/**
 * A chat request with more messages than its limits can hold at the tokens each message costs
 * whatever it says: refused before it is counted, on that lower bound (counting 200,000 messages
 * one by one held the event loop for seconds). Only for a tiktoken count, whose per-message cost
 * is fixed, and only for so many messages and parameters that counting them would cost something
 * (FLOOR_MIN_UNITS); `null` when the messages alone cannot decide. Only the row and sum limits are
 * decided so: they come before the window in SPEC §11's order, and a request within them costs no
 * more to count than one that is admitted. (A floor past a small window once answered
 * `context_window_exceeded` where counting found the row too large, the check that comes first.)
 */
export function messageFloorRefusal(
  messages: number,
  method: CountMethod,
  limits: Partial<SizeLimits> = {},
  /** The tools' parameters and enum values, less one an enum (`toolParametersAtLeast`): each costs TOKENS_PER_MESSAGE too. */
  toolParameters = 0,
): SizeRefusal | null {
  if (!method.startsWith('tiktoken:') || messages + toolParameters <= FLOOR_MIN_UNITS) return null;
  const { maxRowTokens, maxRequestTokens } = { ...DEFAULT_SIZE_LIMITS, ...limits };
  // The reply's priming (3 tokens) is in every count too.
  const floor = messages * TOKENS_PER_MESSAGE + TOKENS_PER_MESSAGE + toolParameters * TOKENS_PER_MESSAGE;
  const label = `${method.replace(/:(upper-bound|partial)$/, '')}:lower-bound` as CountMethod;
  const params = toolParameters > 0 ? ` and ${toolParameters} tool parameters and enum values (less one an enum)` : '';
  const why = `a lower bound: ${messages} messages${params} at ${TOKENS_PER_MESSAGE} tokens each, before what they say`;
  if (floor > maxRowTokens) {
    return {
      code: 'row_too_large',
      message: `too many tokens: one row has at least ${floor} tokens, the limit is ${maxRowTokens} per row (${why})`,
      details: { row_index: 0, row_tokens: floor, limit: maxRowTokens, count_method: label },
    };
  }
  if (floor > maxRequestTokens) {
    return {
      code: 'request_tokens_exceeded',
      message: `too many tokens: the rows add up to at least ${floor} tokens, the limit is ${maxRequestTokens} (${why})`,
      details: { rows: 1, sum_tokens: floor, limit: maxRequestTokens, count_method: label },
    };
  }
  return null;
}

/**
 * A lower bound, in units of TOKENS_PER_MESSAGE (3 tokens), on what a tool offer's parameters cost
 * in the tiktoken count (metering/tokenizers/tiktoken-counter.ts, the cookbook's figures): each
 * parameter's key 3, and each enum on it (its own, its items') −3 and 3 an item; the texts, and
 * the 3 a nested group adds, only add to that. Function tools only, as the count reads them, and
 * nested no deeper than it does. So a tool of a million parameters, or an enum of millions of
 * values, is refused on this floor before its texts are built and counted (that took 17 and 32 s).
 */
export function toolParametersAtLeast(tools: readonly unknown[] | null): number {
  let units = 0;
  const enumUnits = (e: unknown) => (Array.isArray(e) ? e.length - 1 : 0);
  const walk = (holder: unknown, depth: number): void => {
    if (holder === null || typeof holder !== 'object') return;
    const props = (holder as Record<string, unknown>).properties;
    if (props === null || typeof props !== 'object' || Array.isArray(props)) return;
    for (const key in props) {
      units += 1;
      const prop = (props as Record<string, unknown>)[key];
      if (prop === null || typeof prop !== 'object') continue;
      const { enum: own, items } = prop as Record<string, unknown>;
      units += enumUnits(own);
      // The count stops here at its depth bound: neither the items' enum nor anything nested.
      if (depth + 1 >= 32) continue;
      const itemsObject = items !== null && typeof items === 'object' && !Array.isArray(items) ? (items as Record<string, unknown>) : null;
      if (itemsObject) units += enumUnits(itemsObject.enum);
      walk(prop, depth + 1);
      walk(itemsObject, depth + 1);
    }
  };
  for (const tool of tools ?? []) {
    if (tool === null || typeof tool !== 'object') continue;
    const { type, function: fn } = tool as Record<string, unknown>;
    if (type !== undefined && type !== 'function') continue;
    if (fn !== null && typeof fn === 'object') walk((fn as Record<string, unknown>).parameters, 0);
  }
  return Math.max(0, units);
}
