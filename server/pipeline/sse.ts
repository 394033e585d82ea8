// Incremental Server-Sent Events framing: bytes in, whole events out, as they arrive (STYLE §7).
// Only what an OpenAI-style stream uses: `data:` lines, comments, blank-line event ends.

import { StringDecoder } from 'node:string_decoder';

export interface SseEvent {
  /** Joined `data:` lines, or null for an event with none (a comment). */
  data: string | null;
  /** The event's raw text, without its terminating blank line. */
  raw: string;
  /** The `event:` name, when the event has one (`error`); absent for the usual `data:` event. */
  event?: string;
}

/**
 * The most text one event may hold before its blank line. An OpenAI-style chunk is a few hundred
 * bytes and llama.cpp's last one, with its timings, a few KB; an upstream that never ends its event
 * would otherwise grow the buffer without bound.
 */
export const MAX_EVENT_CHARS = 16 * 1024 * 1024;

/** An upstream's event grew past MAX_EVENT_CHARS without ending. */
export class SseEventTooLarge extends Error {
  constructor() {
    super(`an event of the upstream's stream passed ${MAX_EVENT_CHARS} characters without ending`);
  }
}

export class SseParser {
  /** The start of an event still waiting for its blank line, as read (never holds a blank line). */
  private held: string[] = [];
  private heldChars = 0;
  // StringDecoder rather than TextDecoder: the same handling of a character split across reads,
  // at a sixth of the cost per read in Node 20 (TextDecoder's streaming mode is the slow path).
  private readonly decoder = new StringDecoder('utf8');
  /** No text has arrived yet: a byte order mark may start it. */
  private first = true;
  /** The last text ended with a CR: an LF starting the next one is the same line end. */
  private afterCR = false;

  push(chunk: Uint8Array): SseEvent[] {
    return this.drain(this.decoder.write(chunk as Buffer), false);
  }

  /** Whatever is left when the upstream ends (a last event without its blank line). */
  end(): SseEvent[] {
    return this.drain(this.decoder.end(), true);
  }

  private drain(incoming: string, final: boolean): SseEvent[] {
    let text = incoming;
    if (text.length > 0) {
      // A stream may start with a byte order mark, which is not part of its first line (the
      // TextDecoder this replaced dropped it too).
      if (this.first) {
        this.first = false;
        if (text.charCodeAt(0) === 0xfeff) text = text.slice(1);
      }
      // CRLF, CR and LF all end a line. A CR that ends one read ends its line at once (an event it
      // completes goes out now); an LF at the start of the next read belongs to it.
      if (this.afterCR) {
        this.afterCR = false;
        if (text.charCodeAt(0) === 0x0a) text = text.slice(1);
      }
      if (text.includes('\r')) {
        this.afterCR = text.charCodeAt(text.length - 1) === 0x0d;
        text = text.replace(/\r\n?/g, '\n');
      }
    }
    // A read that ends no event is only held: the pieces of a long event are joined once, when its
    // blank line arrives, not copied again with every read.
    const endsHeld = text.charCodeAt(0) === 0x0a && this.held.length > 0 && this.held[this.held.length - 1]!.endsWith('\n');
    if (!final && !endsHeld && !text.includes('\n\n')) {
      if (text.length > 0) {
        this.held.push(text);
        this.heldChars += text.length;
        if (this.heldChars > MAX_EVENT_CHARS) throw new SseEventTooLarge();
      }
      return [];
    }
    const events: SseEvent[] = [];
    const buf = this.held.join('') + text;
    let start = 0;
    // What was held has no blank line in it: the search starts at its last character.
    let from = Math.max(0, this.heldChars - 1);
    let at: number;
    while ((at = buf.indexOf('\n\n', from)) !== -1) {
      if (at > start) events.push(parseEvent(buf.slice(start, at)));
      start = at + 2;
      from = start;
    }
    const rest = buf.slice(start);
    if (rest.length > MAX_EVENT_CHARS) throw new SseEventTooLarge();
    if (final && rest.trim().length > 0) events.push(parseEvent(rest.replace(/\n+$/, '')));
    this.held = final || rest.length === 0 ? [] : [rest];
    this.heldChars = final ? 0 : rest.length;
    return events;
  }
}

function parseEvent(raw: string): SseEvent {
  // The usual event is one `data: …` line.
  if (raw.startsWith('data: ') && !raw.includes('\n')) return { data: raw.slice(6), raw };
  const data: string[] = [];
  let event: string | undefined;
  for (const line of raw.split('\n')) {
    if (line.startsWith('data:')) data.push(line.slice(line.startsWith('data: ') ? 6 : 5));
    else if (line.startsWith('event:')) event = line.slice(6).trim();
  }
  return { data: data.length > 0 ? data.join('\n') : null, raw, ...(event ? { event } : {}) };
}

export function sseData(value: unknown): string {
  return `data: ${typeof value === 'string' ? value : JSON.stringify(value)}\n\n`;
}
