// The plain text of a chat message's content, for comparing tool results and quoting them.

import type { ChatMessage } from '../types.js';

/** String content as is; content parts joined by their `text`; anything else is ''. */
export function messageText(content: ChatMessage['content']): string {
  if (typeof content === 'string') return content;
  if (!Array.isArray(content)) return '';
  const texts: string[] = [];
  for (const part of content) {
    if (typeof part?.text === 'string') texts.push(part.text);
  }
  return texts.join('\n');
}

/** Characters a reader cannot see: whitespace and the zero-width ones `trim()` leaves. */
const UNSEEN = /^[\s\u200b-\u200d\u2060\ufeff]*$/;

/** Whether a text shows anything to a reader (an answer of only blanks or zero-width spaces is none). */
export function showsText(text: string): boolean {
  return !UNSEEN.test(text);
}

/** The transcript of an answer spoken in audio (a message's or a delta's `audio.transcript`), '' without one. */
export function transcriptOf(part: Record<string, unknown>): string {
  const audio = part.audio;
  if (audio === null || typeof audio !== 'object') return '';
  const { transcript } = audio as Record<string, unknown>;
  return typeof transcript === 'string' ? transcript : '';
}
