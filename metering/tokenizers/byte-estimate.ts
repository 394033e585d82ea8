// The labelled fallback for models no tokenizer here knows: UTF-8 bytes ÷ 4, rounded up. It is an
// estimate and is always called one (`estimate:bytes`, SPEC §2). Chat keeps the same structure as
// the exact counters (per-message overhead, tools first, reply priming) so prefix charging works.
import type { ChatCount, ChatPrompt, CountMethod, TextCount, TokenCounter } from '../types.js';

const PER_MESSAGE = 3;
const REPLY_PRIMING = 3;

/** Bytes per estimated token; a byte-level tokenizer can need up to one token per byte. */
export const BYTES_PER_ESTIMATED_TOKEN = 4;

export function estimateTokens(text: string): number {
  return Math.ceil(Buffer.byteLength(text, 'utf8') / BYTES_PER_ESTIMATED_TOKEN);
}

export class ByteEstimateCounter implements TokenCounter {
  readonly method: CountMethod = 'estimate:bytes';

  async countChat(prompt: ChatPrompt): Promise<ChatCount> {
    const offered = prompt.tools ?? [];
    const tools =
      (offered.length > 0 ? estimateTokens(JSON.stringify(offered)) : 0) +
      (prompt.format !== undefined ? estimateTokens(JSON.stringify(prompt.format) ?? '') : 0);
    const prefix = [tools];
    for (const message of prompt.messages) {
      prefix.push(prefix[prefix.length - 1] + PER_MESSAGE + estimateTokens(JSON.stringify(message)));
    }
    return { tokens: prefix[prefix.length - 1] + REPLY_PRIMING, prefix, method: this.method, upperBound: false };
  }

  async countText(text: string): Promise<TextCount> {
    return { tokens: estimateTokens(text), method: this.method, upperBound: false };
  }

  countOutput(text: string): number {
    return estimateTokens(text);
  }
}
