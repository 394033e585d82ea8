// Counts generated output per choice as it streams, against the allowance reserved for it. The
// upstream is not trusted to honour `max_tokens` (SPEC §2.6): text that would pass the allowance is
// not forwarded — only the start of the crossing piece that still fits — and the choice is ended by
// the gateway. Such a choice counts its whole allowance: the upstream did write the piece that
// crossed it (and settlement never charges past the reservation).
//
// With a tokenizer, a chunk's UTF-8 bytes are an upper bound on its tokens (a byte-level BPE token
// is at least one byte), so while a choice's bytes stay within its allowance nothing needs counting
// per chunk; its text is counted once, exactly, when it nears the allowance or when the stream ends.
// That keeps a tokenizer call off every one of a long stream's chunks (bench/RESULTS.md).
//
// Without a tokenizer (a model no tokenizer here knows, on an OpenAI-compatible server) the text is
// counted by the labelled byte estimate, four bytes a token, which is no bound: a model writing
// long words or code writes more bytes a token, and the estimate passes the allowance before the
// model does. A cut there truncated honest answers. So a choice is cut only once its bytes pass
// eight a token of the allowance — as sure a sign as bytes give that the upstream ignored
// `max_tokens` — and the estimate, which is what is recorded when the upstream reports no usage,
// is capped at the allowance (ADR 0004).

import type { TokenCounter } from '../../metering/types.js';
import { utf8Prefix } from '../../metering/utf8-prefix.js';
import { lastSegmentCut } from '../../metering/tokenizers/segment-count.js';
import { transcriptOf } from '../../metering/runs/message-text.js';
import { withinBound } from './count-answer.js';

/** Bytes a token at most, for cutting a stream counted without a tokenizer. */
export const CUT_BYTES_PER_TOKEN = 8;
/**
 * Near the allowance, a choice's uncommitted text is counted again with each piece as far back as
 * its last segment cut, within this many characters (a run without spaces is committed instead).
 */
const MAX_RECOUNT_CHARS = 256;

export type OutputCounting = 'tokenizer' | 'chunk' | 'bytes';

interface ChoiceMeter {
  /** Exact tokens of the text counted so far (near the allowance, or at the end), else null. */
  exact: number | null;
  /** Text not yet counted exactly, and its UTF-8 bytes (an upper bound on its tokens). */
  pending: string[];
  bytes: number;
  /** Tokens by the chunk or byte-estimate rules. */
  estimated: number;
  closed: boolean;
  /**
   * The upstream wrote past the allowance: the piece that crossed it was not forwarded, but it was
   * generated, so the choice counts its whole allowance (and never more: settlement never charges
   * more than was reserved).
   */
  cut: boolean;
  /** Of the prompt a completions request with `echo` has echoed back, what is still to come. */
  echo: string;
  /**
   * Chunk counting: the tool calls the choice wrote, and the chunks that carried them. A server's
   * tool-call parser sends a call in pieces of several tokens each (and holds back its markup), so
   * they are counted as text once the stream ends (`countCalls`) in place of a token a chunk.
   */
  calls: string;
  callChunks: number;
  /** The tool calls the choice began (each call's `index` in its deltas), for settle.ts's share of their markup. */
  callIndexes: Set<number> | null;
}

/** How many of `text`'s first characters repeat `echo`: where a completion's echoed prompt ends in it. */
export function echoedLength(text: string, echo: string): number {
  let k = 0;
  const most = Math.min(text.length, echo.length);
  while (k < most && text.charCodeAt(k) === echo.charCodeAt(k)) k++;
  return k;
}

export class OutputMeter {
  private readonly choices = new Map<number, ChoiceMeter>();
  /**
   * After `add` refused a piece: its start that fits what the choice had left ('' when none, or
   * when it cannot be told). The relay forwards it with the cut, so a piece of several tokens that
   * crosses the allowance still delivers the tokens the choice is charged for.
   */
  cutText = '';

