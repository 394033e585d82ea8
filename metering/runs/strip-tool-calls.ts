// A final turn never passes tool calls out (SPEC §5, seed 001): the client asked a question and
// the gateway promised an answer, so structured calls, their finish reason and any call markup
// written as text are removed — from a whole completion or from a stream, chunk by chunk.

import { MarkupStripper, stripMarkup } from './tool-call-markup.js';
import { showsText, transcriptOf } from './message-text.js';

type Json = Record<string, unknown>;

export interface CompletionStripResult {
  /** A copy of the completion with calls and markup removed. */
  body: unknown;
  /** True when anything was removed. */
  stripped: boolean;
  /** True when the model proposed tools (structured calls, a tool finish reason, or markup). */
  toolsProposed: boolean;
  /** True when no choice has visible text left: the caller answers with the evidence excerpt. */
  empty: boolean;
  /**
   * Positions in `choices` of the choices that are no answer — they proposed tools, or have no
   * visible text left: with `n > 1`, the ones the excerpt stands in for, the others kept.
   */
  failed: number[];
}

const TOOL_FINISH = new Set(['tool_calls', 'function_call']);

const isObject = (v: unknown): v is Json => v !== null && typeof v === 'object' && !Array.isArray(v);
const nonEmpty = (v: unknown) => (Array.isArray(v) ? v.length > 0 : v !== null && v !== undefined);

export function stripToolCallsFromCompletion(json: unknown): CompletionStripResult {
  const body: unknown = structuredClone(json);
  let stripped = false;
  let toolsProposed = false;
  let visible = false;
  const failed: number[] = [];
  const choices = isObject(body) && Array.isArray(body.choices) ? body.choices : [];

  for (const [at, choice] of choices.entries()) {
    if (!isObject(choice)) continue;
    let proposed = false;
    let shown = false;
    const message = isObject(choice.message) ? choice.message : null;
    if (message !== null) {
      for (const field of ['tool_calls', 'function_call']) {
        if (!(field in message)) continue;
        if (nonEmpty(message[field])) proposed = true;
        delete message[field];
        stripped = true;
      }
      if (typeof message.content === 'string') {
        const r = stripMarkup(message.content);
        // What surrounded the markup was layout for it (blank lines), not part of an answer.
        const content = r.found ? r.text.trim() : r.text;
        if (r.found) stripped = proposed = true;
        message.content = content;
        if (showsText(content)) shown = true;
      }
      // A refusal is the model's answer too, if not the one asked for; so is an answer spoken in
      // audio (its content is null, its transcript the text).
      if (typeof message.refusal === 'string' && showsText(message.refusal)) shown = true;
      if (showsText(transcriptOf(message))) shown = true;
    }
    if (typeof choice.finish_reason === 'string' && TOOL_FINISH.has(choice.finish_reason)) {
      choice.finish_reason = 'stop';
      stripped = proposed = true;
    }
    if (proposed) toolsProposed = true;
    if (shown) visible = true;
    if (proposed || !shown) failed.push(at);
  }
  return { body, stripped, toolsProposed, empty: !visible, failed };
}

export interface StreamFilterSummary {
  /** Text held back at the end (a possible tag start that never became one), as a chunk; or null. */
  chunk: Json | null;
  /** True when any non-blank content reached the client. */
  visibleText: boolean;
  toolsProposed: boolean;
  stripped: boolean;
  /** The choices (by index) whose non-blank content reached the client. */
  visibleIn: ReadonlySet<number>;
  /** The choices (by index) that proposed tools. */
  proposedIn: ReadonlySet<number>;
}

/**
 * Filters the parsed `chat.completion.chunk` objects of a final turn. `push` returns the chunk to
 * forward, or null when nothing is left of it (a chunk that only carried a tool-call delta).
 * Text is delayed only while it could be the start of a tool-call tag, and is released with the
 * choice's finish chunk at the latest.
 */
export class StreamToolCallFilter {
  private readonly strippers = new Map<number, MarkupStripper>();
  private readonly finished = new Set<number>();
  private meta: Json = {};
  private readonly visible = new Set<number>();
  private readonly proposed = new Set<number>();
  private removed = false;

  push(chunk: unknown): Json | null {
    if (!isObject(chunk) || !Array.isArray(chunk.choices)) return isObject(chunk) ? chunk : null;
    const { choices, usage, ...meta } = chunk;
    this.meta = meta;
    if (choices.length === 0) return chunk; // the usage chunk

    const kept: Json[] = [];
    for (const raw of choices) {
      if (!isObject(raw)) continue;
      const choice = this.filterChoice(raw);
      if (choice !== null) kept.push(choice);
    }
    if (kept.length === 0 && (usage === null || usage === undefined)) return null;
    return { ...chunk, choices: kept };
  }

  finish(): StreamFilterSummary {
    const choices: Json[] = [];
    for (const [index, stripper] of this.strippers) {
      if (this.finished.has(index)) continue;
      const text = stripper.finish();
      this.noteText(index, text);
      if (text !== '') choices.push({ index, delta: { content: text }, finish_reason: null });
    }
    this.markupFound();
    return {
      chunk: choices.length > 0 ? { ...this.meta, choices } : null,
      visibleText: this.visible.size > 0,
      toolsProposed: this.proposed.size > 0,
      stripped: this.removed,
      visibleIn: this.visible,
      proposedIn: this.proposed,
    };
  }

  private filterChoice(raw: Json): Json | null {
    const index = typeof raw.index === 'number' ? raw.index : 0;
    const choice: Json = { ...raw };
    const delta: Json = isObject(raw.delta) ? { ...raw.delta } : {};
    for (const field of ['tool_calls', 'function_call']) {
      if (!(field in delta)) continue;
      if (nonEmpty(delta[field])) this.proposed.add(index);
      delete delta[field];
      this.removed = true;
    }

    const stripper = this.stripperFor(index);
    const original = delta.content;
    let text = typeof original === 'string' ? stripper.push(original) : '';
    const ending = typeof raw.finish_reason === 'string';
    if (ending) {
      text += stripper.finish();
      this.finished.add(index);
    }
    if (typeof original === 'string' || text !== '') {
      if (text !== '' || original === '') delta.content = text;
      else delete delta.content;
    }
    this.noteText(index, text);
    if (typeof delta.refusal === 'string') this.noteText(index, delta.refusal);
    this.noteText(index, transcriptOf(delta));
    this.markupFound();

    if (ending && TOOL_FINISH.has(raw.finish_reason as string)) {
      choice.finish_reason = 'stop';
      this.proposed.add(index);
      this.removed = true;
    }
    choice.delta = delta;
    const meaningful = Object.values(delta).some((v) => v !== null && v !== undefined && v !== '');
    return meaningful || ending ? choice : null;
  }

  private stripperFor(index: number): MarkupStripper {
    let s = this.strippers.get(index);
    if (s === undefined) {
      s = new MarkupStripper();
      this.strippers.set(index, s);
    }
    return s;
  }

  private noteText(index: number, text: string): void {
    if (showsText(text)) this.visible.add(index);
  }

  private markupFound(): void {
    for (const [index, s] of this.strippers) {
      if (!s.found) continue;
      this.proposed.add(index);
      this.removed = true;
    }
  }
}
