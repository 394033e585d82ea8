// Stage 3 — plan (SPEC §2): rows, tokens per row, size refusals, the conversation and run, the
// shared prefix and charge, the allowance, the worst-case cost and the mode. Calls no model; a
// llama.cpp upstream may be asked to tokenize. Used by the real request and by /v1/admission alike.

import type { IncomingMessage } from 'node:http';
import { GatewayError, stoppedByShutdown } from '../errors.js';
import type { Gateway } from '../gateway.js';
import type { Principal } from '../auth.js';
import type { Upstream } from '../upstreams.js';
import { defaultAllowance } from '../config.js';
import { mayAnswerInAudio, planCountMethod, type ValidRequest } from './endpoints.js';
import { TEMPLATE_FIELDS, type ChatCount, type ChatMessage, type KnownPrefix, type TokenCounter } from '../../metering/types.js';
import type { ConversationHead, RunState } from '../../metering/ledger.js';
import { countRows, planRows, type RowCounts, type RowPlan } from '../../metering/row-plan.js';
import { checkSizes, messageFloorRefusal, tooManyRows, toolParametersAtLeast } from '../../metering/size-check.js';
import { inspectRun, chainHashes, runKey, type RunInspection } from '../../metering/runs/run-state.js';
import { answerReserveFor, decideMode, mergeRunBounds, type RunBounds, type FinalReason } from '../../metering/runs/bounds.js';
import { toFinalAnswerRequest } from '../../metering/runs/final-answer.js';
import { sha256Hex, canonicalJson } from '../../metering/canonical-json.js';
import { uuidV7 } from '../../metering/ids.js';
import { sharedPrefixTokens, promptChargeFor } from '../../metering/charge.js';
import type { ModelPrice } from '../../pricing/model-price.js';
import { worstCaseUsd } from '../../pricing/turn-cost.js';
import { BYTES_PER_ESTIMATED_TOKEN } from '../../metering/tokenizers/byte-estimate.js';
import { EXACT_RECOUNT_BUDGET } from '../../metering/tokenizers/bounded-encode.js';
import { LlamaCppCountError } from '../../metering/tokenizers/llamacpp-counter.js';
import { redactBodyText } from './upstream-key.js';
import { runBudgetFor } from '../../metering/stores/admission-check.js';
import { ageMs } from '../../metering/clock-skew.js';

export interface Headers {
  [name: string]: string | string[] | undefined;
}

export interface Plan {
  id: string;
  time: number;
  valid: ValidRequest;
  principal: Principal;
  upstream: Upstream;
  model: string;
  /** The body that will be forwarded (final-answer mode rewrites it). */
  forwardBody: Record<string, unknown>;
  rows: RowPlan;
  /**
   * The longest row of the request as sent, as the context-window check took it (its images at the
   * least they can cost, ADR 0022). It is `rows.longestRowLeast` except in final-answer mode, where
   * `rows` is the rewritten request's.
   */
  sentLongestRow: number;
  contextWindow: number | null;
  conversation: string;
  conversationSource: 'header' | 'inferred' | 'new';
  parent: string | null;
  run: string;
  runState: RunState | null;
  runInspection: RunInspection | null;
  bounds: RunBounds;
  chain: string[];
  chatCount: ChatCount | null;
  /** The exact second counter counted this plan (ADR 0019): a count still an upper bound stays one. */
  countedExactly: boolean;
  toolHash: string;
  sharedPrefixTokens: number;
  promptCharge: number;
  /** Output tokens reserved: per-choice allowance × n (× rows for completions). */
  allowance: number;
  /** What each choice of each row may generate. */
  perChoiceAllowance: number;
  mode: 'normal' | 'final-answer';
  /**
   * A final answer whose own request cannot fit the model's window or the size limits: no model is
   * called, the run ends with the evidence excerpt, and nothing is charged.
   */
  excerptOnly: boolean;
  finalReason: FinalReason | null;
  /**
   * A tool round sent as the final answer for want of tokens alone (neither a bound nor its size
   * made it one): its charge and priced prompt as the round it was, which a smaller max_tokens
   * would still send (`max_affordable_allowance`, server/pipeline/budgets.ts).
   */
  roundAsSent: { promptCharge: number; worstPromptTokens: number } | null;
  /** Run-token refusal decided while planning (the atomic check happens again at admission). */
  tokenRefusal: { remainingTokens: number; neededTokens: number } | null;
  price: ModelPrice | null;
  /** The request may be answered in audio (`mayAnswerInAudio`): its output is reserved at the audio rate. */
  audioOutput: boolean;
  worstCaseUsd: number | null;
  /**
   * Tokens of a chat request's `prediction` (Predicted Outputs): the part the model does not use is
   * billed as output, beyond `max_tokens`, so the money worst case holds it whole. 0 without one.
   */
  predictionTokens: number;
  month: string;
  head: ConversationHead | null;
}

