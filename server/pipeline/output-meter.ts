// Counts generated output per choice as it streams, against the allowance reserved for it. The
// upstream is not trusted to honour `max_tokens` (SPEC §2.6): text that would pass the allowance is
// not forwarded, and the choice is ended by the gateway.

import type { TokenCounter } from '../../metering/types.js';

export type OutputCounting = 'tokenizer' | 'chunk' | 'bytes';

export class OutputMeter {
  private readonly used = new Map<number, number>();
  private readonly bytes = new Map<number, number>();
  private readonly closed = new Set<number>();

  constructor(
    private readonly counting: OutputCounting,
    private readonly counter: TokenCounter,
    readonly perChoice: number,
  ) {}

  /** How the output was counted, for the ledger's label. */
  get method(): string {
    return this.counting === 'tokenizer' ? this.counter.method : this.counting === 'chunk' ? 'llamacpp' : 'estimate:bytes';
  }

  private cost(index: number, text: string): number {
    switch (this.counting) {
      case 'tokenizer':
        return this.counter.countOutput(text);
      case 'chunk':
        // llama.cpp streams one generated token per chunk.
        return 1;
      case 'bytes': {
        const before = this.bytes.get(index) ?? 0;
        const after = before + Buffer.byteLength(text, 'utf8');
        this.bytes.set(index, after);
        return Math.ceil(after / 4) - Math.ceil(before / 4);
      }
    }
  }

  /** Adds a piece of a choice's output. False when it would pass the allowance (then not counted). */
  add(index: number, text: string): boolean {
    if (text.length === 0) return true;
    if (this.closed.has(index)) return false;
    const have = this.used.get(index) ?? 0;
    const cost = this.cost(index, text);
    if (have + cost > this.perChoice) {
      this.closed.add(index);
      return false;
    }
    this.used.set(index, have + cost);
    return true;
  }

  isClosed(index: number): boolean {
    return this.closed.has(index);
  }

  close(index: number): void {
    this.closed.add(index);
  }

  total(): number {
    let sum = 0;
    for (const v of this.used.values()) sum += v;
    return sum;
  }
}

/** Text a streamed choice delta carries (content, a completion's text, or tool-call arguments). */
export function deltaText(choice: Record<string, unknown>): string {
  let text = '';
  if (typeof choice.text === 'string') text += choice.text;
  const delta = choice.delta;
  if (delta && typeof delta === 'object') {
    const d = delta as Record<string, unknown>;
    if (typeof d.content === 'string') text += d.content;
    if (typeof d.reasoning_content === 'string') text += d.reasoning_content;
    if (Array.isArray(d.tool_calls)) {
      for (const call of d.tool_calls as Array<Record<string, unknown>>) {
        const fn = call.function as Record<string, unknown> | undefined;
        if (typeof fn?.name === 'string') text += fn.name;
        if (typeof fn?.arguments === 'string') text += fn.arguments;
      }
    }
  }
  return text;
}
