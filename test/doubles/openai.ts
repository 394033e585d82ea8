// A test double of an OpenAI-compatible provider: real HTTP on 127.0.0.1, OpenAI's response shapes
// (a stream ends with a `choices: []` usage chunk when include_usage is set, then [DONE]).
// Generated text is " hi" repeated — one token per word in cl100k/o200k — so counts are exact.

import { createServer, type IncomingMessage, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { get_encoding, type Tiktoken } from '@dqbd/tiktoken';

let cl100k: Tiktoken | null = null;

/** The prompt a completion echoes: its text, or the text of its token ids (cl100k_base, gpt-3.5-turbo-instruct's). */
function echoed(prompt: unknown): string {
  if (typeof prompt === 'string') return prompt;
  if (!Array.isArray(prompt) || !prompt.every((x) => typeof x === 'number')) return '';
  cl100k ??= get_encoding('cl100k_base');
  return new TextDecoder().decode(cl100k.decode(Uint32Array.from(prompt as number[])));
}

type Json = Record<string, unknown>;

export interface RecordedRequest {
  method: string;
  path: string;
  headers: IncomingMessage['headers'];
  body: Json | null;
  /** Content chunks of a stream written for this request. */
  chunksSent: number;
  /** The connection closed before the double finished its answer (the client went away). */
  closedEarly: boolean;
}

export interface OpenAiDoubleOptions {
  /** Tokens to generate per choice (capped by max tokens unless ignoreMaxTokens). Default 8. */
  completionTokens?: number;
  ignoreMaxTokens?: boolean;
  /** Answer with tool calls instead of text (return null to answer with text). */
  toolCalls?: (body: Json) => Array<{ name: string; arguments: string }> | null;
  /** Text the model writes before its tool calls (content beside `tool_calls`; streamed first). */
  toolCallText?: string;
  /** Answer every request with this status and body (and these headers). */
  failWith?: { status: number; body: unknown; headers?: Record<string, string> };
  /** Headers sent with every answer, as OpenAI sends `x-request-id` and `x-ratelimit-*`. */
  responseHeaders?: Record<string, string>;
  /** Close the connection after this many content chunks of a stream. */
  dropAfterChunks?: number;
  /**
   * Send this many content chunks of a stream, then an error in the stream and end it: as a
   * `data: {"error": …}` chunk (OpenAI, OpenRouter) or as an `event: error` event.
   */
  errorAfterChunks?: { chunks: number; as: 'data' | 'event'; error: Json };
  /** Send this many content chunks of a stream, then nothing more until the client goes away. */
  stallAfterChunks?: number;
  /** Never answer a generation request: hold it open until the client goes away. */
  hang?: boolean;
  delayMs?: number;
  /** `usage.cost` to report (OpenRouter style). */
  providerCost?: number;
  /** Answer without `usage` (JSON answers), as some OpenAI-compatible servers do. */
  omitUsage?: boolean;
  /** prompt_tokens to report; default: a rough count of the request (4 bytes a token). */
  promptTokens?: (body: Json) => number;
  cachedTokens?: number;
  /** Text of each generated token; default " hi". */
  word?: string;
}

export interface OpenAiDouble {
  url: string;
  requests: RecordedRequest[];
  options: OpenAiDoubleOptions;
  close(): Promise<void>;
}

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

async function readBody(req: IncomingMessage): Promise<Json | null> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  if (chunks.length === 0) return null;
  try {
    return JSON.parse(Buffer.concat(chunks).toString('utf8')) as Json;
  } catch {
    return null;
  }
}