/** An assistant turn with its reasoning in it, which some templates render by where it stands. */
export function carriesReasoning(m: ChatMessage): boolean {
  if (m.role !== 'assistant') return false;
  const { reasoning_content: rc, reasoning, content } = m as ChatMessage & { reasoning_content?: unknown; reasoning?: unknown };
  return (typeof rc === 'string' && rc !== '') || (typeof reasoning === 'string' && reasoning !== '') || (typeof content === 'string' && content.includes('<think>'));
}

/**
 * A tool round: a request that offers tools and goes as sent. It must leave the run's answer
 * reserve untouched (SPEC §11); past that it goes as the final answer instead.
 */
export function isToolRound(plan: Plan): boolean {
  return plan.mode === 'normal' && (plan.valid.tools !== null || Array.isArray(plan.valid.body.functions));
}

/**
 * Whether a request refused for its size — by the gateway, or by the upstream for a window the
 * gateway did not know — is answered instead: a chat research round (it offers tools) in a run
 * whose tools have already run, so there is evidence to answer from.
 */
export function answersInstead(valid: ValidRequest, writeTools: readonly string[]): boolean {
  if (valid.kind !== 'chat' || !valid.messages) return false;
  if (valid.tools === null && !Array.isArray(valid.body.functions)) return false;
  return inspectRun(valid.messages, writeTools).toolRounds > 0;
}

/** Longest conversation id a client may name: its spend and cap routes take it in their path. */
export const MAX_CONVERSATION_ID_LENGTH = 256;
const PRINTABLE_ASCII = /^[\x20-\x7e]+$/;

/** Whether `s` can name a conversation: what a client can send in a header, and what routes take. */
export function isConversationId(s: string): boolean {
  // Spaces at either end can never arrive: a header's value is trimmed.
  return s.length > 0 && s.length <= MAX_CONVERSATION_ID_LENGTH && PRINTABLE_ASCII.test(s) && s.trim() === s;
}

/** A conversation id from a header (trimmed; absent or blank is null), refused unless printable ASCII of a bounded length. */
function idHeader(headers: Headers, name: string): string | null {
  const v = headers[name];
  // Sent twice, the two ids would reach here joined (`a, b`) as one id nobody named.
  if (Array.isArray(v) && v.length > 1) {
    throw new GatewayError('invalid_request', `${name}: sent ${v.length} times, name one conversation`, {}, name);
  }
  const s = (Array.isArray(v) ? v[0] : v)?.trim();
  if (!s) return null;
  if (!isConversationId(s)) {
    throw new GatewayError('invalid_request', `${name}: must be at most ${MAX_CONVERSATION_ID_LENGTH} printable ASCII characters`, {}, name);
  }
  return s;
}

/** The conversation headers, `x-tollgate-conversation` and `x-tollgate-parent`. */
const ID_HEADERS = ['x-tollgate-conversation', 'x-tollgate-parent'] as const;

/**
 * A request's headers as planning reads them: the conversation headers each as every value it was
 * sent with (Node joins a repeated header's values with ", ", which would make an id of them).
 */
export function planHeaders(raw: IncomingMessage): Headers {
  const headers: Headers = { ...raw.headers };
  for (const name of ID_HEADERS) {
    const all = raw.headersDistinct[name];
    if (all !== undefined) headers[name] = all.length === 1 ? all[0] : all;
  }
  return headers;
}

/** A conversation another tenant owns, named as the request's own or above it: a 400 (ids are global). */
export function ownerError(conversation: string, param: 'x-tollgate-conversation' | 'x-tollgate-parent'): GatewayError {
  return new GatewayError('invalid_request', `conversation "${conversation}" belongs to another tenant: choose another id`, {}, param);
}

export function monthOf(ms: number): string {
  return new Date(ms).toISOString().slice(0, 7);
}

/** What a chat request offers the model besides its messages: its tools, tool choice and output schema (null: nothing). */
function offerOf(valid: ValidRequest): Record<string, unknown> | null {
  const body = valid.body;
  // The legacy `function_call` is the tool choice of a legacy `functions` offer.
  const choice = body.tool_choice ?? body.function_call;
  const format = formatOf(body);
  if (!valid.tools && choice === undefined && format === undefined) return null;
  // A structured-output schema is read with the tools, before the messages: part of the offer.
  return { tools: valid.tools ?? null, tool_choice: choice ?? null, ...(format === undefined ? {} : { format }) };
}

