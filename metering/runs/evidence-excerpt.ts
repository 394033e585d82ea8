// The fallback when a final turn fails, comes back empty or proposes tools again (SPEC §5,
// seed 001): the run's tool results, labelled as unverified evidence, byte-bounded. It is never
// presented as an answer: the model did not read it into one.

import { randomUUID } from 'node:crypto';
import type { ChatMessage } from '../types.js';
import { messageText } from './message-text.js';
import { inspectRun } from './run-state.js';
import { truncateUtf8, utf8Bytes } from './utf8-truncate.js';
import { defangMarkup } from './tool-call-markup.js';

export const EXCERPT_FIRST_LINE =
  'UNVERIFIED EVIDENCE, NOT AN ANSWER: the research ended without a final answer, so these are raw excerpts of what the tools returned — unchecked, incomplete and not a synthesis.';

/** Below this, the first line and one result's heading would not fit. */
export const MIN_EXCERPT_BYTES = 512;
const ARGS_BYTES = 160;
/** Results squeezed below this many bytes say nothing; older ones are omitted instead. */
const MIN_RESULT_BYTES = 96;

interface Item {
  heading: string;
  body: string;
}

/**
 * The latest run's tool results in the order they arrived: for each, the tool's name, its
 * arguments (shortened) and its result, cut so the whole text is at most `maxBytes` UTF-8 bytes.
 * Results share the room evenly; a short one leaves its unused share to the others. When there
 * are too many to show usefully, the oldest are left out and the text says how many.
 */
export function evidenceExcerpt(messages: readonly ChatMessage[], maxBytes = 8192): string {
  if (!Number.isInteger(maxBytes) || maxBytes < MIN_EXCERPT_BYTES) {
    throw new RangeError(`maxBytes must be an integer of at least ${MIN_EXCERPT_BYTES}, got ${maxBytes}`);
  }
  const items = collectItems(messages);
  if (items.length === 0) {
    return truncateUtf8(`${EXCERPT_FIRST_LINE}\n\n(The tools returned nothing in this run.)`, maxBytes);
  }

  let shown = items;
  let omitted = 0;
  let room = 0;
  for (;;) {
    const note = omitted > 0 ? omittedNote(omitted) : '';
    const fixed = utf8Bytes(EXCERPT_FIRST_LINE) + utf8Bytes(note) + shown.reduce((n, it) => n + utf8Bytes(it.heading), 0);
    room = maxBytes - fixed;
    if (shown.length === 1 || room >= shown.length * MIN_RESULT_BYTES) break;
    shown = shown.slice(1);
    omitted++;
  }

  const caps = shareRoom(shown.map((it) => utf8Bytes(it.body)), Math.max(0, room));
  const parts = [EXCERPT_FIRST_LINE];
  if (omitted > 0) parts.push(omittedNote(omitted));
  // Quoted tool-call markup is made inert — once cut, so a huge result is not scanned whole: the
  // excerpt is a final turn's answer, and a final turn passes no tool call out, not even one a
  // fetched page wrote (SPEC §5).
  shown.forEach((it, i) => parts.push(defangMarkup(it.heading + cutBody(it.body, caps[i]!))));
  // The parts are sized to fit; the final cut guards against rounding in the shares, and against
  // the few bytes a look-alike character adds.
  return truncateUtf8(parts.join(''), maxBytes);
}

function collectItems(messages: readonly ChatMessage[]): Item[] {
  const items: Item[] = [];
  for (const batch of inspectRun(messages, []).batches) {
    for (const call of batch.calls) {
      if (call.resultIndex === null) continue;
      const n = items.length + 1;
      const args = truncateUtf8(call.arguments.replace(/\s+/g, ' ').trim(), ARGS_BYTES);
      const shortened = args.length < call.arguments.trim().length ? '…' : '';
      const text = messageText(messages[call.resultIndex]!.content);
      items.push({
        heading: `\n\n[${n}] tool ${call.name || '(unnamed)'}, arguments ${args || '(none)'}${shortened}\n`,
        body: text === '' ? '(empty result)' : text,
      });
    }
  }
  return items;
}

function omittedNote(count: number): string {
  return `\n\n(${count} earlier tool result${count === 1 ? '' : 's'} left out for length.)`;
}