export async function startOpenAiDouble(options: OpenAiDoubleOptions = {}): Promise<OpenAiDouble> {
  const requests: RecordedRequest[] = [];
  let seq = 0;
  const server = createServer(async (req, res) => {
    const body = await readBody(req);
    const path = (req.url ?? '/').split('?')[0];
    const recorded: RecordedRequest = { method: req.method ?? 'GET', path, headers: req.headers, body, chunksSent: 0, closedEarly: false };
    requests.push(recorded);
    res.on('close', () => {
      if (!res.writableFinished) recorded.closedEarly = true;
    });
    const o = options;
    const heldUntilClosed = () => new Promise<void>((resolve) => (res.destroyed ? resolve() : res.once('close', () => resolve())));
    const json = (status: number, value: unknown, headers: Record<string, string> = {}) => {
      res.writeHead(status, { 'content-type': 'application/json', ...o.responseHeaders, ...headers });
      res.end(JSON.stringify(value));
    };
    if (o.failWith) return json(o.failWith.status, o.failWith.body, o.failWith.headers);
    if (req.method === 'GET' && path.endsWith('/models')) return json(200, { object: 'list', data: [{ id: 'gpt-4o-mini', object: 'model' }] });
    if (req.method !== 'POST' || !body) return json(404, { error: { message: 'not found', type: 'invalid_request_error', code: null } });
    if (o.hang) return heldUntilClosed();

    const model = String(body.model ?? 'unknown');
    const n = typeof body.n === 'number' ? body.n : 1;
    const max = Number(body.max_completion_tokens ?? body.max_tokens ?? 16);
    const want = o.completionTokens ?? 8;
    const count = o.ignoreMaxTokens ? want : Math.min(want, max);
    const finish = count < want ? 'length' : 'stop';
    const word = o.word ?? ' hi';
    const promptTokens = o.promptTokens ? o.promptTokens(body) : Math.ceil(JSON.stringify(body.messages ?? body.prompt ?? body.input ?? '').length / 4);
    const usage: Json = {
      prompt_tokens: promptTokens,
      completion_tokens: path.endsWith('/embeddings') ? 0 : count * n,
      total_tokens: promptTokens + (path.endsWith('/embeddings') ? 0 : count * n),
      prompt_tokens_details: { cached_tokens: o.cachedTokens ?? 0 },
    };
    if (o.providerCost !== undefined) usage.cost = o.providerCost;
    const id = `chatcmpl-double-${++seq}`;
    const created = Math.floor(Date.now() / 1000);

    if (path.endsWith('/embeddings')) {
      const inputs = Array.isArray(body.input) ? body.input : [body.input];
      // OpenAI's embeddings usage has the prompt alone: no completion, no cached figure.
      const embeddingsUsage = { prompt_tokens: promptTokens, total_tokens: promptTokens };
      // `encoding_format: "base64"` (the openai SDK's default) is answered as OpenAI does: the
      // little-endian float32 bytes, base64.
      const vector = [0.1, 0.2, 0.3];
      const embedding = body.encoding_format === 'base64' ? Buffer.from(new Float32Array(vector).buffer).toString('base64') : vector;
      return json(200, { object: 'list', model, data: inputs.map((_, i) => ({ object: 'embedding', index: i, embedding })), ...(o.omitUsage ? {} : { usage: embeddingsUsage }) });
    }
    const isChat = path.endsWith('/chat/completions');
    const calls = isChat && o.toolCalls ? o.toolCalls(body) : null;
    const toolCalls = calls?.map((c, i) => ({ id: `call_${seq}_${i}`, type: 'function', function: { name: c.name, arguments: c.arguments } }));

    if (body.stream !== true) {
      const text = word.repeat(count);
      const choices = Array.from({ length: n }, (_, index) =>
        isChat
          ? {
              index,
              message: toolCalls ? { role: 'assistant', content: o.toolCallText ?? null, tool_calls: toolCalls } : { role: 'assistant', content: text },
              finish_reason: toolCalls ? 'tool_calls' : finish,
            }
          : { index, text: (body.echo === true ? echoed(body.prompt) : '') + text, finish_reason: finish },
      );
      return json(200, { id, object: isChat ? 'chat.completion' : 'text_completion', created, model, choices, ...(o.omitUsage ? {} : { usage }) });
    }

    res.writeHead(200, { 'content-type': 'text/event-stream', ...o.responseHeaders });
    const send = (v: unknown) => res.write(`data: ${JSON.stringify(v)}\n\n`);
    // With `stream_options.include_usage`, OpenAI gives every chunk `"usage": null` (after the
    // choices), and the figures in a last chunk of its own with no choices.
    const so = body.stream_options as Json | undefined;
    const withUsage = so?.include_usage === true;
    // And, unless told not to, random padding in an `obfuscation` member last on each chat chunk
    // with choices (the API's stream obfuscation, on by default since 2025).
    const padded = isChat && so?.include_obfuscation !== false;
    let pads = 0;
    const chunk = (choices: Json[]) => ({
      id,
      object: isChat ? 'chat.completion.chunk' : 'text_completion',
      created,
      model,
      choices,
      ...(withUsage ? { usage: null } : {}),
      ...(padded && choices.length > 0 ? { obfuscation: 'pAd0'.slice(0, 1 + (pads++ % 4)) } : {}),
    });
    if (isChat) send(chunk(Array.from({ length: n }, (_, index) => ({ index, delta: { role: 'assistant', content: '' }, finish_reason: null }))));
    // A completion with `echo` starts each choice's text with its prompt, read and not written.
    if (!isChat && body.echo === true && echoed(body.prompt) !== '') {
      for (let index = 0; index < n; index++) send(chunk([{ index, text: echoed(body.prompt), finish_reason: null }]));
    }
    let sent = 0;
    if (toolCalls) {
      if (o.toolCallText) send(chunk([{ index: 0, delta: { content: o.toolCallText }, finish_reason: null }]));
      send(chunk([{ index: 0, delta: { tool_calls: toolCalls.map((t, i) => ({ index: i, ...t })) }, finish_reason: null }]));
    } else {
      for (let t = 0; t < count; t++) {
        for (let index = 0; index < n; index++) {
          if (o.dropAfterChunks !== undefined && sent >= o.dropAfterChunks) {
            // Let the chunks already written leave first (Node corks a response's writes until the
            // next tick): the connection is lost after them, not instead of them.
            await new Promise((r) => setImmediate(r));
            res.destroy();
            return;
          }
          if (o.stallAfterChunks !== undefined && sent >= o.stallAfterChunks) return heldUntilClosed();
          if (o.errorAfterChunks !== undefined && sent >= o.errorAfterChunks.chunks) {
            const e = o.errorAfterChunks;
            res.end(e.as === 'data' ? `data: ${JSON.stringify({ error: e.error })}\n\n` : `event: error\ndata: ${JSON.stringify({ error: e.error })}\n\n`);
            return;
          }
          send(chunk([isChat ? { index, delta: { content: word }, finish_reason: null } : { index, text: word, finish_reason: null }]));
          sent++;
          recorded.chunksSent = sent;
        }
        if (o.delayMs) await sleep(o.delayMs);
        if (res.destroyed) return;
      }
    }
    send(chunk(Array.from({ length: n }, (_, index) => (isChat ? { index, delta: {}, finish_reason: toolCalls ? 'tool_calls' : finish } : { index, text: '', finish_reason: finish }))));
    if (withUsage) send({ ...chunk([]), usage });
    res.end('data: [DONE]\n\n');
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    requests,
    options,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