function toolHashOf(valid: ValidRequest): string {
  const offer = offerOf(valid);
  // As sent, keys in their order: a template prints the tools' JSON as it came (llama.cpp's
  // `tojson`), so the same tools with their keys reordered are another prompt, cached or not.
  return offer === null ? '' : sha256Hex(JSON.stringify(offer));
}

/**
 * The offer's hash as heads written before the twentieth session hold it (canonical JSON). A head
 * holding it is taken for the same offer when it matches, so that no conversation open at the
 * upgrade is charged in full on its next turn for a change of hashing alone. Canonical JSON cannot
 * tell key orders apart: on that one turn a reordered offer is credited, as it was before the
 * change. The two never collide: canonical JSON puts `tool_choice` before `tools`, the offer as
 * sent the other way round.
 */
function legacyToolHashOf(valid: ValidRequest): string {
  const offer = offerOf(valid);
  return offer === null ? '' : sha256Hex(canonicalJson(offer));
}

/** The structured-output schema of a chat request (`response_format.json_schema`), if it has one. */
function formatOf(body: Record<string, unknown>): unknown {
  const rf = body.response_format;
  if (rf === null || typeof rf !== 'object') return undefined;
  const { type, json_schema: schema } = rf as Record<string, unknown>;
  return type === 'json_schema' && schema !== null && typeof schema === 'object' ? schema : undefined;
}

/** The request's fields a server's chat template renders with (`TEMPLATE_FIELDS`); a final answer has no tool fields. */
function templateFields(body: Record<string, unknown>, finalAnswer: boolean): Record<string, unknown> | undefined {
  let found: Record<string, unknown> | undefined;
  for (const field of TEMPLATE_FIELDS) {
    if (body[field] === undefined || (finalAnswer && (field === 'tool_choice' || field === 'parallel_tool_calls'))) continue;
    (found ??= {})[field] = body[field];
  }
  return found;
}

/**
 * Counts every row with the model's own tokenizer (metering/row-plan.ts `countRows`). `finalMessages`
 * counts the final-answer request instead: its messages, and no tools. `exact` is the tokenizer's
 * exact second counter, when the plan needs one.
 */
async function countAll(
  gw: Gateway,
  upstream: Upstream,
  valid: ValidRequest,
  finalMessages?: ChatMessage[],
  known?: KnownPrefix,
  exact?: TokenCounter,
): Promise<RowCounts> {
  const body = valid.body;
  const request =
    valid.kind !== 'chat'
      ? { prompt: body.prompt, suffix: body.suffix, input: body.input }
      : finalMessages
        ? { messages: finalMessages, format: formatOf(body), template: templateFields(body, true) }
        : { messages: valid.messages ?? [], tools: valid.tools ?? undefined, tool_choice: body.tool_choice, format: formatOf(body), template: templateFields(body, false), known };
  // A stopping gateway that can wait no longer stops counts still waiting on a server (llama.cpp).
  const stopping = gw.drain.signal;
  try {
    return await countRows(valid.kind, valid.model, request, exact ?? gw.counters.forModel(upstream, valid.model), stopping);
  } catch (err) {
    if (stopping.aborted) throw stoppedByShutdown();
    // The exact count failed (its worker died): the first count stands, upper bound and all.
    if (exact) {
      gw.log.warn({ upstream: upstream.name, err: (err as Error).message }, 'exact count failed, using the first count');
      return countAll(gw, upstream, valid, finalMessages, known);
    }
    // The model's own tokenizer is out of reach (a llama.cpp server down): plan with the byte
    // estimate, labelled as such, rather than refuse; the upstream call will tell the rest.
    const due = gw.warnings.due(`tokenizer-down:${upstream.name}`);
    // What the server said may quote the prompt: logged only where prompts are (`logging.prompts`).
    // Never the upstream's key, though: a server (or a proxy before it) may echo the request's headers.
    const said = gw.config.logging.prompts && err instanceof LlamaCppCountError && err.upstreamText ? { upstream_text: redactBodyText(err.upstreamText, upstream.apiKey).slice(0, 200) } : {};
    if (due) gw.log.warn({ upstream: upstream.name, err: (err as Error).message, ...said, held_back: due.heldBack }, 'tokenizer unavailable, using byte estimate');
    return countRows(valid.kind, valid.model, request, gw.counters.estimate);
  }
}

