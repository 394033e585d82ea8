// Where each message ends in a prompt rendered by a server's own chat template, and how many of
// the server's tokens lie wholly before each of those points. Used for `ChatCount.prefix` of
// llama.cpp upstreams, where the template is the server's and we only see its output.
//
// Everything here errs low: a shared prefix may be undercounted (the client is charged a little
// more) but never overcounted (SPEC §4: credit only what is really shared).
import { createHash, type Hash } from 'node:crypto';
import type { ChatMessage } from '../types.js';

/** One token of `POST /tokenize` with `with_pieces: true`: its text, or its bytes when not UTF-8. */
export interface Piece {
  id: number;
  piece: string | number[];
}

/**
 * Character offsets `[start of message 0's text, end of message 0's text, …, end of message n−1's]`
 * (length n + 1). Each message's own text (content, then tool-call names) is searched in order from
 * the previous end. A first occurrence can only be at or before the true one, so every offset is
 * at or before the true boundary. Text the template rewrites (tool-call arguments re-serialised)
 * is not searched; a message with nothing findable ends where the previous one did.
 */
export function messageBoundaries(prompt: string, messages: ChatMessage[]): number[] {
  const anchors = messages.map(anchorsOf);
  const firstAnchor = anchors[0]?.[0];
  const firstAt = firstAnchor === undefined ? -1 : prompt.indexOf(firstAnchor);
  const bounds = [firstAt >= 0 ? firstAt : 0];
  let cursor = bounds[0];
  for (const list of anchors) {
    for (const anchor of list) {
      const at = prompt.indexOf(anchor, cursor);
      if (at < 0) break;
      cursor = at + anchor.length;
    }
    bounds.push(cursor);
  }
  return bounds;
}

/**
 * A template's end-of-message mark, then an optional line end: the known ones only — ChatML's
 * `<|im_end|>`, Llama 3's `<|eot_id|>`, Phi-3's `<|end|>`, Gemma's `<end_of_turn>`, `</s>`,
 * Command R's `<|END_OF_TURN_TOKEN|>`, Granite's `<|end_of_text|>`. Any tag would do worse: in a
 * template with no mark (GLM-4) the tag after a message is the next role's opening, and after
 * the last message it is the reply priming, which SPEC §11 leaves out.
 */
const CLOSING = /^(?:<\|(?:im_end|eot_id|end|eot|end_of_text|endoftext|END_OF_TURN_TOKEN)\|>|<end_of_turn>|<\/s>)[ \t]*\n?/;
/** What must follow it: the next message's opening tag, or the end of the prompt. */
const OPENING_OR_END = /^(?:<\|[A-Za-z0-9_]{1,40}\|>|<[A-Za-z_]{1,40}>|$)/;

/**
 * `offset` (the end of a message's text) moved past the message's closing mark, when the template
 * writes one: the rendered message ends there (SPEC §4 and §11 count a shared message whole, and
 * only the reply priming after the last one is left out). The mark is taken only when it is
 * followed at once by another tag or the end — `<|im_end|>\n<|im_start|>` (ChatML),
 * `<|eot_id|><|start_header_id|>` (Llama 3), `<end_of_turn>\n<start_of_turn>` (Gemma); a
 * template with no such mark (text runs into the next role's name, tool-call JSON after a name)
 * leaves the offset where it was, which errs low as everything here does. The previous request,
 * which ended with this message, had the same mark before its reply priming.
 */
export function pastClosing(prompt: string, offset: number): number {
  const rest = prompt.slice(offset, offset + 64);
  const mark = CLOSING.exec(rest);
  if (mark === null || !OPENING_OR_END.test(prompt.slice(offset + mark[0].length, offset + mark[0].length + 48))) return offset;
  return offset + mark[0].length;
}

function anchorsOf(message: ChatMessage): string[] {
  const out: string[] = [];
  const content = message.content;
  if (typeof content === 'string') out.push(content);
  else if (Array.isArray(content)) {
    for (const part of content) if (typeof part.text === 'string') out.push(part.text);
  }
  for (const call of message.tool_calls ?? []) {
    if (typeof call.function?.name === 'string') out.push(call.function.name);
  }
  return out.filter((s) => s.length > 0);
}

