// Counts for OpenAI-family models with tiktoken, following the OpenAI cookbook "How to count tokens
// with tiktoken" (num_tokens_from_messages, num_tokens_for_tools). The cookbook's figures match the
// API's `usage.prompt_tokens` for its examples; the tests pin them (SPEC §3).
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import type {
  ChatCount,
  ChatMessage,
  ChatPrompt,
  CountMethod,
  ImageCount,
  TextCount,
  TokenCounter,
  ToolDefinition,
} from '../types.js';
import { cacheKey, readingOnly, sharedTokenCache, type CachedCount, type CountCache } from '../token-cache.js';
import { messageDigest } from '../message-digest.js';
import { countBounded, EXACT_PRETOKEN_BUDGET, EXACT_RECOUNT_BUDGET, EXACT_RUN_BUDGET, getEncoder, type PieceCount } from './bounded-encode.js';
import { utf8Prefix } from '../utf8-prefix.js';
import type { CountPool } from './count-pool.js';
import { imageRuleFor, imageTokens, isImagePart, type ImageRule } from './image-tokens.js';

/** Longest streamed piece whose leading tokens are found for a cut (BPE is quadratic in a run's length). */
const LEADING_TEXT_MAX_CHARS = 1024;

// Ordered so that the longer prefixes win (gpt-4o before gpt-4, text-embedding-3 before nothing).
export const MODEL_PREFIXES: ReadonlyArray<readonly [string, TiktokenEncoding]> = [
  ['gpt-4o', 'o200k_base'],
  ['gpt-4.1', 'o200k_base'],
  ['gpt-4.5', 'o200k_base'],
  ['gpt-5', 'o200k_base'],
  ['o1', 'o200k_base'],
  ['o3', 'o200k_base'],
  ['o4-mini', 'o200k_base'],
  ['chatgpt-4o', 'o200k_base'],
  ['gpt-oss', 'o200k_base'],
  ['gpt-4', 'cl100k_base'],
  ['gpt-3.5', 'cl100k_base'],
  ['text-embedding-3-', 'cl100k_base'],
  ['text-embedding-ada-002', 'cl100k_base'],
];

/**
 * The tiktoken encoding of an OpenAI-family model name, by prefix (tiktoken's own
 * `encoding_for_model` knows exact names only and throws on the rest). A provider prefix such as
 * OpenRouter's `openai/gpt-4o` is stripped first. `null`: not an OpenAI-family name.
 */
export function encodingForModel(model: string): TiktokenEncoding | null {
  const slash = model.lastIndexOf('/');
  const name = (slash >= 0 ? model.slice(slash + 1) : model).toLowerCase();
  for (const [prefix, encoding] of MODEL_PREFIXES) if (name.startsWith(prefix)) return encoding;
  return null;
}

// Chat overhead (cookbook): every message is wrapped in <|start|>{role}<|message|>…<|end|> (3),
// a `name` costs 1 more, and the reply is primed with <|start|>assistant<|message|> (3).
const PER_MESSAGE = 3;
const PER_NAME = 1;
const REPLY_PRIMING = 3;
// Not in the cookbook: an assistant tool call renders as a small JSON envelope around its name and
// arguments; 3 tokens per call covers that envelope in the models we checked by hand. An estimate.
const PER_TOOL_CALL = 3;
// Not in the cookbook: an image part is billed by its size, which we do not fetch, and by the
// model's family — image-tokens.ts (ADR 0022). Images are kept out of a message's cached count, which
// is the encoding's and serves every model of it, and added per request for the model asked for.

interface ToolConstants {
  funcInit: number;
  propInit: number;
  propKey: number;
  enumInit: number;
  enumItem: number;
  funcEnd: number;
}

