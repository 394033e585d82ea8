// Exact counts for a llama.cpp upstream, asked of the server itself: its own chat template
// (`POST /apply-template`) then its own tokenizer (`POST /tokenize`, `add_special: true`). The
// result equals the server's `usage.prompt_tokens` (fixtures/llamacpp: tokenize-turn1-prompt = 34 =
// chat-nonstream's prompt_tokens). Network or server failures throw; the caller falls back to the
// labelled byte estimate (SPEC §3).
import type { Dispatcher } from 'undici';
import type { ChatCount, ChatMessage, ChatPrompt, CountMethod, TextCount, TokenCounter } from '../types.js';
import { cacheKey, sharedTokenCache, type TokenCache } from '../token-cache.js';
import { estimateTokens } from './byte-estimate.js';
import { messageBoundaries, pastClosing, tokenDigestAt, tokenDigests, tokensBefore, type Piece } from './prompt-boundaries.js';

/** How much of a failed call's body its error keeps (a log line shows 200 characters of it). */
const UPSTREAM_TEXT_KEPT = 4096;

export class LlamaCppCountError extends Error {
  /**
   * The start of what the server answered, kept out of the message: an error about a template or a
   * tokenization can quote the messages, and the message is logged (SPEC §10: no prompt text).
   */
  upstreamText: string | null;

  constructor(message: string, options?: { cause?: unknown; upstreamText?: string }) {
    super(message, options);
    this.name = 'LlamaCppCountError';
    this.upstreamText = options?.upstreamText ?? null;
  }
}

export interface LlamaCppCounterOptions {
  dispatcher: Dispatcher;
  /** The upstream's base URL, e.g. `http://127.0.0.1:8080` (a trailing `/v1` is ignored). */
  baseUrl: string;
  /** Sent as `Authorization: Bearer …` when the server runs with `--api-key`. */
  apiKey?: string;
  cache?: TokenCache;
}

interface Endpoint {
  origin: string;
  /** Path prefix of the native endpoints, without a trailing slash ('' at the root). */
  base: string;
}

/**
 * `/apply-template` and `/tokenize` live at the server root, not under `/v1`, so a base URL
 * written OpenAI-style (`…/v1`) is trimmed back to the root.
 */
export function nativeEndpoint(baseUrl: string): Endpoint {
  const url = new URL(baseUrl);
  const base = url.pathname.replace(/\/+$/, '').replace(/\/v1$/, '');
  return { origin: url.origin, base };
}

export async function postJson<T>(
  dispatcher: Dispatcher,
  baseUrl: string,
  path: string,
  body: unknown,
  opts: { apiKey?: string; signal?: AbortSignal; method?: 'GET' | 'POST' } = {},
): Promise<T> {
  const { origin, base } = nativeEndpoint(baseUrl);
  const method = opts.method ?? 'POST';
  const headers: Record<string, string> = { accept: 'application/json' };
  if (method === 'POST') headers['content-type'] = 'application/json';
  if (opts.apiKey !== undefined) headers.authorization = `Bearer ${opts.apiKey}`;
  let res: Dispatcher.ResponseData;
  try {
    res = await dispatcher.request({
      origin,
      path: base + path,
      method,
      headers,
      body: method === 'POST' ? JSON.stringify(body) : undefined,
      signal: opts.signal,
    });
  } catch (err) {
    const reason = err instanceof Error ? err.message : String(err);
    throw new LlamaCppCountError(`llama.cpp ${method} ${path} at ${origin}${base} failed: ${reason}`, {
      cause: err,
    });
  }
  const text = await res.body.text();
  if (res.statusCode !== 200) {
    // Kept longer than a log line shows: the reader takes the upstream's key out (a server or a
    // proxy before it may echo the request's headers) before it cuts the text short.
    throw new LlamaCppCountError(`llama.cpp ${method} ${path} at ${origin}${base} answered ${res.statusCode}`, { upstreamText: text.slice(0, UPSTREAM_TEXT_KEPT) });
  }
  try {
    return JSON.parse(text) as T;
  } catch (err) {
    throw new LlamaCppCountError(`llama.cpp ${method} ${path} answered invalid JSON`, { cause: err });
  }
}

interface TokenizeResponse {
  tokens: Array<number | Piece>;
}

/** How many whole-prompt counts a llama.cpp counter keeps, and how many message boundaries in all. */
const MAX_REMEMBERED_PROMPTS = 256;
const MAX_REMEMBERED_BOUNDARIES = 65_536;
const MAX_REMEMBERED_IDS = 4 * 1024 * 1024;

