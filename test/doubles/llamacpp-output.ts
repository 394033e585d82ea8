// What the llama.cpp double generates, and how it streams it, in the recorded SSE shapes
// (fixtures/llamacpp chat-stream*, v1-completions-stream).
import type { ServerResponse } from 'node:http';
import { tokenize } from './llamacpp-template.js';
import type { Json, LlamaCppDoubleOptions } from './llamacpp.js';

export interface ToolCallSpec {
  name: string;
  /** The arguments as the model writes them: a JSON string. */
  arguments: string;
}

export interface Generation {
  tokens: number[];
  /** Each token's text, in order: one stream chunk each. */
  pieces: string[];
  text: string;
  finishReason: 'length' | 'stop' | 'tool_calls';
  message: Json;
  toolCall: (ToolCallSpec & { id: string }) | null;
}

// Words that are one GPT-2 token each with their leading space, so `count` words are `count` tokens
// and the text re-tokenizes to the same count.
const FILLER = [' the', ' quick', ' brown', ' fox', ' jumps', ' over', ' lazy', ' dog'];
const FILLER_IDS = FILLER.map((w) => tokenize(w)[0]);

/**
 * `count` tokens of filler for choice `index` (choices differ by offset), or a tool call when
 * `spec` is given. `limit` is where generation was forced to stop: reaching it is `length`.
 */
export function generate(count: number, limit: number, index: number, spec: ToolCallSpec | null): Generation {
  if (spec !== null) {
    const text = `<tool_call>\n{"name": "${spec.name}", "arguments": ${spec.arguments}}\n</tool_call>`;
    const toolCall = { ...spec, id: `call_double_${index}` };
    return {
      tokens: tokenize(text),
      pieces: [],
      text: '',
      finishReason: 'tool_calls',
      message: {
        role: 'assistant',
        content: null,
        tool_calls: [{ type: 'function', function: { name: spec.name, arguments: spec.arguments }, id: toolCall.id }],
      },
      toolCall,
    };
  }
  const n = Math.max(0, count);
  const pieces = Array.from({ length: n }, (_, i) => FILLER[(i + index) % FILLER.length]);
  const tokens = Array.from({ length: n }, (_, i) => FILLER_IDS[(i + index) % FILLER.length]);
  const text = pieces.join('');
  return {
    tokens,
    pieces,
    text,
    finishReason: n >= limit ? 'length' : 'stop',
    message: { role: 'assistant', content: text },
    toolCall: null,
  };
}

const sleep = (ms: number) => new Promise<void>((r) => setTimeout(r, ms));

/** Writes `data: …` events with the double's delay and drop knobs applied. */
class SseWriter {
  private sent = 0;
  constructor(
    private readonly res: ServerResponse,
    private readonly opts: LlamaCppDoubleOptions,
  ) {
    res.writeHead(200, {
      Server: 'llama.cpp',
      'Access-Control-Allow-Origin': '',
      'X-Accel-Buffering': 'no',
      'Content-Type': 'text/event-stream',
      'Keep-Alive': 'timeout=5, max=100',
    });
  }

  /** False once the stream is gone (dropped on purpose, or the client left). */
  async send(data: unknown): Promise<boolean> {
    if ((this.opts.delayMs ?? 0) > 0) await sleep(this.opts.delayMs ?? 0);
    if (this.res.destroyed) return false;
    if (this.opts.dropMidStream !== undefined && this.sent >= this.opts.dropMidStream) {
      this.res.destroy();
      return false;
    }
    this.res.write(`data: ${typeof data === 'string' ? data : JSON.stringify(data)}\n\n`);
    this.sent++;
    return true;
  }

  end(): void {
    if (!this.res.destroyed) this.res.end();
  }
}

type Base = Record<string, unknown>;

/**
 * Chat SSE as recorded: a role chunk, one content chunk per token, a finish chunk (timings on it
 * only without include_usage), then with include_usage a `choices: []` chunk with usage + timings,
 * then `[DONE]`. Without include_usage there is no usage anywhere.
 */
export async function streamChat(
  res: ServerResponse,
  opts: LlamaCppDoubleOptions,
  base: Base,
  choices: Generation[],
  usage: Json,
  timings: Json,
  includeUsage: boolean,
): Promise<void> {
  const w = new SseWriter(res, opts);
  const chunk = (choiceList: unknown[], extra: Json = {}) => ({
    choices: choiceList,
    created: base.created,
    id: base.id,
    model: base.model,
    system_fingerprint: base.system_fingerprint,
    object: 'chat.completion.chunk',
    ...extra,
  });
  const delta = (index: number, d: Json, finish: string | null = null) => ({ finish_reason: finish, index, delta: d });

  for (let i = 0; i < choices.length; i++) {
    if (!(await w.send(chunk([delta(i, { role: 'assistant', content: null })])))) return;
  }
  const longest = Math.max(...choices.map((c) => c.pieces.length));
  for (let t = 0; t < longest; t++) {
    for (let i = 0; i < choices.length; i++) {
      const piece = choices[i].pieces[t];
      if (piece !== undefined && !(await w.send(chunk([delta(i, { content: piece })])))) return;
    }
  }
  for (let i = 0; i < choices.length; i++) {
    const call = choices[i].toolCall;
    if (call === null) continue;
    const head = { index: 0, id: call.id, type: 'function', function: { name: call.name, arguments: '' } };
    if (!(await w.send(chunk([delta(i, { tool_calls: [head] })])))) return;
    for (const part of splitArgs(call.arguments)) {
      if (!(await w.send(chunk([delta(i, { tool_calls: [{ index: 0, function: { arguments: part } }] })])))) return;
    }
  }
  for (let i = 0; i < choices.length; i++) {
    const extra = includeUsage || i < choices.length - 1 ? {} : { timings };
    if (!(await w.send(chunk([delta(i, {}, choices[i].finishReason)], extra)))) return;
  }
  if (includeUsage && !(await w.send(chunk([], { usage, timings })))) return;
  if (!(await w.send('[DONE]'))) return;
  w.end();
}

/**
 * Completions SSE as recorded: one `text_completion` chunk per token, then a finish chunk that
 * itself carries usage (with include_usage) and timings, then `[DONE]`.
 */
export async function streamCompletions(
  res: ServerResponse,
  opts: LlamaCppDoubleOptions,
  base: Base,
  choices: Generation[],
  usage: Json,
  timings: Json,
  includeUsage: boolean,
): Promise<void> {
  const w = new SseWriter(res, opts);
  const chunk = (index: number, text: string, finish: string | null, extra: Json = {}) => ({
    choices: [{ text, index, logprobs: null, finish_reason: finish }],
    created: base.created,
    model: base.model,
    system_fingerprint: base.system_fingerprint,
    object: 'text_completion',
    ...extra,
    id: base.id,
  });
  const longest = Math.max(0, ...choices.map((c) => c.pieces.length));
  for (let t = 0; t < longest; t++) {
    for (let i = 0; i < choices.length; i++) {
      const piece = choices[i].pieces[t];
      if (piece !== undefined && !(await w.send(chunk(i, piece, null)))) return;
    }
  }
  for (let i = 0; i < choices.length; i++) {
    const last = i === choices.length - 1;
    const extra = last ? (includeUsage ? { usage, timings } : { timings }) : {};
    if (!(await w.send(chunk(i, '', choices[i].finishReason, extra)))) return;
  }
  if (!(await w.send('[DONE]'))) return;
  w.end();
}

function splitArgs(args: string): string[] {
  const parts: string[] = [];
  for (let i = 0; i < args.length; i += 8) parts.push(args.slice(i, i + 8));
  return parts;
}