// Cookbook num_tokens_for_tools: the gpt-4o family and gpt-4/gpt-3.5 differ only in func_init.
const TOOL_CONSTANTS: Record<'o200k_base' | 'cl100k_base', ToolConstants> = {
  o200k_base: { funcInit: 7, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
  cl100k_base: { funcInit: 10, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
};

export interface TiktokenCounterOptions {
  cache?: CountCache;
  /**
   * Worker threads for large texts (ADR 0009). Without one, every count runs inline on the calling
   * thread, as a script or a unit test may want.
   */
  pool?: CountPool;
  /** UTF-8 bytes counted inline per event-loop turn before work goes to the pool (default 16 KiB). */
  inlineBytes?: number;
  /** Characters of long runs counted exactly per text (bounded-encode.ts; default EXACT_RUN_BUDGET). */
  exactRunBudget?: number;
  /** Characters of long pre-tokens counted exactly per text (bounded-encode.ts; default 0: cut). */
  preTokenBudget?: number;
}

/** 16 KiB of prose takes ~3 ms to encode: the most one turn of the event loop spends inline. */
export const DEFAULT_INLINE_BYTES = 16 * 1024;

export interface TiktokenCounterStats {
  /** Batches of texts counted on the calling thread. */
  inline: number;
  /** Batches of texts sent to the worker pool. */
  pooled: number;
}

// Inline budget shared by every counter of the process: the stall to bound is the event loop's,
// whichever encoding or request the inline work belonged to. It refills on the next turn, so a
// burst of small rows (1,024 completions rows of 15 KB) does not add up to a long stall either.
let inlineSpent = 0;
let refillScheduled = false;

function takeInline(bytes: number, limit: number): boolean {
  if (inlineSpent + bytes > limit) return false;
  inlineSpent += bytes;
  if (!refillScheduled) {
    refillScheduled = true;
    setImmediate(() => {
      inlineSpent = 0;
      refillScheduled = false;
    });
  }
  return true;
}

/** What one message or tool list costs: fixed tokens plus the texts still to encode. */
interface Recipe {
  fixed: number;
  texts: string[];
}

interface Job {
  key: string;
  recipe: Recipe;
  /** Set once its texts are counted. */
  count?: CachedCount;
}

/** A chat count in the making: a part per item (tools, then messages); each recipe once in `jobs`. */
interface Parts {
  list: Array<CachedCount | Job>;
  /** For each item of `list`, what its images add (null: none). */
  images: Array<ImageCount | null>;
  /** The image rule of the prompt's model. */
  rule: ImageRule;
  jobs: Job[];
  /** Parts by cache key, so a repeated message shares its first copy's part. */
  seen: Map<string, CachedCount | Job>;
  /** The texts to count, a short one once however many jobs hold it (every message has a role). */
  texts: string[];
  /** For each text of each job in order, its index in `texts`. */
  slots: number[];
  shortTexts: Map<string, number>;
}

/**
 * Texts up to this length are counted once per request however often they appear. (Longer ones
 * rarely repeat, and V8 hashes a string over 16,383 characters by its length alone, so a Map of
 * long texts of one length would compare them with each other.)
 */
const SHARED_TEXT_CHARS = 1024;

/**
 * Messages looked up (and jobs settled) per event-loop turn by `countChat`. Each costs a digest, a
 * cache look-up and a recipe, ~3–12 µs (measured on a shared 2-core machine), so a turn stays
 * within the few milliseconds SPEC §3 allows and a request of 200,000 messages lets other requests
 * run in between. A conversation's turn adds far fewer messages and never waits.
 */
export const MESSAGES_PER_TURN = 256;

const nextTurn = (): Promise<void> => new Promise((resolve) => setImmediate(resolve));

export class TiktokenCounter implements TokenCounter {
  readonly method: CountMethod;
  readonly encoding: TiktokenEncoding;
  private readonly cache: CountCache;
  private readonly pool: CountPool | null;
  private readonly inlineBytes: number;
  private readonly counts: TiktokenCounterStats = { inline: 0, pooled: 0 };
  private readonly exactRunBudget: number;
  private readonly preTokenBudget: number;
  private thorough: TiktokenCounter | null = null;
  private peeking: TiktokenCounter | null = null;

  constructor(encoding: TiktokenEncoding, opts: TiktokenCounterOptions = {}) {
    this.encoding = encoding;
    this.method = `tiktoken:${encoding}`;
    this.cache = opts.cache ?? sharedTokenCache;
    this.pool = opts.pool ?? null;
    this.inlineBytes = opts.inlineBytes ?? DEFAULT_INLINE_BYTES;
    this.exactRunBudget = opts.exactRunBudget ?? EXACT_RUN_BUDGET;
    this.preTokenBudget = opts.preTokenBudget ?? 0;
  }

  /**
   * The same counter with a far larger budget for exact long runs (EXACT_RECOUNT_BUDGET), and long
   * pre-tokens counted exactly too (EXACT_PRETOKEN_BUDGET), for a second look before a request is
   * refused, or sent as a final answer, on an upper bound (ADR 0019). It shares the cache: an exact
   * count it makes serves later turns too, and upper bounds cached before are counted again. With a
   * pool, all its work goes there: a long pre-token's merge loop needs the encoding's ranks (~0.4 s
   * to read, once per thread), which the main thread never loads.
   */
  exactly(opts: { remember?: boolean } = {}): TiktokenCounter {
    const thorough = (cache: CountCache) =>
      new TiktokenCounter(this.encoding, {
        cache,
        pool: this.pool ?? undefined,
        inlineBytes: this.pool === null ? this.inlineBytes : 0,
        exactRunBudget: EXACT_RECOUNT_BUDGET,
        preTokenBudget: EXACT_PRETOKEN_BUDGET,
      });
    // `remember: false` (/v1/admission, which changes nothing): it reads the cache and writes
    // nothing to it, so a later request counts its text as it would have without the question.
    if (opts.remember === false) return (this.peeking ??= thorough(readingOnly(this.cache)));
    return (this.thorough ??= thorough(this.cache));
  }

  /** A cached count this counter may use: an upper bound is not, when it counts more exactly. */
  private cached<T extends { upperBound: boolean }>(c: T | undefined): T | undefined {
    return c !== undefined && c.upperBound && this.exactRunBudget > EXACT_RUN_BUDGET ? undefined : c;
  }

  /** A counter for an OpenAI-family model name, or null when the name is not one. */
  static forModel(model: string, opts: TiktokenCounterOptions = {}): TiktokenCounter | null {
    const encoding = encodingForModel(model);
    return encoding === null ? null : new TiktokenCounter(encoding, opts);
  }

  /** Where counting work ran: for tests and the ADR's claims. */
  stats(): TiktokenCounterStats {
    return { ...this.counts };
  }

  /**
   * Cached messages cost a hash lookup on this thread. The rest are encoded together: inline when
   * small, else in a worker, awaited (ADR 0009). Either way the same `countBounded` runs. A long
   * list is looked up over several event-loop turns, MESSAGES_PER_TURN at a time.
   */
  async countChat(prompt: ChatPrompt): Promise<ChatCount> {
    const known = this.knownPrefix(prompt);
    const parts = this.toolParts(prompt);
    const messages = prompt.messages;
    for (let i = known?.messages ?? 0, inTurn = 0; i < messages.length; i++, inTurn++) {
      if (inTurn === MESSAGES_PER_TURN) {
        inTurn = 0;
        await nextTurn();
      }
      this.addMessage(parts, messages[i]!);
    }
    const counts = await this.countTexts(parts.texts);
    for (let from = 0, next = 0; from < parts.jobs.length; from += MESSAGES_PER_TURN) {
      if (from > 0) await nextTurn();
      next = this.settle(parts, from, Math.min(from + MESSAGES_PER_TURN, parts.jobs.length), counts, next);
    }
    return this.assemble(parts, known);
  }

  /** The whole count on the calling thread, in one turn, whatever its size. */
  countChatSync(prompt: ChatPrompt): ChatCount {
    const known = this.knownPrefix(prompt);
    const parts = this.toolParts(prompt);
    for (let i = known?.messages ?? 0; i < prompt.messages.length; i++) this.addMessage(parts, prompt.messages[i]!);
    const counts = parts.texts.map((t) => countBounded(this.encoding, t, this.exactRunBudget, this.preTokenBudget));
    this.settle(parts, 0, parts.jobs.length, counts, 0);
    return this.assemble(parts, known);
  }

  /**
   * Leading messages whose exact counts this counter made for an earlier turn (metering/prefix-memo.ts):
   * they are neither looked up nor counted, so turn N's work stays with what turn N added.
   */
  private knownPrefix(prompt: ChatPrompt): { messages: number; prefix: readonly number[] } | null {
    const known = prompt.known;
    if (known === undefined || known.method !== this.method) return null;
    const messages = Math.min(known.messages, prompt.messages.length, known.prefix.length - 1);
    return messages > 0 ? { messages, prefix: known.prefix } : null;
  }

  async countText(text: string): Promise<TextCount> {
    const key = cacheKey(`${this.encoding}:text`, text);
    let c = this.cached(this.cache.get(key));
    if (c === undefined) {
      const [one] = await this.countTexts([text]);
      c = { tokens: one.tokens, upperBound: one.split };
      this.cache.set(key, c);
    }
    return { tokens: c.tokens, method: this.label(c.upperBound), upperBound: c.upperBound };
  }

  /** Per streamed chunk: small, synchronous, always inline. */
  countOutput(text: string): number {
    return countBounded(this.encoding, text).tokens;
  }

  /**
   * The first `tokens` tokens of a short piece, as text: encoding is lossless byte-level BPE, so
   * they are the piece's first B bytes, cut back to a whole character. A long piece (where BPE's
   * time is not bounded) gets '' and is dropped whole, as before.
   */
  leadingText(text: string, tokens: number): string {
    if (tokens <= 0 || text.length > LEADING_TEXT_MAX_CHARS) return '';
    const enc = getEncoder(this.encoding);
    const ids = enc.encode_ordinary(text);
    if (ids.length <= tokens) return text;
    return utf8Prefix(text, enc.decode(ids.subarray(0, tokens)).length);
  }

  decode(ids: readonly number[]): string | null {
    try {
      return new TextDecoder().decode(getEncoder(this.encoding).decode(Uint32Array.from(ids)));
    } catch {
      return null; // an id outside the vocabulary
    }
  }

  private label(upperBound: boolean): CountMethod {
    return upperBound ? `tiktoken:${this.encoding}:upper-bound` : this.method;
  }

  private async countTexts(texts: string[]): Promise<PieceCount[]> {
    if (texts.length === 0) return [];
    if (this.pool !== null) {
      let bytes = 0;
      for (const t of texts) bytes += Buffer.byteLength(t, 'utf8');
      if (!takeInline(bytes, this.inlineBytes)) {
        this.counts.pooled++;
        return this.pool.count(this.encoding, texts, this.exactRunBudget, this.preTokenBudget);
      }
    }
    this.counts.inline++;
    return texts.map((t) => countBounded(this.encoding, t, this.exactRunBudget, this.preTokenBudget));
  }

  /** The parts of a chat count, started with its tools: a cached count, or a recipe to compute. */
  private toolParts(prompt: ChatPrompt): Parts {
    const parts: Parts = {
      list: [],
      images: [null],
      rule: imageRuleFor(prompt.model),
      jobs: [],
      seen: new Map(),
      texts: [],
      slots: [],
      shortTexts: new Map(),
    };
    const offered = prompt.tools ?? [];
    const format = prompt.format;
    if (offered.length > 0 || format !== undefined) {
      const key = cacheKey(`${this.encoding}:tools`, format === undefined ? offered : { tools: offered, format });
      const tools = this.cached(this.cache.get(key)) ?? { key, recipe: this.offerRecipe(offered, format) };
      if ('recipe' in tools) addJob(parts, tools);
      parts.list.push(tools);
    } else {
      parts.list.push({ tokens: 0, upperBound: false });
    }
    return parts;
  }

  /**
   * Adds the next message not already `known`: a cached count, or a recipe to compute (with its
   * cache key). A message repeated within the request is one part, shared: it is looked up, counted
   * and cached once however often it appears (200,000 empty user messages are one job, not 200,000).
   */
  private addMessage(parts: Parts, message: ChatMessage): void {
    // A message's digest is computed once per request and shared with the prefix chain.
    const key = `${this.encoding}:message:${messageDigest(message)}`;
    let part = parts.seen.get(key);
    if (part === undefined) {
      part = this.cached(this.cache.get(key)) ?? { key, recipe: messageRecipe(message) };
      if ('recipe' in part) addJob(parts, part);
      parts.seen.set(key, part);
    }
    parts.list.push(part);
    parts.images.push(imagesOf(message, parts.rule));
  }

  /**
   * Sums the text counts of jobs[from..to) (their texts' slots start at slots[next]) and caches
   * each sum; returns where the next job's slots start.
   */
  private settle({ jobs, slots }: Parts, from: number, to: number, counts: PieceCount[], next: number): number {
    for (let j = from; j < to; j++) {
      const job = jobs[j]!;
      let tokens = job.recipe.fixed;
      let upperBound = false;
      for (let i = 0; i < job.recipe.texts.length; i++, next++) {
        const c = counts[slots[next]!]!;
        tokens += c.tokens;
        upperBound ||= c.split;
      }
      job.count = { tokens: Math.max(0, tokens), upperBound };
      this.cache.set(job.key, job.count);
    }
    return next;
  }

  /**
   * The running prefix, once every job is settled: the tools, then the known messages (their
   * earlier prefix moved onto this request's tools), then the rest.
   */
  private assemble({ list: parts, images }: Parts, known: { messages: number; prefix: readonly number[] } | null): ChatCount {
    let upperBound = false;
    const prefix: number[] = [];
    let sum = 0;
    let pictures: ImageCount | null = null;
    for (let i = 0; i < parts.length; i++) {
      const part = parts[i]!;
      const c = 'recipe' in part ? part.count! : part;
      upperBound ||= c.upperBound;
      sum += c.tokens;
      const im = images[i];
      if (im) {
        sum += im.tokens;
        pictures = pictures ? { parts: pictures.parts + im.parts, tokens: pictures.tokens + im.tokens, least: pictures.least + im.least } : im;
      }
      prefix.push(sum);
      if (i === 0 && known !== null) {
        const shift = sum - known.prefix[0]!;
        for (let k = 1; k <= known.messages; k++) prefix.push(known.prefix[k]! + shift);
        sum = prefix[prefix.length - 1]!;
      }
    }
    // An image counted at the most it can cost makes the count an upper bound too (ADR 0022).
    const imageBound = pictures !== null && pictures.tokens > pictures.least;
    const count: ChatCount = {
      tokens: sum + REPLY_PRIMING,
      prefix,
      method: this.label(upperBound || imageBound),
      upperBound: upperBound || imageBound,
      textUpperBound: upperBound,
    };
    if (pictures) count.images = pictures;
    return count;
  }

  /**
   * The offer read before the messages: the tools (the cookbook's formula), and a structured-output
   * schema as the JSON the client wrote. How a provider renders a schema is not published; its JSON
   * is at least as long as the compact forms seen, so it is not counted short.
   */
  private offerRecipe(tools: ToolDefinition[], format: unknown): Recipe {
    const r: Recipe = tools.length > 0 ? this.toolsRecipe(tools) : { fixed: 0, texts: [] };
    if (format !== undefined) r.texts.push(JSON.stringify(format) ?? '');
    return r;
  }

  private toolsRecipe(tools: ToolDefinition[]): Recipe {
    const k = TOOL_CONSTANTS[this.encoding === 'o200k_base' ? 'o200k_base' : 'cl100k_base'];
    const r: Recipe = { fixed: 0, texts: [] };
    for (const tool of tools) {
      const fn = tool.function;
      r.fixed += k.funcInit;
      if (fn === undefined || (tool.type !== undefined && tool.type !== 'function')) {
        // Another kind of tool (`custom`): the cookbook has no formula; its name, description and
        // the rest of its definition count as text, with a function's framing.
        const own = tool[tool.type];
        const def = typeof own === 'object' && own !== null ? (own as Record<string, unknown>) : {};
        const { name, description, ...rest } = def;
        r.texts.push(`${stringOr(name)}:${stripPeriod(stringOr(description))}`);
        if (Object.keys(rest).length > 0) r.texts.push(JSON.stringify(rest));
        continue;
      }
      r.texts.push(`${fn.name}:${stripPeriod(stringOr(fn.description))}`);
      const properties = propertiesOf(fn.parameters);
      if (properties.length === 0) continue;
      r.fixed += k.propInit;
      addProperties(r, k, properties, 0);
    }
    r.fixed += k.funcEnd;
    return r;
  }
}

/** Levels of nested parameters counted; deeper ones are not (the body's depth limit bounds them anyway). */
const MAX_SCHEMA_DEPTH = 32;

/**
 * The cookbook's figures for a function's properties: a key, its type and description, its enum.
 * The cookbook stops at the top level; a provider renders nested objects' properties (and an
 * array's items' properties) too, so each is counted the same way, one level in.
 */
function addProperties(r: Recipe, k: ToolConstants, properties: Array<[string, Record<string, unknown>]>, depth: number): void {
  for (const [key, prop] of properties) {
    r.fixed += k.propKey;
    addEnum(r, k, prop.enum);
    r.texts.push(`${key}:${stringOr(prop.type)}:${stripPeriod(stringOr(prop.description))}`);
    if (depth + 1 >= MAX_SCHEMA_DEPTH) continue;
    const items = prop.items !== null && typeof prop.items === 'object' && !Array.isArray(prop.items) ? (prop.items as Record<string, unknown>) : undefined;
    if (items) addEnum(r, k, items.enum);
    for (const nested of [propertiesOf(prop), propertiesOf(items)]) {
      if (nested.length === 0) continue;
      r.fixed += k.propInit;
      addProperties(r, k, nested, depth + 1);
    }
  }
}

function addEnum(r: Recipe, k: ToolConstants, values: unknown): void {
  if (!Array.isArray(values)) return;
  r.fixed += k.enumInit;
  for (const item of values) {
    r.fixed += k.enumItem;
    // An item is a string in the cookbook; anything else a client sends is counted as the JSON it
    // wrote (`String` throws on an object whose `toString` is not a function).
    r.texts.push(typeof item === 'string' ? item : (JSON.stringify(item) ?? ''));
  }
}

/** Queues a job and its texts (a short text already queued is not queued again). */
function addJob(parts: Parts, job: Job): void {
  parts.jobs.push(job);
  for (const text of job.recipe.texts) {
    let slot = text.length <= SHARED_TEXT_CHARS ? parts.shortTexts.get(text) : undefined;
    if (slot === undefined) {
      slot = parts.texts.push(text) - 1;
      if (text.length <= SHARED_TEXT_CHARS) parts.shortTexts.set(text, slot);
    }
    parts.slots.push(slot);
  }
}

function messageRecipe(message: ChatMessage): Recipe {
  const r: Recipe = { fixed: PER_MESSAGE, texts: [message.role] };
  const content = message.content;
  if (typeof content === 'string') r.texts.push(content);
  else if (Array.isArray(content)) {
    // Image parts are counted per request, by imagesOf. An assistant's refusal part is text it wrote.
    for (const part of content) {
      if (typeof part.text === 'string') r.texts.push(part.text);
      else if (typeof part.refusal === 'string') r.texts.push(part.refusal);
    }
  }
  // An earlier answer's refusal, sent back in the history, is read again like its content.
  if (typeof message.refusal === 'string') r.texts.push(message.refusal);
  if (typeof message.name === 'string') {
    r.texts.push(message.name);
    r.fixed += PER_NAME;
  }
  for (const call of message.tool_calls ?? []) {
    r.fixed += PER_TOOL_CALL;
    if (call.function === undefined && call.type !== undefined && call.type !== 'function') {
      // A custom tool's call (`custom: {name, input}`): its name and free-form input.
      const own = call[call.type];
      const def = typeof own === 'object' && own !== null ? (own as Record<string, unknown>) : {};
      r.texts.push(stringOr(def.name), stringOr(def.input));
    } else r.texts.push(stringOr(call.function?.name), stringOr(call.function?.arguments));
  }
  // A legacy `function_call` written by the assistant is read again like a tool call.
  const legacy = message.function_call;
  if (legacy !== null && typeof legacy === 'object') {
    const fn = legacy as Record<string, unknown>;
    r.fixed += PER_TOOL_CALL;
    r.texts.push(stringOr(fn.name), stringOr(fn.arguments));
  }
  // `tool_call_id` is routing metadata the model never reads: not counted.
  return r;
}

/** What a message's image parts add for a model with `rule`; null when it has none. */
function imagesOf(message: ChatMessage, rule: ImageRule): ImageCount | null {
  const content = message.content;
  if (!Array.isArray(content)) return null;
  const found: ImageCount = { parts: 0, tokens: 0, least: 0 };
  for (const part of content) {
    if (typeof part.text === 'string' || !isImagePart(part)) continue;
    const one = imageTokens(rule, part);
    found.parts++;
    found.tokens += one.tokens;
    found.least += one.least;
  }
  return found.parts > 0 ? found : null;
}

function propertiesOf(parameters: Record<string, unknown> | undefined): Array<[string, Record<string, unknown>]> {
  const props = parameters?.properties;
  if (props === null || typeof props !== 'object' || Array.isArray(props)) return [];
  return Object.entries(props as Record<string, unknown>).map(([key, value]) => [
    key,
    value !== null && typeof value === 'object' ? (value as Record<string, unknown>) : {},
  ]);
}

function stringOr(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

function stripPeriod(s: string): string {
  return s.endsWith('.') ? s.slice(0, -1) : s;
}
