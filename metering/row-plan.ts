// The rows of a request and the output it may generate (SPEC §1, §11). A row is one prompt the
// model reads in full: a chat request is one row; a completions `prompt` array or an embeddings
// `input` array is one row per element. Counting is the counter's job; everything else is pure.
import type { ChatCount, ChatPrompt, CountMethod, TextCount, TokenCounter } from './types.js';

export type PlanEndpoint = 'chat' | 'completions' | 'embeddings';

/** One row before counting: text to tokenize, or a pre-tokenized row whose length is its count. */
export type Row = { kind: 'text'; text: string } | { kind: 'tokens'; length: number };

export class RowShapeError extends Error {
  constructor(readonly param: string, message: string) {
    super(message);
    this.name = 'RowShapeError';
  }
}

/**
 * Rows of a completions `prompt` or an embeddings `input`: a string, an array of strings, an array
 * of token ids, or an array of token-id arrays. Anything else is a `RowShapeError` naming `param`.
 */
export function textRows(value: unknown, param: 'prompt' | 'input'): Row[] {
  if (typeof value === 'string') return [{ kind: 'text', text: value }];
  if (!Array.isArray(value)) throw new RowShapeError(param, `${param} must be a string or an array`);
  if (value.length > 0 && value.every(isTokenId)) return [{ kind: 'tokens', length: value.length }];
  return value.map((row, i): Row => {
    if (typeof row === 'string') return { kind: 'text', text: row };
    if (Array.isArray(row) && row.every(isTokenId)) return { kind: 'tokens', length: row.length };
    throw new RowShapeError(param, `${param}[${i}] must be a string or an array of token ids`);
  });
}

/** A token id: a whole number from 0. */
export function isTokenId(v: unknown): boolean {
  return typeof v === 'number' && Number.isInteger(v) && v >= 0;
}

/** The request fields counting reads (already validated for types by the route's schema). */
export interface CountRequest {
  messages?: ChatPrompt['messages'];
  tools?: ChatPrompt['tools'];
  tool_choice?: unknown;
  format?: unknown;
  template?: ChatPrompt['template'];
  known?: ChatPrompt['known'];
  prompt?: unknown;
  /** Completions: text the model reads after every prompt (insertion), counted into each row. */
  suffix?: unknown;
  input?: unknown;
}

export interface RowCounts {
  rowTokens: number[];
  countMethod: CountMethod;
  upperBound: boolean;
  /** For each row, whether its count is an upper bound (a refusal names the row's own kind of figure). */
  rowUpperBound: boolean[];
  /**
   * For each row, the tokens of its count that are images counted above the least they can cost
   * (ADR 0022): the size checks take a row at its count less these. 0 for a row without images.
   */
  rowImageSlack: number[];
  /** Whether some text is counted as an upper bound (what a second, exact count can make exact). */
  textUpperBound: boolean;
  /** The chat count with its per-message prefix, for shared-prefix charging (chat only). */
  chat: ChatCount | null;
}

/** Count every row of a request with `counter` (the only step that may do I/O: llama.cpp). */
export async function countRows(
  kind: PlanEndpoint,
  model: string,
  request: CountRequest,
  counter: TokenCounter,
  signal?: AbortSignal,
): Promise<RowCounts> {
  if (kind === 'chat') {
    const prompt: ChatPrompt = { model, messages: request.messages ?? [] };
    if (request.tools !== undefined) prompt.tools = request.tools;
    if (request.tool_choice !== undefined) prompt.tool_choice = request.tool_choice;
    if (request.format !== undefined) prompt.format = request.format;
    if (request.template !== undefined) prompt.template = request.template;
    if (request.known !== undefined) prompt.known = request.known;
    const chat = await counter.countChat(prompt, signal);
    return {
      rowTokens: [chat.tokens],
      countMethod: chat.method,
      upperBound: chat.upperBound,
      rowUpperBound: [chat.upperBound],
      rowImageSlack: [chat.images ? chat.images.tokens - chat.images.least : 0],
      textUpperBound: chat.textUpperBound ?? chat.upperBound,
      chat,
    };
  }
  const rows = kind === 'completions' ? textRows(request.prompt, 'prompt') : textRows(request.input, 'input');
  const rowTokens: number[] = [];
  const rowUpperBound: boolean[] = [];
  let countMethod: CountMethod = counter.method;
  let upperBound = false;
  // One label for the request: an upper bound in any row makes the sum an upper bound.
  const bound = (c: TextCount) => {
    if (c.upperBound && !upperBound) {
      upperBound = true;
      countMethod = c.method;
    }
  };
  // A completions `suffix` is read with every prompt (insertion mode): each row carries it.
  const suffix = kind === 'completions' && typeof request.suffix === 'string' && request.suffix !== '' ? await counter.countText(request.suffix, signal) : null;
  if (suffix) bound(suffix);
  for (const row of rows) {
    const c = row.kind === 'tokens' ? { tokens: row.length, upperBound: false } : await counter.countText(row.text, signal);
    // Token ids are counted by length; the label stays the counter's (SPEC §11).
    if (row.kind === 'text') bound(c as TextCount);
    rowTokens.push(c.tokens + (suffix?.tokens ?? 0));
    rowUpperBound.push(c.upperBound || (suffix?.upperBound ?? false));
  }
  return { rowTokens, countMethod, upperBound, rowUpperBound, rowImageSlack: rowTokens.map(() => 0), textUpperBound: upperBound, chat: null };
}