  constructor(
    private readonly counting: OutputCounting,
    private readonly counter: TokenCounter,
    readonly perChoice: number,
    /**
     * Completions with `echo`: the prompt a choice's text starts with, which the model read and
     * did not write. It is passed on uncounted ('' when the prompt is token ids, unknown as text).
     */
    private readonly echoOf?: (index: number) => string,
  ) {}

  /** How the output was counted, for the ledger's label. */
  get method(): string {
    return this.counting === 'tokenizer' ? this.counter.method : this.counting === 'chunk' ? 'llamacpp' : 'estimate:bytes';
  }

  private choice(index: number): ChoiceMeter {
    let c = this.choices.get(index);
    if (!c) this.choices.set(index, (c = { exact: null, pending: [], bytes: 0, estimated: 0, closed: false, cut: false, echo: this.echoOf?.(index) ?? '', calls: '', callChunks: 0, callIndexes: null }));
    return c;
  }

  /** The start of `text` that is the choice's echoed prompt (consumed), and the rest. */
  private takeEcho(c: ChoiceMeter, text: string): [string, string] {
    const k = echoedLength(text, c.echo);
    // Text that parts from the prompt is the model's own: the echo is over.
    c.echo = k === Math.min(text.length, c.echo.length) ? c.echo.slice(k) : '';
    return [text.slice(0, k), text.slice(k)];
  }

  /**
   * Adds a piece of a choice's output. False when it would pass the allowance: the piece is not to
   * be forwarded, and the choice has then generated its whole allowance.
   * @param calls the part of `text` that is tool calls written (`toolCallText`)
   */
  add(index: number, text: string, calls = ''): boolean {
    this.cutText = '';
    if (text.length === 0) return true;
    const c = this.choice(index);
    if (c.closed) return false;
    if (c.echo.length > 0) {
      const [echoed, written] = this.takeEcho(c, text);
      if (echoed.length > 0) {
        const ok = this.add(index, written);
        // A cut keeps the echoed prompt ahead of what still fits.
        if (!ok) this.cutText = echoed + this.cutText;
        return ok;
      }
    }
    const bytes = Buffer.byteLength(text, 'utf8');
    switch (this.counting) {
      case 'chunk':
        // llama.cpp streams one generated token per chunk (fixtures/llamacpp) — but its tool calls
        // in pieces, counted at the end (`countCalls`).
        return this.admit(c, c.estimated + 1, () => {
          c.estimated += 1;
          if (calls !== '') {
            c.calls += calls;
            c.callChunks += 1;
          }
        });
      case 'bytes': {
        const after = c.bytes + bytes;
        const ok = this.admit(c, Math.ceil(after / CUT_BYTES_PER_TOKEN), () => {
          c.bytes = after;
          c.estimated = Math.min(this.perChoice, Math.ceil(after / 4));
        });
        if (!ok) this.cutText = utf8Prefix(text, this.perChoice * CUT_BYTES_PER_TOKEN - c.bytes);
        return ok;
      }
      case 'tokenizer': {
        // Exact tokens of what was counted + bytes of what was not: an upper bound.
        if ((c.exact ?? 0) + c.bytes + bytes <= this.perChoice) {
          c.bytes += bytes;
          c.pending.push(text);
          return true;
        }
        // Near the allowance: the choice's text so far, counted exactly. Counts of two texts add
        // up to the count of both only where the cut between them is a segment cut (a space after
        // a word: metering/tokenizers/segment-count.ts) — a piece that ends inside a word, as a
        // server that re-chunks its stream sends, would add a token at every such end. So what is
        // committed ends at a segment cut, and the rest is counted again with the next piece.
        const before = c.pending.join('');
        const whole = before + text;
        const exact = c.exact ?? 0;
        const cut = lastSegmentCut(whole, whole.length - MAX_RECOUNT_CHARS);
        const head = cut > 0 ? this.counter.countOutput(whole.slice(0, cut)) : 0;
        const tail = cut > 0 ? whole.slice(cut) : whole;
        const tailTokens = this.counter.countOutput(tail);
        if (exact + head + tailTokens <= this.perChoice) {
          // A tail with no cut in reach (a long run without spaces) is committed as it is: a
          // token at most too many at its end, rather than counting it again on every piece.
          const keep = cut > 0 || tail.length < MAX_RECOUNT_CHARS;
          c.exact = exact + head + (keep ? 0 : tailTokens);
          c.pending = keep ? [tail] : [];
          c.bytes = keep ? Buffer.byteLength(tail, 'utf8') : 0;
          return true;
        }
        const left = this.perChoice - exact - (before.length > 0 ? this.counter.countOutput(before) : 0);
        c.closed = true;
        c.cut = true;
        this.cutText = left > 0 ? (this.counter.leadingText?.(text, left) ?? '') : '';
        return false;
      }
    }
  }

