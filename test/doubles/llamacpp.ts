// A llama.cpp `llama-server` test double: a real HTTP server on 127.0.0.1, port 0, that answers as
// the recorded server in fixtures/llamacpp/ does — same tokenizer and template (so the same token
// counts), same response shapes, same error envelopes, and a simulated prefix cache. Generated text
// is deterministic filler, one token per stream chunk.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { CHAT_TEMPLATE, detokenize, renderChat, tokenBytes, tokenize, type TemplateMessage } from './llamacpp-template.js';
import { generate, streamChat, streamCompletions, type Generation, type ToolCallSpec } from './llamacpp-output.js';

export type { ToolCallSpec } from './llamacpp-output.js';

export interface RecordedRequest {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  /** Parsed JSON body; undefined when there was none or it did not parse. */
  body: unknown;
  rawBody: string;
}

export type Json = Record<string, unknown>;

export interface LlamaCppDoubleOptions {
  /** Per-slot context window (`default_generation_settings.n_ctx`). Default 4096. */
  nCtx?: number;
  /** `--parallel`: the largest `n` accepted. Default 1. */
  slots?: number;
  /** Tokens to generate when `max_tokens` does not stop earlier. Default 16. */
  completionTokens?: number;
  /** Generate `completionTokens` whatever `max_tokens` says (an upstream that ignores it). */
  ignoreMaxTokens?: boolean;
  /** Wait before each stream chunk, and once before a non-stream answer. */
  delayMs?: number;
  /**
   * Answer `/tokenize` with plain ids whatever `with_pieces` says. The recordings pair
   * `with_pieces: true` only with `add_special: false`: a double (or a proxy) may answer the
   * gateway's pairing of the two with ids alone.
   */
  ignoreWithPieces?: boolean;
  /** Wait before answering `/tokenize` (a server busy with a long prompt). */
  tokenizeDelayMs?: number;
  /** Never answer `/tokenize` of generated text (`add_special: false`): a server stuck on it. */
  stallGeneratedTokenize?: boolean;
  /** Answer with this assistant tool call instead of text (a function may decide per request). */
  toolCalls?: ToolCallSpec | ((body: Json) => ToolCallSpec | null);
  /** Answer generation endpoints with this status and JSON body instead. */
  failWith?: { status: number; body: unknown } | ((req: RecordedRequest) => { status: number; body: unknown } | null);
  /** Destroy the socket after this many SSE events (a non-stream request: before answering). */
  dropMidStream?: number;
  /** Model name reported (`/v1/models`, responses). Default `tiny.gguf`. */
  modelAlias?: string;
  /** Physical batch size: an embeddings row over it is a 500, as recorded. Default 512. */
  ubatch?: number;
  /** Started without `--embeddings`: an embeddings request is a 501 (error-embeddings-not-enabled). Default true. */
  embeddings?: boolean;
  /**
   * Not the recorded template's: text written at the head of the system turn, asked anew for each
   * rendering (a template that prints today's date there, as Llama 3.x's does).
   */
  systemPreamble?: () => string;
  /**
   * Not the recorded template: another model's, rendering the messages (and tools) the server was
   * sent — what a server started with that model's GGUF and `--jinja` would render.
   */
  template?: (messages: TemplateMessage[], tools: unknown[] | undefined) => string;
}

export interface LlamaCppDouble {
  url: string;
  requests: RecordedRequest[];
  server: Server;
  /** Token ids of a text as this server counts them (for test expectations). */
  tokenize(text: string): number[];
  close(): Promise<void>;
}

const GENERATION_PATHS = new Set(['/v1/chat/completions', '/chat/completions', '/v1/completions', '/completions', '/v1/embeddings', '/embeddings']);