export interface RowPlan {
  rows: number;
  rowTokens: number[];
  /** Tokens of the longest row (0 when there are no rows). */
  longestRow: number;
  /** The longest row with its images at the least they can cost: what the window is checked on (ADR 0022). */
  longestRowLeast: number;
  longestRowIndex: number;
  sumTokens: number;
  countMethod: CountMethod;
  upperBound: boolean;
  /** For each row, whether its count is an upper bound. */
  rowUpperBound: boolean[];
  /** For each row, its image tokens above the least they can cost (ADR 0022); zeros without images. */
  rowImageSlack: number[];
  /** Whether an image is counted above the least it can cost somewhere (a cause of `upperBound`). */
  imageBound: boolean;
  /** Whether some text is counted as an upper bound (the other cause). */
  textUpperBound: boolean;
  /** Output tokens the whole request may generate: per-row allowance × n × rows (chat: × n). */
  allowance: number;
  /** True when the client set `max_completion_tokens` / `max_tokens`. */
  explicitAllowance: boolean;
  /** What one choice of one row may generate: the figure checked against the context window. */
  perRowAllowance: number;
}

export interface RowPlanInput {
  kind: PlanEndpoint;
  rowTokens: number[];
  countMethod: CountMethod;
  upperBound: boolean;
  /** For each row, whether its count is an upper bound (default: every row as `upperBound`). */
  rowUpperBound?: boolean[];
  /** For each row, its image tokens above the least they can cost (default: none). */
  rowImageSlack?: number[];
  /** Whether some text is counted as an upper bound (default: `upperBound` when no image is a bound). */
  textUpperBound?: boolean;
  /** `max_completion_tokens ?? max_tokens` as the client sent it; null when it sent neither. */
  maxTokens: number | null;
  n: number;
  /** `defaults.maxTokens`: the per-choice allowance of a request that names none. */
  defaultMaxTokens: number;
  /** The model's context window in tokens, when known. */
  contextWindow: number | null;
}

/** Totals, longest row and allowance from counted rows. Pure. */
export function planRows(input: RowPlanInput): RowPlan {
  const { rowTokens } = input;
  const rowImageSlack = input.rowImageSlack ?? rowTokens.map(() => 0);
  const imageBound = rowImageSlack.some((s) => s > 0);
  let longestRow = 0;
  let longestRowIndex = 0;
  let longestLeast = 0;
  let sumTokens = 0;
  rowTokens.forEach((t, i) => {
    sumTokens += t;
    if (t > longestRow) {
      longestRow = t;
      longestRowIndex = i;
    }
    longestLeast = Math.max(longestLeast, t - (rowImageSlack[i] ?? 0));
  });
  // A default allowance is clamped to what the window leaves after the longest row taken at the
  // least its images can cost: an image bound never starves the output (ADR 0022).
  const a = allowanceFor(input, rowTokens.length, longestLeast);
  return {
    rows: rowTokens.length,
    rowTokens,
    longestRow,
    longestRowLeast: longestLeast,
    longestRowIndex,
    sumTokens,
    countMethod: input.countMethod,
    upperBound: input.upperBound,
    rowUpperBound: input.rowUpperBound ?? rowTokens.map(() => input.upperBound),
    rowImageSlack,
    imageBound,
    textUpperBound: input.textUpperBound ?? (input.upperBound && !imageBound),
    allowance: a.allowance,
    explicitAllowance: a.explicit,
    perRowAllowance: a.perRow,
  };
}

/**
 * SPEC §11: (`max_completion_tokens` ?? `max_tokens` ?? default) × n × rows for completions, × n for
 * chat, nothing for embeddings. A default allowance is clamped to what the window leaves after the
 * longest row (so it never causes a refusal by itself); an explicit one is the client's to keep and
 * is checked against the window instead (size-check.ts).
 */
export function allowanceFor(
  input: Pick<RowPlanInput, 'kind' | 'maxTokens' | 'n' | 'defaultMaxTokens' | 'contextWindow'>,
  rows: number,
  longestRow: number,
): { allowance: number; perRow: number; explicit: boolean } {
  if (input.kind === 'embeddings') return { allowance: 0, perRow: 0, explicit: false };
  const explicit = input.maxTokens !== null;
  let perRow = Math.max(0, input.maxTokens ?? input.defaultMaxTokens);
  if (!explicit && input.contextWindow !== null) {
    perRow = Math.min(perRow, Math.max(0, input.contextWindow - longestRow));
  }
  const n = Math.max(1, input.n);
  const allowance = perRow * n * (input.kind === 'completions' ? rows : 1);
  return { allowance, perRow, explicit };
}