/**
 * For each character offset, the number of tokens that end at or before it. Tokens are aligned to
 * the prompt's UTF-8 bytes; a token whose bytes are not in the text (a BOS the server adds) is
 * zero-width; once two tokens in a row fail to align, later tokens are not counted at all.
 */
export function tokensBefore(prompt: string, pieces: Piece[], offsets: number[]): number[] {
  const bytes = Buffer.from(prompt, 'utf8');
  const tokenEnds: number[] = [];
  let pos = 0;
  let misses = 0;
  for (const p of pieces) {
    const piece = pieceBytes(p.piece);
    let matched = matchAt(bytes, pos, piece);
    // SentencePiece vocabularies report a leading space for a word at the start of the text.
    if (!matched && piece.length > 1 && piece[0] === 0x20) {
      const trimmed = piece.subarray(1);
      if (matchAt(bytes, pos, trimmed)) {
        matched = true;
        pos += trimmed.length;
      }
    } else if (matched) pos += piece.length;
    if (matched) misses = 0;
    else if (++misses >= 2) {
      tokenEnds.pop(); // the previous unaligned token was not a zero-width one after all
      break;
    }
    tokenEnds.push(pos);
  }
  // Offsets are non-decreasing: sweep once, converting characters to bytes incrementally.
  const counts: number[] = [];
  let n = 0;
  let prevChar = 0;
  let limit = 0;
  for (const charOffset of offsets) {
    limit += Buffer.byteLength(prompt.slice(prevChar, Math.max(prevChar, charOffset)), 'utf8');
    prevChar = Math.max(prevChar, charOffset);
    while (n < tokenEnds.length && tokenEnds[n] <= limit) n++;
    counts.push(n);
  }
  return counts;
}

function pieceBytes(piece: string | number[]): Buffer {
  return typeof piece === 'string' ? Buffer.from(piece, 'utf8') : Buffer.from(piece);
}

function matchAt(text: Buffer, pos: number, piece: Buffer): boolean {
  if (piece.length === 0 || pos + piece.length > text.length) return false;
  return text.compare(piece, 0, piece.length, pos, pos + piece.length) === 0;
}

/**
 * For each count `n` in `counts` (non-decreasing), a digest of the first `n` token ids, in one pass
 * over the ids. Two requests whose leading messages render to the same tokens have the same
 * digests at the same counts; a template that renders them differently at the same count (Llama
 * 3.x writes today's date into its system turn) does not (ADR 0004). 16 base64url characters (96
 * bits): only ever compared with the same conversation's previous request.
 */
export function tokenDigests(ids: readonly number[] | Int32Array, counts: readonly number[]): string[] {
  const hash = createHash('sha256');
  // The ids as one buffer of 32-bit words, fed to the hash a stretch at a time (a call a token was
  // ~5× slower: 12 ms for a 100,000-token prompt).
  const words = ids instanceof Int32Array ? ids : Int32Array.from(ids);
  const bytes = new Uint8Array(words.buffer, words.byteOffset, words.byteLength);
  let fed = 0;
  return counts.map((n) => {
    const upTo = Math.min(n, words.length);
    if (upTo > fed) {
      hash.update(bytes.subarray(fed * 4, upTo * 4));
      fed = upTo;
    }
    return shortDigest(hash.copy());
  });
}

/**
 * The digest of the first `n` ids, as `tokenDigests` makes it at a count of `n`; '' when there are
 * fewer than `n` (no request of fewer tokens begins with `n` of another's).
 */
export function tokenDigestAt(words: Int32Array, n: number): string {
  if (n > words.length) return '';
  const bytes = new Uint8Array(words.buffer, words.byteOffset, n * 4);
  return shortDigest(createHash('sha256').update(bytes));
}

/** A digest as both write it: 16 base64url characters of the SHA-256. */
function shortDigest(hash: Hash): string {
  return hash.digest('base64url').slice(0, 16);
}