export async function startLlamaCppDouble(opts: LlamaCppDoubleOptions = {}): Promise<LlamaCppDouble> {
  const state = new DoubleState(opts);
  const requests: RecordedRequest[] = [];
  const server = createServer((req, res) => {
    const chunks: Buffer[] = [];
    req.on('data', (c: Buffer) => chunks.push(c));
    req.on('end', () => {
      const rawBody = Buffer.concat(chunks).toString('utf8');
      const recorded: RecordedRequest = {
        method: req.method ?? 'GET',
        path: (req.url ?? '/').split('?')[0],
        headers: req.headers,
        body: parseOrUndefined(rawBody),
        rawBody,
      };
      requests.push(recorded);
      state.handle(recorded, res).catch((err: unknown) => {
        if (!res.headersSent) sendError(res, 500, 'server_error', err instanceof Error ? err.message : String(err));
        else res.destroy();
      });
    });
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    server,
    tokenize: (text) => tokenize(text),
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}

function parseOrUndefined(raw: string): unknown {
  if (raw.length === 0) return undefined;
  try {
    return JSON.parse(raw);
  } catch {
    return undefined;
  }
}

const JSON_TYPE = 'application/json; charset=utf-8';

function sendJson(res: ServerResponse, status: number, body: unknown): void {
  const text = JSON.stringify(body);
  const headers: Record<string, string | number> = {
    Server: 'llama.cpp',
    'Access-Control-Allow-Origin': '',
    'Content-Type': JSON_TYPE,
    'Content-Length': Buffer.byteLength(text),
  };
  // The recorded server closes the connection after every error response.
  if (status >= 400) headers.Connection = 'close';
  else headers['Keep-Alive'] = 'timeout=5, max=100';
  res.writeHead(status, headers);
  res.end(text);
}

export function sendError(res: ServerResponse, code: number, type: string, message: string, extra: Json = {}): void {
  sendJson(res, code, { error: { code, message, type, ...extra } });
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** One slot's KV contents, for the simulated prefix cache. */
interface Slot {
  tokens: number[];
}

class DoubleState {
  readonly nCtx: number;
  readonly slots: Slot[];
  readonly model: string;
  private seq = 0;

  constructor(readonly opts: LlamaCppDoubleOptions) {
    this.nCtx = opts.nCtx ?? 4096;
    this.slots = Array.from({ length: Math.max(1, opts.slots ?? 1) }, () => ({ tokens: [] }));
    this.model = opts.modelAlias ?? 'tiny.gguf';
  }

  async handle(req: RecordedRequest, res: ServerResponse): Promise<void> {
    const key = `${req.method} ${req.path}`;
    if (req.method === 'POST' && GENERATION_PATHS.has(req.path)) {
      const fail = typeof this.opts.failWith === 'function' ? this.opts.failWith(req) : this.opts.failWith;
      if (fail) return sendJson(res, fail.status, fail.body);
    }
    if (req.method === 'POST' && req.body === undefined && req.rawBody.length > 0) {
      return sendError(res, 500, 'server_error', `[json.exception.parse_error.101] parse error at line 1, column ${req.rawBody.length + 1}: syntax error while parsing value - unexpected end of input`);
    }
    const body = (req.body ?? {}) as Json;
    switch (key) {
      case 'GET /health':
        return sendJson(res, 200, { status: 'ok' });
      case 'GET /props':
        return sendJson(res, 200, this.props());
      case 'GET /v1/models':
      case 'GET /models':
        return sendJson(res, 200, this.models());
      case 'POST /tokenize':
        if ((this.opts.tokenizeDelayMs ?? 0) > 0) await sleep(this.opts.tokenizeDelayMs ?? 0);
        if (this.opts.stallGeneratedTokenize && body.add_special === false) return; // closed with the double
        return sendJson(res, 200, { tokens: this.tokenizeBody(body) });
      case 'POST /detokenize':
        return sendJson(res, 200, { content: detokenize(Array.isArray(body.tokens) ? (body.tokens as number[]) : []) });
      case 'POST /apply-template':
        if (!Array.isArray(body.messages)) return sendError(res, 400, 'invalid_request_error', "'messages' is required");
        return sendJson(res, 200, { prompt: this.render(body) });
      case 'POST /v1/chat/completions/input_tokens':
        if (!Array.isArray(body.messages)) return sendError(res, 400, 'invalid_request_error', "'messages' is required");
        return sendJson(res, 200, { input_tokens: tokenize(this.render(body)).length, object: 'response.input_tokens' });
      case 'POST /v1/chat/completions':
      case 'POST /chat/completions':
        return this.chat(body, res);
      case 'POST /v1/completions':
      case 'POST /completions':
        return this.completions(body, res);
      case 'POST /v1/embeddings':
      case 'POST /embeddings':
        return this.embeddings(body, res);
      default:
        return sendJson(res, 404, { error: { message: 'File Not Found', type: 'not_found_error', code: 404 } });
    }
  }

  /**
   * As llama.cpp parses a chat request for its template: `tool_choice: "none"` renders no tools,
   * `add_generation_prompt: false` leaves the reply's opening out (not in the recordings: from the
   * server's request parsing).
   */
  private render(body: Json): string {
    const tools = Array.isArray(body.tools) && body.tool_choice !== 'none' ? (body.tools as unknown[]) : undefined;
    if (this.opts.template) return this.opts.template(body.messages as TemplateMessage[], tools);
    return renderChat(body.messages as TemplateMessage[], tools, body.add_generation_prompt !== false, this.opts.systemPreamble?.());
  }

  private tokenizeBody(body: Json): Array<number | { id: number; piece: string | number[] }> {
    if (typeof body.content !== 'string') return [];
    const ids = tokenize(body.content, body.parse_special !== false);
    if (body.with_pieces !== true || this.opts.ignoreWithPieces) return ids;
    const strict = new TextDecoder('utf-8', { fatal: true });
    return ids.map((id) => {
      const bytes = tokenBytes(id);
      try {
        return { id, piece: strict.decode(bytes) };
      } catch {
        return { id, piece: Array.from(bytes) };
      }
    });
  }

  props(): Json {
    return {
      default_generation_settings: { params: { n_predict: -1, max_tokens: -1, temperature: 0.8 }, n_ctx: this.nCtx },
      total_slots: this.slots.length,
      model_alias: this.model,
      model_path: 'tiny.gguf',
      modalities: { vision: false, video: false, audio: false },
      endpoint_slots: true,
      endpoint_props: false,
      endpoint_metrics: false,
      chat_template: CHAT_TEMPLATE,
      chat_template_caps: { supports_tools: true, supports_tool_calls: true, supports_system_role: true },
      bos_token: '<|endoftext|>',
      eos_token: '<|im_end|>',
      build_info: 'b10587-3f545bec',
      is_sleeping: false,
    };
  }

  private models(): Json {
    const meta = { vocab_type: true, n_vocab: 50259, n_ctx: this.nCtx, n_ctx_train: 4096, n_embd: 64, n_params: 6515392, size: 13031424, ftype: 'F16' };
    return {
      models: [{ name: this.model, model: this.model, type: 'model', capabilities: ['completion'] }],
      object: 'list',
      data: [{ id: this.model, aliases: [this.model], tags: [], object: 'model', created: Math.floor(Date.now() / 1000), owned_by: 'llamacpp', meta }],
    };
  }

  /** Reuse from the slot with the longest common prefix; at least one token is always evaluated. */
  /**
   * The slot a prompt runs in (the one whose cached tokens share the longest prefix with it), and
   * how many of its tokens that cache saves. `cache_prompt: false` (llama-server's request field,
   * true by default; not in the recordings) saves none: the whole prompt is read again.
   */
  private admitPrompt(tokens: number[], cachePrompt: unknown = true): { slot: Slot; cacheN: number } {
    let best = this.slots[0];
    let bestLcp = -1;
    for (const slot of this.slots) {
      const l = lcp(slot.tokens, tokens);
      if (l > bestLcp) {
        best = slot;
        bestLcp = l;
      }
    }
    return { slot: best, cacheN: cachePrompt === false ? 0 : Math.min(bestLcp, Math.max(0, tokens.length - 1)) };
  }

  /** Validation shared by chat and completions; returns true when it already answered. */
  private invalid(body: Json, res: ServerResponse): boolean {
    for (const field of ['max_tokens', 'n_predict', 'n']) {
      const v = body[field];
      if (v !== undefined && v !== null && typeof v !== 'number') {
        sendError(res, 400, 'invalid_request_error', `Field '${field}': [json.exception.type_error.302] type must be number, but is ${typeof v}`);
        return true;
      }
    }
    const n = typeof body.n === 'number' ? body.n : 1;
    if (n < 1 || n > this.slots.length) {
      sendError(res, 400, 'invalid_request_error', `Field 'n': Value must be between 1 <= value <= ${this.slots.length}, but got ${n}`);
      return true;
    }
    return false;
  }

  private tooLong(promptTokens: number, res: ServerResponse): boolean {
    if (promptTokens < this.nCtx) return false;
    sendError(res, 400, 'exceed_context_size_error', `request (${promptTokens} tokens) exceeds the available context size (${this.nCtx} tokens), try increasing it`, {
      n_prompt_tokens: promptTokens,
      n_ctx: this.nCtx,
    });
    return true;
  }

  /**
   * How many tokens to generate and where generation is forced to stop. A max_tokens past the
   * context is not an error: generation stops when the context is full (recorded:
   * error-max-tokens-exceeds-remaining, 4096 − 4000 = 96). Without `completionTokens` the model
   * never stops by itself before max_tokens (random weights); with no max_tokens it writes 16.
   */
  private budget(body: Json, promptTokens: number): { count: number; limit: number } {
    // As the server reads it: `n_predict`, else `max_tokens`; `max_completion_tokens` is not read
    // (props.response.json lists only those two in its params).
    const asked = typeof body.n_predict === 'number' ? body.n_predict : typeof body.max_tokens === 'number' ? body.max_tokens : null;
    const ignore = this.opts.ignoreMaxTokens === true || asked === null || asked < 0;
    const room = Math.max(0, this.nCtx - promptTokens);
    const limit = ignore ? room : Math.min(asked, room);
    const natural = this.opts.completionTokens ?? (ignore ? 16 : Infinity);
    return { count: Math.min(limit, natural), limit };
  }

  private nextId(prefix: string): string {
    this.seq += 1;
    return `${prefix}-double${String(this.seq).padStart(6, '0')}`;
  }

  private async chat(body: Json, res: ServerResponse): Promise<void> {
    if (!Array.isArray(body.messages)) return sendError(res, 400, 'invalid_request_error', "'messages' is required");
    if (this.invalid(body, res)) return;
    const prompt = tokenize(this.render(body));
    if (this.tooLong(prompt.length, res)) return;
    const { slot, cacheN } = this.admitPrompt(prompt, body.cache_prompt);
    const n = typeof body.n === 'number' ? body.n : 1;
    const spec = typeof this.opts.toolCalls === 'function' ? this.opts.toolCalls(body) : (this.opts.toolCalls ?? null);
    const { count, limit } = this.budget(body, prompt.length);
    const choices: Generation[] = Array.from({ length: n }, (_, i) => generate(count, limit, i, spec));
    slot.tokens = prompt.concat(choices[0].tokens);
    const usage = usageOf(prompt.length, choices[0].tokens.length, cacheN);
    const timings = timingsOf(prompt.length, choices[0].tokens.length, cacheN);
    const base = { created: Math.floor(Date.now() / 1000), id: this.nextId('chatcmpl'), model: this.model, system_fingerprint: 'b10587-3f545bec' };
    if (body.stream === true) {
      return streamChat(res, this.opts, base, choices, usage, timings, includeUsage(body));
    }
    await this.beforeAnswer(res);
    if (res.destroyed) return;
    sendJson(res, 200, {
      choices: choices.map((c, index) => ({ finish_reason: c.finishReason, index, message: c.message })),
      ...base,
      object: 'chat.completion',
      usage,
      timings,
    });
  }

  private async completions(body: Json, res: ServerResponse): Promise<void> {
    if (this.invalid(body, res)) return;
    const rows = promptRows(body.prompt);
    if (rows === null) return sendError(res, 400, 'invalid_request_error', '"prompt" must be a string, a list of tokens, or a list of mixed strings & tokens');
    for (const row of rows) if (this.tooLong(row.length, res)) return;
    const n = typeof body.n === 'number' ? body.n : 1;
    const results = rows.map((row) => {
      const { slot, cacheN } = this.admitPrompt(row, body.cache_prompt);
      const { count, limit } = this.budget(body, row.length);
      const gens = Array.from({ length: n }, (_, i) => generate(count, limit, i, null));
      slot.tokens = row.concat(gens[0].tokens);
      return { row, cacheN, gens };
    });
    // As recorded (v1-completions-prompt-array): usage and timings describe row 0 only.
    const first = results[0];
    const usage = usageOf(first?.row.length ?? 0, first?.gens[0].tokens.length ?? 0, first?.cacheN ?? 0);
    const timings = timingsOf(first?.row.length ?? 0, first?.gens[0].tokens.length ?? 0, first?.cacheN ?? 0);
    const choices = results.flatMap((r) => r.gens);
    const base = { created: Math.floor(Date.now() / 1000), model: this.model, system_fingerprint: 'b10587-3f545bec', object: 'text_completion', id: this.nextId('cmpl') };
    if (body.stream === true) {
      return streamCompletions(res, this.opts, base, choices, usage, timings, includeUsage(body));
    }
    await this.beforeAnswer(res);
    if (res.destroyed) return;
    sendJson(res, 200, {
      choices: choices.map((c, index) => ({ text: c.text, index, logprobs: null, finish_reason: c.finishReason })),
      ...base,
      usage,
      timings,
    });
  }

  private embeddings(body: Json, res: ServerResponse): void {
    if (this.opts.embeddings === false) {
      return sendError(res, 501, 'not_supported_error', 'This server does not support embeddings. Start it with `--embeddings`');
    }
    const rows = promptRows(body.input);
    if (rows === null) return sendError(res, 400, 'invalid_request_error', '"input" must be a string or an array');
    const ubatch = this.opts.ubatch ?? 512;
    for (const row of rows) {
      if (row.length > ubatch) {
        return sendError(res, 500, 'server_error', `input (${row.length} tokens) is too large to process. increase the physical batch size (current batch size: ${ubatch})`);
      }
    }
    const base64 = body.encoding_format === 'base64';
    const data = rows.map((row, index) => {
      const vec = embeddingOf(row);
      const embedding = base64 ? Buffer.from(new Float32Array(vec).buffer).toString('base64') : vec;
      return base64 ? { embedding, index, object: 'embedding', encoding_format: 'base64' } : { embedding, index, object: 'embedding' };
    });
    // Embeddings usage sums the rows (emb-v1-embeddings: 4 + 8 = 12); `model` echoes the request.
    const total = rows.reduce((s, r) => s + r.length, 0);
    sendJson(res, 200, { model: body.model ?? this.model, object: 'list', usage: { prompt_tokens: total, total_tokens: total }, data });
  }

  private async beforeAnswer(res: ServerResponse): Promise<void> {
    if ((this.opts.delayMs ?? 0) > 0) await sleep(this.opts.delayMs ?? 0);
    if (this.opts.dropMidStream !== undefined) res.destroy();
  }
}

function includeUsage(body: Json): boolean {
  const so = body.stream_options;
  return so !== null && typeof so === 'object' && (so as Json).include_usage === true;
}

/** A prompt/input as token rows: string, token ids, or an array of either. Null when malformed. */
function promptRows(v: unknown): number[][] | null {
  if (typeof v === 'string') return [tokenize(v)];
  if (!Array.isArray(v)) return null;
  if (v.length > 0 && v.every((x) => typeof x === 'number')) return [v as number[]];
  const rows: number[][] = [];
  for (const row of v) {
    if (typeof row === 'string') rows.push(tokenize(row));
    else if (Array.isArray(row) && row.every((x) => typeof x === 'number')) rows.push(row as number[]);
    else return null;
  }
  return rows;
}

function lcp(a: number[], b: number[]): number {
  const n = Math.min(a.length, b.length);
  let i = 0;
  while (i < n && a[i] === b[i]) i++;
  return i;
}

export function usageOf(prompt: number, completion: number, cached: number): Json {
  return { completion_tokens: completion, prompt_tokens: prompt, total_tokens: prompt + completion, prompt_tokens_details: { cached_tokens: cached } };
}

export function timingsOf(prompt: number, predicted: number, cacheN: number): Json {
  return {
    cache_n: cacheN,
    prompt_n: prompt - cacheN,
    prompt_ms: 1,
    prompt_per_token_ms: 1,
    prompt_per_second: 1000,
    predicted_n: predicted,
    predicted_ms: 1,
    predicted_per_token_ms: 1,
    predicted_per_second: 1000,
  };
}

/** A deterministic unit-free vector of the model's width (64), from the row's tokens. */
function embeddingOf(tokens: number[]): number[] {
  const v = Array.from({ length: 64 }, (_, i) => tokens.reduce((s, t, j) => s + Math.sin(t * (i + 1) + j), 0.5));
  const norm = Math.sqrt(v.reduce((s, x) => s + x * x, 0)) || 1;
  return v.map((x) => x / norm);
}