  /**
   * Chunk counting, once the stream has ended: each choice's tool calls counted as the text they
   * are, with the server's tokenizer, in place of the token a chunk they were first counted at.
   * (The markup the server's parser held back is still not seen: where the server's own usage is
   * trusted, it stands; settle.ts.) A tokenizer that cannot be reached, or does not answer within
   * `asked.timeoutMs` (count-answer.ts `ANSWER_COUNT_TIMEOUT_MS`), leaves the chunks' count.
   */
  async countCalls(asked: { signal: AbortSignal; timeoutMs: number }): Promise<void> {
    if (this.counting !== 'chunk') return;
    const calling = [...this.choices.values()].filter((c) => c.calls !== '' && !c.cut);
    if (calling.length === 0) return;
    // The client's stream ends after the last answer: every choice is asked at once, within a bound.
    await withinBound(asked.signal, asked.timeoutMs, (signal) =>
      Promise.all(
        calling.map(async (c) => {
          try {
            const counted = await (this.counter.countGenerated?.(c.calls, signal) ?? this.counter.countText(c.calls, signal));
            c.estimated += Math.max(0, counted.tokens - c.callChunks);
            c.callChunks = counted.tokens;
          } catch {
            // the chunks' count stands
          }
        }),
      ),
    );
  }

  private admit(c: ChoiceMeter, after: number, commit: () => void): boolean {
    if (after > this.perChoice) {
      c.closed = true;
      c.cut = true;
      return false;
    }
    commit();
    return true;
  }

  private flush(c: ChoiceMeter): number {
    const n = c.pending.length > 0 ? this.counter.countOutput(c.pending.join('')) : 0;
    c.pending = [];
    c.bytes = 0;
    return n;
  }

  /** Notes the tool calls a choice's delta writes (its `tool_calls` entries, by their `index`). */
  noteCalls(index: number, delta: Record<string, unknown>): void {
    const calls = delta.tool_calls;
    if (!Array.isArray(calls) || calls.length === 0) return;
    const c = this.choice(index);
    c.callIndexes ??= new Set();
    calls.forEach((call, at) => {
      const i = call !== null && typeof call === 'object' ? (call as Record<string, unknown>).index : undefined;
      c.callIndexes!.add(typeof i === 'number' ? i : at);
    });
  }

  /** Tool calls written: by the choice of index 0, and by the others together. */
  toolCalls(): { first: number; others: number } {
    let first = 0;
    let others = 0;
    for (const [index, c] of this.choices) {
      // A choice cut at its allowance is charged the whole of it already.
      const n = c.cut ? 0 : (c.callIndexes?.size ?? 0);
      if (index === 0) first = n;
      else others += n;
    }
    return { first, others };
  }

  /** Tokens generated so far, all choices (exact with a tokenizer). Safe to call more than once. */
  total(): number {
    let sum = 0;
    for (const c of this.choices.values()) sum += this.tokensOf(c);
    return sum;
  }