/**
 * A head or run start written ahead of this clock by more than replicas' clocks differ: this
 * clock was stepped back since (or the writer's is far ahead). The charge and the run's time take
 * such an age as unknown (metering/clock-skew.ts); the operator is told, once a minute at most,
 * since every conversation open across the step says the same.
 */
function warnIfClockStepped(gw: Gateway, now: number, ...written: Array<number | undefined>): void {
  const ahead = written.filter((w): w is number => w !== undefined && ageMs(now, w) === null);
  if (ahead.length === 0) return;
  const aheadMs = Math.max(...ahead) - now;
  const due = gw.warnings.due('clock-stepped-back');
  if (due) gw.log.warn({ ahead_ms: aheadMs, held_back: due.heldBack }, 'the ledger holds times ahead of this clock (was it stepped back?): their prefixes are charged in full and their runs end with their answer');
}

/**
 * Whether a request is small enough for the exact second count: its texts, as JSON, within the
 * recount's budget, so that one request never costs the worker more than about half a second.
 */
export function recountable(valid: ValidRequest): boolean {
  const texts = valid.kind === 'chat' ? [valid.messages, valid.tools] : valid.kind === 'completions' ? valid.body.prompt : valid.body.input;
  return JSON.stringify(texts ?? null).length <= EXACT_RECOUNT_BUDGET;
}

async function resolveConversation(gw: Gateway, headers: Headers, principal: Principal, chain: string[]) {
  const named = idHeader(headers, 'x-tollgate-conversation');
  if (named) return { conversation: named, source: 'header' as const };
  if (chain.length > 0) {
    // The most recent head among this request's leading lists (SPEC §8), whatever the prefix memo
    // holds: the memo is a cache, and the conversation a request joins may not depend on what this
    // process happens to remember (ADR 0014: a warm memo once preferred the longest remembered list,
    // so a restart moved a request to another conversation and charged it another prefix).
    const found = await gw.ledger.findConversationByChain(principal.keyId, principal.tenant, chain);
    // A request that names its parent belongs to a child of that parent: a sub-agent forked from
    // its parent's messages resends them, and was taken into the parent's own conversation (or, a
    // level down, the grandparent's) — no child link, and the parent, its head moved, began a new
    // conversation and run at its next turn. It is inferred only into a conversation whose parent
    // is the one it names.
    const parent = idHeader(headers, 'x-tollgate-parent');
    if (found && (parent === null || (await gw.ledger.conversationSpend(found))?.parent === parent)) return { conversation: found, source: 'inferred' as const };
  }
  return { conversation: `conv-${uuidV7()}`, source: 'new' as const };
}

/** The size figures of a plan, as /v1/admission shows them (also for a request refused for size). */
export function rowFigures(model: string, upstream: string, rows: RowPlan, contextWindow: number | null) {
  return {
    model,
    upstream,
    rows: rows.rows,
    row_tokens: rows.rowTokens,
    longest_row: rows.longestRow,
    longest_row_index: rows.longestRowIndex,
    sum_tokens: rows.sumTokens,
    count_method: rows.countMethod,
    count_is_upper_bound: rows.upperBound,
    context_window: contextWindow,
  };
}

/**
 * The tokens of a chat request's `prediction` content (a string, or text parts), counted as the
 * model's output would be. Where no tokenizer here knows the model, or it is out of reach, one
 * token per byte, as the prompt is held (`worstPromptTokens`): the byte estimate is no bound.
 */
async function predictionTokens(gw: Gateway, upstream: Upstream, valid: ValidRequest): Promise<number> {
  const prediction = valid.kind === 'chat' ? valid.body.prediction : undefined;
  if (prediction === null || typeof prediction !== 'object') return 0;
  const content = (prediction as Record<string, unknown>).content;
  const parts = typeof content === 'string' ? [content] : Array.isArray(content) ? content.map((p) => (typeof (p as { text?: unknown })?.text === 'string' ? (p as { text: string }).text : '')) : [];
  const text = parts.join('');
  if (text === '') return 0;
  try {
    const counted = await gw.counters.forModel(upstream, valid.model).countText(text);
    return counted.method === 'estimate:bytes' ? Buffer.byteLength(text, 'utf8') : counted.tokens;
  } catch {
    return Buffer.byteLength(text, 'utf8');
  }
}

/**
 * The prompt tokens money is reserved for: the count, or — for the byte estimate, which is no
 * bound (a prompt may hold a token per byte, four times the estimate) — four times it, so a cap
 * holds whatever the model's tokenizer turns out to be.
 */