export class LlamaCppCounter implements TokenCounter {
  readonly method: CountMethod = 'llamacpp';
  private readonly opts: LlamaCppCounterOptions;
  private readonly cache: TokenCache;
  private readonly chatCounts = new Map<string, ChatCount>();
  private rememberedBoundaries = 0;
  private rememberedIds = 0;

  constructor(opts: LlamaCppCounterOptions) {
    this.opts = opts;
    this.cache = opts.cache ?? sharedTokenCache;
  }

  /**
   * Two HTTP calls: render once, tokenize once with pieces. The pieces give each token's byte span
   * in the prompt, so every `prefix[k]` comes from the same tokenization without more calls. A
   * prompt counted before (a retry, an admission preview) is not tokenized again — known by its
   * rendering too, since a template can render the same request otherwise later (today's date).
   */
  async countChat(prompt: ChatPrompt, signal?: AbortSignal): Promise<ChatCount> {
    // What the server renders its template with: the messages, the tools, and the request's
    // template fields (a tool_choice of "none" drops the tools, chat_template_kwargs switches …).
    const body: Record<string, unknown> & { messages: ChatMessage[] } = { ...prompt.template, messages: prompt.messages };
    if (prompt.tools !== undefined && prompt.tools.length > 0) body.tools = prompt.tools;
    const rendered = await this.call<{ prompt?: unknown }>('/apply-template', body, signal);
    if (typeof rendered.prompt !== 'string') {
      throw new LlamaCppCountError('llama.cpp /apply-template returned no prompt');
    }
    const key = cacheKey(`llamacpp:${this.opts.baseUrl}:chat`, { body, prompt: rendered.prompt });
    const known = this.chatCounts.get(key);
    if (known !== undefined) {
      // Refresh recency: the small map is an LRU of whole prompts.
      this.chatCounts.delete(key);
      this.chatCounts.set(key, known);
      return known;
    }
    const tok = await this.call<TokenizeResponse>(
      '/tokenize',
      { content: rendered.prompt, add_special: true, with_pieces: true },
      signal,
    );
    const pieces = tok.tokens.filter((t): t is Piece => typeof t === 'object' && t !== null);
    const withPieces = pieces.length === tok.tokens.length;
    // A server (or a proxy before it) that answers plain ids, ignoring `with_pieces`: the count is
    // still exact, but where each message ends in it cannot be told, so nothing is taken as shared
    // (a shared prefix may be counted low, never high: SPEC §4) — rather than throwing the exact
    // count away for the byte estimate.
    if (!withPieces && !tok.tokens.every((t) => Number.isInteger(t))) throw new LlamaCppCountError('llama.cpp /tokenize answered tokens that are neither ids nor pieces');
    const ids = withPieces ? Int32Array.from(pieces, (p) => p.id) : Int32Array.from(tok.tokens as number[]);
    const prefix = withPieces ? messagePrefix(rendered.prompt, prompt.messages, pieces) : new Array<number>(prompt.messages.length + 1).fill(0);
    const result: ChatCount = {
      tokens: ids.length,
      prefix,
      prefixDigests: tokenDigests(ids, prefix),
      digestAt: (n) => tokenDigestAt(ids, n),
      method: this.method,
      upperBound: false,
    };
    this.remember(key, result);
    return result;
  }

  async countText(text: string, signal?: AbortSignal): Promise<TextCount> {
    return this.tokenized(text, true, signal);
  }

  /**
   * What the model wrote: the server's own tokenizer with no special tokens added (a prompt row
   * gets the start-of-text token the server adds to a prompt; generated text has none).
   */
  async countGenerated(text: string, signal?: AbortSignal): Promise<TextCount> {
    return this.tokenized(text, false, signal);
  }

  private async tokenized(text: string, addSpecial: boolean, signal?: AbortSignal): Promise<TextCount> {
    const key = cacheKey(`llamacpp:${this.opts.baseUrl}:${addSpecial ? 'text' : 'generated'}`, text);
    const hit = this.cache.get(key);
    if (hit !== undefined) return { tokens: hit.tokens, method: this.method, upperBound: false };
    const tok = await this.call<TokenizeResponse>('/tokenize', { content: text, add_special: addSpecial }, signal);
    if (!Array.isArray(tok.tokens)) throw new LlamaCppCountError('llama.cpp /tokenize returned no tokens');
    this.cache.set(key, { tokens: tok.tokens.length, upperBound: false });
    return { tokens: tok.tokens.length, method: this.method, upperBound: false };
  }