/** Water-filling: the largest equal cap such that the capped sizes fit in `room`. */
function shareRoom(sizes: number[], room: number): number[] {
  const order = sizes.map((s, i) => ({ s, i })).sort((a, b) => a.s - b.s);
  const caps = new Array<number>(sizes.length).fill(0);
  let left = room;
  order.forEach(({ s, i }, k) => {
    const share = Math.floor(left / (order.length - k));
    caps[i] = Math.min(s, share);
    left -= caps[i]!;
  });
  return caps;
}

function cutBody(body: string, cap: number): string {
  const size = utf8Bytes(body);
  if (size <= cap) return body;
  const marker = ` […cut: ${size} bytes in full]`;
  return truncateUtf8(body, cap - utf8Bytes(marker)) + marker;
}

export interface ExcerptOptions {
  id?: string;
  /** Seconds since the epoch. */
  created?: number;
  /**
   * The request asked for structured output (`response_format: json_schema`): the excerpt, which
   * is no such output, goes in the message's `refusal`, with `content` null — as a model declining
   * the schema answers. The SDKs' parse helpers then return no parsed value rather than throw on
   * text that is not JSON.
   */
  asRefusal?: boolean;
  /** Choices to answer (the request's `n`): each carries the excerpt. Default 1. */
  n?: number;
}

/** Whether a request's excerpt goes as a refusal: it asked for structured output (`response_format: json_schema`). */
export function excerptAsRefusal(body: Record<string, unknown>): boolean {
  const format = body.response_format as { type?: unknown } | null | undefined;
  return format?.type === 'json_schema';
}

/** The excerpt as a choice's message: its content, or its refusal for structured output. */
export function excerptMessage(text: string, asRefusal = false): Record<string, unknown> {
  return asRefusal ? { role: 'assistant', content: null, refusal: text } : { role: 'assistant', content: text, refusal: null };
}

/** A non-streamed `chat.completion` carrying the excerpt in each of its choices: finish_reason `stop`, no tool calls. */
export function excerptCompletion(model: string, text: string, opts: ExcerptOptions = {}): Record<string, unknown> {
  return {
    id: opts.id ?? newId(),
    object: 'chat.completion',
    created: opts.created ?? nowSeconds(),
    model,
    choices: Array.from({ length: opts.n ?? 1 }, (_, index) => ({ index, message: excerptMessage(text, opts.asRefusal), logprobs: null, finish_reason: 'stop' })),
  };
}

const STREAM_PIECE_CHARS = 1024;

/**
 * The `chat.completion.chunk` sequence of the excerpt: a role chunk, content chunks, a finish
 * chunk. With `includeUsage` every chunk carries `usage: null`, as OpenAI's do when the client
 * asked for usage; the caller appends the usage chunk and `data: [DONE]`.
 */
export function excerptStreamChunks(
  model: string,
  text: string,
  includeUsage: boolean,
  opts: ExcerptOptions = {},
): Record<string, unknown>[] {
  const base = { id: opts.id ?? newId(), object: 'chat.completion.chunk', created: opts.created ?? nowSeconds(), model };
  const field = opts.asRefusal ? 'refusal' : 'content';
  const chunks: Record<string, unknown>[] = [];
  for (let index = 0; index < (opts.n ?? 1); index++) {
    const chunk = (delta: Record<string, unknown>, finish: string | null) => ({
      ...base,
      choices: [{ index, delta, logprobs: null, finish_reason: finish }],
      ...(includeUsage ? { usage: null } : {}),
    });
    chunks.push(chunk(opts.asRefusal ? { role: 'assistant', content: null, refusal: '' } : { role: 'assistant', content: '' }, null));
    for (const piece of splitText(text, STREAM_PIECE_CHARS)) chunks.push(chunk({ [field]: piece }, null));
    chunks.push(chunk({}, 'stop'));
  }
  return chunks;
}

/** Pieces of at most `size` UTF-16 units that never split a surrogate pair. */
function splitText(text: string, size: number): string[] {
  const out: string[] = [];
  let i = 0;
  while (i < text.length) {
    let end = Math.min(text.length, i + size);
    const last = text.charCodeAt(end - 1);
    if (end < text.length && last >= 0xd800 && last <= 0xdbff) end--;
    out.push(text.slice(i, end));
    i = end;
  }
  return out;
}

function newId(): string {
  return `chatcmpl-tollgate-${randomUUID()}`;
}

function nowSeconds(): number {
  return Math.floor(Date.now() / 1000);
}