  /** Tokens generated so far by the choice of `index` (undefined when it wrote nothing), as `total` counts them. */
  choiceTotal(index: number): number | undefined {
    const c = this.choices.get(index);
    return c === undefined ? undefined : this.tokensOf(c);
  }

  private tokensOf(c: ChoiceMeter): number {
    if (c.cut) return this.perChoice;
    if (this.counting !== 'tokenizer') return c.estimated;
    c.exact = (c.exact ?? 0) + this.flush(c);
    return c.exact;
  }
}

/** Text a streamed choice delta carries (a completion's text, or what its delta wrote). */
export function deltaText(choice: Record<string, unknown>): string {
  const text = typeof choice.text === 'string' ? choice.text : '';
  const delta = choice.delta;
  return delta && typeof delta === 'object' ? text + writtenText(delta as Record<string, unknown>) : text;
}

/**
 * The part of a streamed choice a reader takes for the answer: a completion's text, the delta's
 * content or refusal — not its reasoning, not its tool calls. A final turn that wrote only those
 * wrote no answer (SPEC §5).
 */
export function answerText(choice: Record<string, unknown>): string {
  let text = typeof choice.text === 'string' ? choice.text : '';
  const delta = choice.delta;
  if (delta && typeof delta === 'object') {
    const { content, refusal } = delta as Record<string, unknown>;
    if (typeof content === 'string') text += content;
    if (typeof refusal === 'string') text += refusal;
    text += transcriptOf(delta as Record<string, unknown>);
  }
  return text;
}

/**
 * A message or a delta carries audio the model spoke (`audio.data`, base64): output no tokenizer
 * here counts. Its transcript is counted; the audio's own tokens are known only from the provider's
 * usage (server/pipeline/settle.ts).
 */
export function carriesAudio(part: Record<string, unknown>): boolean {
  const audio = part.audio;
  if (audio === null || typeof audio !== 'object') return false;
  const { data } = audio as Record<string, unknown>;
  return typeof data === 'string' && data !== '';
}

/**
 * What the model wrote in a message or a delta: its content, its reasoning (`reasoning_content`:
 * DeepSeek, llama.cpp; `reasoning`: OpenRouter, Groq, vLLM — reasoning tokens are output tokens,
 * SPEC §7; one text when a server sends it under both names), a refusal, the transcript of an
 * answer spoken in audio, and its tool calls, the legacy `function_call` included (SPEC §4:
 * generated output counts the tool calls written).
 */
export function writtenText(part: Record<string, unknown>): string {
  // Reasoning first, as a model writes it and a stream's meter reads it: a whole answer's count
  // then joins its texts where the stream's does (a token can straddle the join).
  const { reasoning_content: reasoningContent, reasoning } = part;
  let text = typeof reasoningContent === 'string' ? reasoningContent : '';
  if (typeof reasoning === 'string' && reasoning !== reasoningContent) text += reasoning;
  if (typeof part.content === 'string') text += part.content;
  if (typeof part.refusal === 'string') text += part.refusal;
  text += transcriptOf(part);
  return text + toolCallText(part);
}

/** The tool calls a message or a delta writes: each call's name and arguments (a custom tool's input), the legacy `function_call` included. */
export function toolCallText(part: Record<string, unknown>): string {
  let text = '';
  if (Array.isArray(part.tool_calls)) {
    // An upstream's malformed entry (null, a string) carries no text to count.
    // A custom tool's call writes `custom: {name, input}` where a function's writes `function`.
    for (const call of part.tool_calls as unknown[]) {
      if (call !== null && typeof call === 'object') text += callText((call as Record<string, unknown>).function) + callText((call as Record<string, unknown>).custom);
    }
  }
  return text + callText(part.function_call);
}

function callText(fn: unknown): string {
  if (fn === null || typeof fn !== 'object') return '';
  const { name, arguments: args, input } = fn as Record<string, unknown>;
  return (typeof name === 'string' ? name : '') + (typeof args === 'string' ? args : '') + (typeof input === 'string' ? input : '');
}