export function worstPromptTokens(rows: Pick<RowPlan, 'countMethod' | 'sumTokens'>): number {
  return rows.countMethod === 'estimate:bytes' ? rows.sumTokens * BYTES_PER_ESTIMATED_TOKEN : rows.sumTokens;
}

export interface PlanOptions {
  /**
   * Planning for `/v1/admission`: nothing this process keeps is changed either. (The prefix memo
   * remembered the list, and the real request that followed could then infer another
   * conversation than it would have without the admission call.)
   */
  dryRun?: boolean;
  /**
   * Count with the exact second counter from the start (ADR 0019): for a plan whose budget
   * decision rested on an upper bound (server/pipeline/plan-exact.ts).
   */
  exact?: boolean;
  /**
   * The upstream refused the request as sent for its context window: a research round after tools
   * then goes as its final answer, as one past a known window does — within the window the refusal
   * named, or the one known here if smaller.
   */
  outgrown?: { contextWindow: number | null };
}

/** A request with more than this many times `limits.maxRows` rows is refused without counting any. */
const ROWS_COUNTED_PAST_LIMIT = 4;

export async function plan(gw: Gateway, valid: ValidRequest, principal: Principal, headers: Headers, opts: PlanOptions = {}): Promise<Plan> {
  const time = gw.clock();
  const upstream = gw.upstreams.route(valid.model);
  if (!upstream) {
    throw new GatewayError('model_not_found', `The model \`${valid.model}\` does not exist or is not served by this gateway`, {}, 'model');
  }
  // After the upstream refused the request for its window, the smaller of the two holds: the one
  // known here may be unknown, or configured larger than the server's.
  const knownWindow = await gw.counters.contextWindow(upstream, valid.model);
  const namedWindow = opts.outgrown?.contextWindow ?? null;
  const contextWindow = knownWindow === null || namedWindow === null ? (knownWindow ?? namedWindow) : Math.min(knownWindow, namedWindow);

  // 1. Rows and their tokens; the 413 checks in SPEC §11's order. Leading messages this process
  // has seen in an earlier turn keep their chain and counts (metering/prefix-memo.ts).
  const messages = valid.messages;
  const memoScope = principal.keyId ?? `tenant:${principal.tenant}`;
  const remembered = messages ? gw.prefixMemo.match(memoScope, messages) : null;
  const known = remembered?.counts ? { messages: remembered.length, ...remembered.counts } : undefined;
  // A dry run's exact count is kept by no cache: /v1/admission changes nothing a later request counts.
  const exactCounter = () => (recountable(valid) ? gw.counters.forModel(upstream, valid.model).exactly?.({ remember: !opts.dryRun }) : undefined);
  // Every count of this plan uses it once it is needed (the final-answer request's too).
  let counter = opts.exact ? exactCounter() : undefined;
  // Far too many rows are refused before any row is counted (SPEC §11 checks rows first): counting
  // six million embeddings inputs only to refuse them held the event loop for 40 s. A request just
  // past the limit is counted, so that its refused plan still shows each row's tokens.
  const rowsRefusal = valid.rows > ROWS_COUNTED_PAST_LIMIT * gw.config.limits.maxRows ? tooManyRows(valid.rows, gw.config.limits.maxRows) : null;
  if (rowsRefusal) {
    const err = new GatewayError(rowsRefusal.code, rowsRefusal.message, rowsRefusal.details);
    err.context = { model: valid.model, upstream: upstream.name, rows: valid.rows, context_window: contextWindow };
    throw err;
  }
  // A research round whose tools alone put it past the limits' floor goes as its tools-free final
  // answer, as one past its count does (below): it is counted without its tools, so that counting
  // them only to drop them costs nothing.
  let toolsPastFloor = false;
  if (messages) {
    const method = gw.counters.forModel(upstream, valid.model).method;
    const floorWith = (toolParameters: number) => messageFloorRefusal(messages.length, method, gw.config.limits, toolParameters);
    const toolParameters = toolParametersAtLeast(valid.tools);
    let floor = floorWith(toolParameters);
    if (floor && toolParameters > 0 && answersInstead(valid, gw.config.runs.writeTools)) {
      floor = floorWith(0);
      toolsPastFloor = floor === null;
    }
    if (floor) {
      const err = new GatewayError(floor.code, floor.message, floor.details);
      err.context = { model: valid.model, upstream: upstream.name, rows: 1, context_window: contextWindow };
      throw err;
    }
  }
  const countAsSent = (c: TokenCounter | undefined) => (toolsPastFloor ? countAll(gw, upstream, valid, messages!, undefined, c) : countAll(gw, upstream, valid, undefined, known, c));
  let counted = await countAsSent(counter);
  const rowsOf = (c: RowCounts) =>
    planRows({
      kind: valid.kind,
      rowTokens: c.rowTokens,
      countMethod: planCountMethod(c.countMethod, valid),
      upperBound: c.upperBound,
      rowUpperBound: c.rowUpperBound,
      rowImageSlack: c.rowImageSlack,
      textUpperBound: c.textUpperBound,
      maxTokens: valid.maxTokens,
      n: valid.generations,
      defaultMaxTokens: defaultAllowance(gw.config, upstream.config).tokens,
      contextWindow,
    });
  let rows = rowsOf(counted);
  let sizeRefusal = checkSizes(rows, gw.config.limits, contextWindow, valid.kind !== 'embeddings');
  // A refusal on an upper bound gets a second, exact count first where the request is small
  // enough (ADR 0010, 0019): refused only when the true count is too large too. (Images need no
  // second count: the size checks already take them at the least they can cost, ADR 0022.)
  if (sizeRefusal && counted.textUpperBound && counter === undefined) counter = exactCounter();
  if (sizeRefusal && counted.textUpperBound && counter !== undefined) {
    counted = await countAsSent(counter);
    rows = rowsOf(counted);
    sizeRefusal = checkSizes(rows, gw.config.limits, contextWindow, valid.kind !== 'embeddings');
  }
  const countedAsSent = counted;
  const sentLongestRow = rows.longestRowLeast;
  // A research round that outgrew the window (or a size limit) after tools have run is answered
  // instead: the run goes to its tools-free final answer (seed 001, SPEC §5: a run always ends in
  // an answer). A first request too large, or one that is itself an answer, is refused as before.
  const outgrown = toolsPastFloor || ((sizeRefusal !== null || opts.outgrown !== undefined) && answersInstead(valid, gw.config.runs.writeTools));
  if (outgrown) sizeRefusal = null;
  if (sizeRefusal) {
    const err = new GatewayError(sizeRefusal.code, sizeRefusal.message, sizeRefusal.details);
    err.context = rowFigures(valid.model, upstream.name, rows, contextWindow);
    throw err;
  }

  // 2. The conversation, its previous request, and this request's run.
  const chain = messages ? chainHashes(messages, remembered?.chain) : [];
  if (messages && !opts.dryRun) {
    const c = countedAsSent.chat;
    // Counts with images are not remembered: what an image costs depends on the model, and the memo
    // serves every model of the counter's encoding (ADR 0022).
    const reusable = c && !c.upperBound && c.images === undefined;
    gw.prefixMemo.remember(memoScope, messages, chain, reusable ? { method: c.method, prefix: c.prefix } : null, remembered);
  }
  const { conversation, source } = await resolveConversation(gw, headers, principal, chain);
  const parent = idHeader(headers, 'x-tollgate-parent');
  // A new conversation's id was made just now: it has no head and no runs to read.
  const head = source === 'new' ? null : await gw.ledger.getHead(conversation);
  // A conversation (or parent) named by another tenant is not this tenant's to spend in or read.
  for (const named of source === 'header' ? [conversation, parent] : [parent]) {
    if (!named) continue;
    const owner = named === conversation && head ? head.tenant : (await gw.ledger.conversationSpend(named))?.tenant;
    if (owner && owner !== principal.tenant) throw ownerError(named, named === parent ? 'x-tollgate-parent' : 'x-tollgate-conversation');
  }
  // A run's id starts with its conversation's, so a conversation's runs sit together in the
  // ledger's index (and a new conversation's id grows with time: ADR 0015).
  const run = messages ? `${conversation}/${sha256Hex(`${conversation}\u0000${runKey(messages, chain)}`).slice(0, 32)}` : `req-${uuidV7()}`;
  const runState = messages && source !== 'new' ? await gw.ledger.getRun(run) : null;
  // Ages are told from a clock read after the head and the run were: counting can take seconds, and
  // a request of the same conversation planned meanwhile may have written either since `time`.
  const readAt = Math.max(time, gw.clock());
  warnIfClockStepped(gw, readAt, head?.time, runState?.startedAt);
  const tenant = gw.config.tenants.find((t) => t.id === principal.tenant);
  const combined = mergeRunBounds({ ...gw.config.runs }, tenant?.runs, principal.runs);
  // The reserve that applies, as a figure (what /v1/admission shows), from the budget it comes out of.
  const merged: RunBounds = { ...combined, answerReserveTokens: answerReserveFor(combined) };
  // Completions and embeddings are not research runs: no run token budget holds them (their size
  // is bounded by the 413 limits, their money by the caps).
  const bounds = messages ? merged : { ...merged, tokenBudget: null };
  const runInspection = messages ? inspectRun(messages, gw.config.runs.writeTools) : null;

  // 3. Shared prefix and charge (SPEC §4).
  const toolHash = toolHashOf(valid);
  const promptTokens = rows.sumTokens;
  // A llama.cpp server takes `cache_prompt: false` (passed on as sent) as "read the whole prompt
  // again": nothing of it is reused, so nothing is credited.
  const cacheRefused = upstream.config.kind === 'llamacpp' && valid.body.cache_prompt === false;
  const cache = { prefixCache: upstream.config.prefixCache && !cacheRefused, prefixCacheTtlSeconds: upstream.config.prefixCacheTtlSeconds, serverId: upstream.serverId };
  // A llama.cpp template may render an assistant turn's reasoning only while no user message
  // follows it (Qwen3): in such a conversation the counts must agree at every shared boundary
  // (ADR 0004). Not in others, where the check would cost credit for nothing: a turn counted by
  // the byte estimate while the tokenizer was away, or a message text a template trims, makes
  // the counts differ where the renderings do not. (A final answer below is measured on its
  // messages alone, the server's rendering of the tools aside.)
  const renderedByServer = counted.chat?.method === 'llamacpp' && (messages ?? []).some(carriesReasoning);
  // A head written under the old hashing of the same offer is this offer (legacyToolHashOf).
  const sameOfferHead = head && head.toolHash !== toolHash && head.toolHash === legacyToolHashOf(valid) ? { ...head, toolHash } : head;
  let shared = sharedPrefixTokens({
    head: sameOfferHead,
    chain,
    prefix: counted.chat?.prefix ?? null,
    prefixDigests: counted.chat?.prefixDigests,
    digestAt: counted.chat?.digestAt,
    model: valid.model,
    toolHash,
    now: readAt,
    upstream: cache,
    renderedByServer,
  });
  let promptCharge = promptChargeFor(promptTokens, shared);
  const runBudget = runBudgetFor(runState?.budgetTokens, bounds.tokenBudget);
  const remaining = runBudget === null ? null : runBudget - (runState?.usedTokens ?? 0);

  // 4. Mode: a run at one of its bounds gets its answer instead of another tool round (SPEC §5).
  let forwardBody = valid.body;
  let mode: Plan['mode'] = 'normal';
  let finalReason: FinalReason | null = null;
  let tokenRefusal: Plan['tokenRefusal'] = null;
  let excerptOnly = false;
  let roundAsSent: Plan['roundAsSent'] = null;
  if (valid.kind === 'chat' && runInspection) {
    const offersTools = valid.tools !== null || Array.isArray(valid.body.functions);
    const decided = decideMode({
      bounds,
      run: runInspection,
      offersTools,
      now: readAt,
      runStartedAt: runState?.startedAt ?? null,
      remainingTokens: remaining,
      neededTokens: promptCharge + rows.allowance,
      // The final request drops the tools and takes its allowance from what the run has left: it
      // is counted below, and refused (SPEC §11: 402 only when even the final answer cannot fit)
      // with its own figures, its prompt and one token per choice — not decided here.
      finalNeededTokens: 0,
    });
    // A round its size keeps from being sent goes as the final answer, for want of tokens — unless
    // the run is at one of its bounds anyway, which is then the reason it ends (SPEC §5).
    const decision: ReturnType<typeof decideMode> = outgrown && decided.mode !== 'final-answer' ? { mode: 'final-answer', reason: 'tokens' } : decided;
    if (decision.mode === 'final-answer') {
      mode = 'final-answer';
      finalReason = decision.reason;
      if (!outgrown && decision.reason === 'tokens') roundAsSent = { promptCharge, worstPromptTokens: worstPromptTokens(rows) };
      forwardBody = toFinalAnswerRequest(valid.body as { messages: ChatMessage[] } & Record<string, unknown>);
      const finalMessages = forwardBody.messages as ChatMessage[];
      counted = await countAll(gw, upstream, valid, finalMessages, undefined, counter);
      // The answer uses the reserve: its allowance is what the run has left after its prompt, and
      // what the window leaves after the rewritten prompt (the gateway's instruction is longer than
      // the tools it removed, at times). The allowance is then explicit, so it is set within both
      // here; at least 1, and an answer the upstream then refuses ends with the evidence excerpt.
      const promptTokensFinal = counted.rowTokens[0]!;
      const caps = [valid.maxTokens ?? defaultAllowance(gw.config, upstream.config).tokens];
      // The window, as for a default allowance, after the prompt's images at their least (ADR 0022).
      if (contextWindow !== null) caps.push(contextWindow - (promptTokensFinal - (counted.rowImageSlack[0] ?? 0)));
      // Without its tools the prompt is another from its start: the model reads it all again, and
      // it is charged in full (SPEC §4) where that still leaves the answer the run's reserve (or
      // what it asks for, if less; one token a choice at least), whatever ended the run. Where it
      // does not, the leading messages are credited as if the offer had not changed — a run near
      // its budget could otherwise never be answered (ADR 0004).
      const answerRoom = Math.max(valid.n, Math.min(Math.max(1, Math.min(...caps)) * valid.n, answerReserveFor(bounds)));
      if (remaining === null || promptTokensFinal + answerRoom <= remaining) shared = 0;
      else {
        const withoutTools = (prefix: number[]) => prefix.map((p) => p - (prefix[0] ?? 0));
        shared = sharedPrefixTokens({
          head: head ? { ...head, toolHash: '', prefix: withoutTools(head.prefix) } : null,
          chain,
          prefix: counted.chat ? withoutTools(counted.chat.prefix) : null,
          model: valid.model,
          toolHash: '',
          now: readAt,
          upstream: cache,
        });
      }
      promptCharge = promptChargeFor(promptTokensFinal, shared);
      const room = remaining === null ? null : Math.max(0, remaining - promptCharge);
      if (room !== null) caps.push(Math.floor(room / valid.n));
      rows = planRows({
        kind: valid.kind,
        rowTokens: counted.rowTokens,
        countMethod: planCountMethod(counted.countMethod, valid),
        upperBound: counted.upperBound,
        rowUpperBound: counted.rowUpperBound,
        rowImageSlack: counted.rowImageSlack,
        textUpperBound: counted.textUpperBound,
        maxTokens: caps.length === 1 ? valid.maxTokens : Math.max(1, Math.min(...caps)),
        n: valid.generations,
        defaultMaxTokens: defaultAllowance(gw.config, upstream.config).tokens,
        contextWindow,
      });
      // A final request that cannot fit the window or the size limits itself is not sent: the run
      // ends with the evidence excerpt (seed 001: final context preparation failed), for nothing.
      if (checkSizes(rows, gw.config.limits, contextWindow, true) !== null) {
        excerptOnly = true;
        promptCharge = 0;
      } else if (room !== null && (room < valid.n || promptCharge + rows.allowance > remaining!)) {
        tokenRefusal = { remainingTokens: remaining!, neededTokens: promptCharge + rows.allowance };
      }
    } else if (decision.mode === 'refuse-tokens') {
      tokenRefusal = { remainingTokens: decision.remainingTokens, neededTokens: decision.neededTokens };
    }
  } else if (remaining !== null && promptCharge + rows.allowance > remaining) {
    tokenRefusal = { remainingTokens: remaining, neededTokens: promptCharge + rows.allowance };
  }

  // 5. Money: the worst case (whole prompt uncached + whole allowance at list price).
  const price = upstream.billing === 'metered' ? gw.prices.lookup(valid.model, { at: new Date(time) }) : null;
  const worstPrompt = worstPromptTokens(rows);
  const priced = upstream.billing === 'metered' && !excerptOnly ? price : null;
  const predicted = priced && valid.body.prediction != null ? await predictionTokens(gw, upstream, valid) : 0;
  const audioOutput = mayAnswerInAudio({ kind: valid.kind, body: forwardBody });
  const worst = priced ? worstCaseUsd({ price: priced, promptTokens: worstPrompt, allowance: rows.allowance + predicted, audioOutput }) : null;

  return {
    id: `req-${uuidV7()}`,
    time,
    valid,
    principal,
    upstream,
    model: valid.model,
    forwardBody,
    rows,
    sentLongestRow,
    contextWindow,
    conversation,
    conversationSource: source,
    parent,
    run,
    runState,
    runInspection,
    bounds,
    chain,
    chatCount: counted.chat,
    countedExactly: counter !== undefined,
    toolHash,
    sharedPrefixTokens: shared,
    promptCharge,
    allowance: excerptOnly ? 0 : rows.allowance,
    perChoiceAllowance: excerptOnly ? 0 : rows.perRowAllowance,
    excerptOnly,
    mode,
    finalReason,
    roundAsSent,
    tokenRefusal,
    price,
    audioOutput,
    worstCaseUsd: worst,
    predictionTokens: predicted,
    month: monthOf(time),
    head,
  };
}