  /**
   * Output must be counted synchronously as bytes stream by, and the server's tokenizer is behind
   * HTTP: this is the byte estimate. Streams from llama.cpp carry their own usage (forced on).
   */
  countOutput(text: string): number {
    return estimateTokens(text);
  }

  private call<T>(path: string, body: unknown, signal?: AbortSignal): Promise<T> {
    return postJson<T>(this.opts.dispatcher, this.opts.baseUrl, path, body, { apiKey: this.opts.apiKey, signal });
  }

  /**
   * Kept: the last 256 prompts' counts, at most 65,536 message boundaries between them — each
   * count holds a figure and a digest a message, and 256 prompts of 40,000 messages held 1.2 GB —
   * and at most 4 Mi token ids (16 MB), which each count holds for `digestAt`.
   */
  private remember(key: string, value: ChatCount): void {
    const size = (c: ChatCount) => c.prefix.length;
    if (size(value) > MAX_REMEMBERED_BOUNDARIES || value.tokens > MAX_REMEMBERED_IDS) return;
    const replaced = this.chatCounts.get(key);
    if (replaced !== undefined) {
      this.chatCounts.delete(key);
      this.rememberedBoundaries -= size(replaced);
      this.rememberedIds -= replaced.tokens;
    }
    this.chatCounts.set(key, value);
    this.rememberedBoundaries += size(value);
    this.rememberedIds += value.tokens;
    while (this.chatCounts.size > MAX_REMEMBERED_PROMPTS || this.rememberedBoundaries > MAX_REMEMBERED_BOUNDARIES || this.rememberedIds > MAX_REMEMBERED_IDS) {
      const oldest = this.chatCounts.entries().next();
      if (oldest.done === true) break;
      this.chatCounts.delete(oldest.value[0]);
      this.rememberedBoundaries -= size(oldest.value[1]);
      this.rememberedIds -= oldest.value[1].tokens;
    }
  }
}

interface PropsResponse {
  default_generation_settings?: { n_ctx?: unknown };
  model_alias?: unknown;
}

/** What the gateway reads from a llama.cpp server's `GET /props`. */
export interface ServerProps {
  contextWindow: number | null;
  /** The name the server serves its model under (`--alias`, else the file name), or null. */
  modelAlias: string | null;
}

const serverProps = new Map<string, ServerProps>();

/**
 * The per-slot context window: `GET /props` → `default_generation_settings.n_ctx`. Not a top-level
 * `n_ctx` (there is none) and not the `-c` total, which `--parallel N` splits over N slots
 * (fixtures/llamacpp p2-props: 2048 with `-c 4096 --parallel 2`). Cached per base URL; pass
 * `refresh` after the upstream restarts.
 */
export async function fetchContextWindow(
  dispatcher: Dispatcher,
  baseUrl: string,
  opts: { refresh?: boolean; apiKey?: string; signal?: AbortSignal } = {},
): Promise<number | null> {
  return (await fetchServerProps(dispatcher, baseUrl, opts)).contextWindow;
}

/** The server's context window and model name, from one `GET /props` (cached like the window). */
export async function fetchServerProps(
  dispatcher: Dispatcher,
  baseUrl: string,
  opts: { refresh?: boolean; apiKey?: string; signal?: AbortSignal } = {},
): Promise<ServerProps> {
  const known = serverProps.get(baseUrl);
  if (opts.refresh !== true && known !== undefined) return known;
  const props = await postJson<PropsResponse>(dispatcher, baseUrl, '/props', undefined, {
    method: 'GET',
    apiKey: opts.apiKey,
    signal: opts.signal,
  });
  const n = props.default_generation_settings?.n_ctx;
  const alias = props.model_alias;
  const read: ServerProps = {
    contextWindow: typeof n === 'number' && Number.isInteger(n) && n > 0 ? n : null,
    modelAlias: typeof alias === 'string' && alias.length > 0 ? alias : null,
  };
  serverProps.set(baseUrl, read);
  return read;
}

/**
 * Tokens of the rendered prompt before each message ends: offsets [start of message 0's text, end
 * of message 0, …], each end past the message's closing mark where the template writes one.
 * prefix[0] is only what precedes the first message's text: conservative, because a shared prefix
 * may be counted low but never high (SPEC §4).
 */
function messagePrefix(text: string, messages: ChatMessage[], pieces: Piece[]): number[] {
  const bounds = messageBoundaries(text, messages).map((b, i) => (i === 0 ? b : pastClosing(text, b)));
  const counted = tokensBefore(text, pieces, bounds);
  const prefix = [counted[0]];
  for (let k = 0; k < messages.length; k++) prefix.push(Math.max(prefix[k], counted[k + 1]));
  return prefix;
}
