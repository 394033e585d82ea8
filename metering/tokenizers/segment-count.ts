// Exact tiktoken counts of ordinary text, word by word from a memo (ADR 0013).
//
// tiktoken first cuts text into pre-tokens with a regular expression, then runs BPE inside each
// pre-token; no token spans two pre-tokens. In both encodings we use (cl100k_base, o200k_base), no
// pre-token contains a non-whitespace character followed by a space (U+0020): every alternative of
// the pattern either holds whitespace only, or starts with at most one space and holds no space
// after its first character. The pattern has no look-behind and no `^`/`\b`, so matching from such
// a space onwards does not depend on what came before it, and the text before it ends on a
// non-whitespace character, where the end of the input and a following space are alike to every
// alternative. Hence: cut the text before each space that follows a non-whitespace character, and
// the count of the whole is exactly the sum of the counts of the segments (" the", " proxy,", …).
//
// Ordinary prose reuses a small vocabulary of such segments, so their counts are memoised: a new
// message mostly costs map look-ups instead of a call into tiktoken's WASM, which encodes prose at
// ~4–5 characters per µs and costs ~2.5 µs per call. `test/tokenizers/segment-count.test.ts` checks
// the equality against `encode_ordinary` on prose, code, JSON, many scripts and random text.

import type { Tiktoken } from '@dqbd/tiktoken';
import { ownString } from '../own-string.js';

/** Segments longer than this are not memoised (they rarely repeat) and are encoded in one batch. */
export const MAX_MEMO_SEGMENT = 48;
/** Memoised segments per encoding; the memo is cleared when full (a cheap memo, not a cache). */
export const SEGMENT_MEMO_LIMIT = 100_000;
/**
 * New segments encoded one call each (and so learnt) per text. The rest of a text's new segments
 * are joined and encoded in one call: a text of unfamiliar words costs at most this many extra calls.
 */
export const NEW_SEGMENTS_PER_TEXT = 24;
/** Texts this short are encoded in one call: cutting them would not save any. */
const SHORT_TEXT = 12;

const memos = new Map<Tiktoken, Map<string, number>>();

/** Unicode White_Space, as the pattern's `\s` means it (JavaScript's `\s` also takes U+FEFF). */
function isWhiteSpace(c: number): boolean {
  if (c <= 0x20) return c === 0x20 || (c >= 0x09 && c <= 0x0d);
  if (c < 0x85) return false;
  return (
    c === 0x85 || c === 0xa0 || c === 0x1680 || (c >= 0x2000 && c <= 0x200a) || c === 0x2028 || c === 0x2029 || c === 0x202f || c === 0x205f || c === 0x3000
  );
}

/** `enc.encode_ordinary(text).length`, exactly, from memoised segment counts where it can. */
export function countOrdinary(enc: Tiktoken, text: string): number {
  if (text.length <= SHORT_TEXT) return enc.encode_ordinary(text).length;
  let memo = memos.get(enc);
  if (memo === undefined) memos.set(enc, (memo = new Map()));
  let tokens = 0;
  let learnt = 0;
  // New segments past the per-text allowance, joined: cuts fall between them exactly as in the text.
  let batch = '';
  let start = 0;
  const n = text.length;
  for (let i = 1; i <= n; i++) {
    if (i < n && !(text.charCodeAt(i) === 0x20 && !isWhiteSpace(text.charCodeAt(i - 1)))) continue;
    // The last segment may end in whitespace: it is always encoded on its own, never memoised
    // (the end of the input and a following space differ for trailing whitespace).
    const segment = start === 0 && i === n ? text : text.slice(start, i);
    start = i;
    if (i === n && isWhiteSpace(segment.charCodeAt(segment.length - 1))) {
      tokens += enc.encode_ordinary(segment).length;
      break;
    }
    if (segment.length > MAX_MEMO_SEGMENT) {
      batch += segment;
      continue;
    }
    const known = memo.get(segment);
    if (known !== undefined) {
      tokens += known;
      continue;
    }
    if (learnt >= NEW_SEGMENTS_PER_TEXT) {
      batch += segment;
      continue;
    }
    const count = enc.encode_ordinary(segment).length;
    learnt++;
    if (memo.size >= SEGMENT_MEMO_LIMIT) memo.clear();
    memo.set(ownString(segment), count);
    tokens += count;
  }
  if (batch.length > 0) tokens += enc.encode_ordinary(batch).length;
  return tokens;
}

/**
 * Where the last cut of `text` into segments falls (before a space that follows a non-whitespace
 * character: see above), at or after `from`; -1 when there is none. The count of the text before
 * it plus the count of the text from it is the count of the whole, whatever follows the text.
 */
export function lastSegmentCut(text: string, from = 1): number {
  for (let i = text.length - 1; i >= Math.max(1, from); i--) {
    if (text.charCodeAt(i) === 0x20 && !isWhiteSpace(text.charCodeAt(i - 1))) return i;
  }
  return -1;
}

/** Memoised segments per encoder (for tests). */
export function segmentMemoSize(enc: Tiktoken): number {
  return memos.get(enc)?.size ?? 0;
}
