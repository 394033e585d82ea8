// Incremental Server-Sent Events framing: bytes in, whole events out, as they arrive (STYLE §7).
// Only what an OpenAI-style stream uses: `data:` lines, comments, blank-line event ends.

export interface SseEvent {
  /** Joined `data:` lines, or null for an event with none (a comment). */
  data: string | null;
  /** The event's raw text, without its terminating blank line. */
  raw: string;
  /** The `event:` name, when the event has one (`error`); absent for the usual `data:` event. */
  event?: string;
}

export class SseParser {
  private buffer = '';
  private readonly decoder = new TextDecoder();

  push(chunk: Uint8Array): SseEvent[] {
    this.buffer += this.decoder.decode(chunk, { stream: true });
    return this.drain(false);
  }

  /** Whatever is left when the upstream ends (a last event without its blank line). */
  end(): SseEvent[] {
    this.buffer += this.decoder.decode();
    return this.drain(true);
  }

  private drain(final: boolean): SseEvent[] {
    const events: SseEvent[] = [];
    this.buffer = this.buffer.replace(/\r\n?/g, '\n');
    let at: number;
    while ((at = this.buffer.indexOf('\n\n')) !== -1) {
      const raw = this.buffer.slice(0, at);
      this.buffer = this.buffer.slice(at + 2);
      if (raw.length > 0) events.push(parseEvent(raw));
    }
    if (final && this.buffer.trim().length > 0) {
      events.push(parseEvent(this.buffer.replace(/\n+$/, '')));
      this.buffer = '';
    }
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
