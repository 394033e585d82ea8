// Exact counts of texts whose pre-tokens are too long for tiktoken's own BPE (ADR 0019).
//
// tiktoken cuts text into pre-tokens with its pattern, then merges each pre-token's bytes: always
// the adjacent pair whose concatenation has the lowest rank, the leftmost on a tie. Its merge loop
// scans the whole pre-token for every merge, so one pre-token of n bytes costs O(n²) (60,000
// random A/C/G/T characters: ~1.7 s). The same merges, in the same order, found with a heap cost
// O(n log n) (~20–60 ms for those 60,000). So a long pre-token is counted here, with the encoding's
// own ranks, and everything between long pre-tokens by tiktoken as before: the sum is exact.
//
// This needs the pre-tokens themselves, so the encodings' patterns are written out below for
// JavaScript: `(?i:…)` spelled out (Node 20 has no inline flags; Rust's case folding adds `ſ` to
// `s`), and `\s` as Unicode White_Space, which is what the Rust pattern means (JavaScript's `\s`
// also matches U+FEFF and misses U+0085). Test: `test/tokenizers/long-pretoken.test.ts` compares
// against `encode_ordinary` on random mixtures of every character class the patterns tell apart.
import type { Tiktoken, TiktokenEncoding } from '@dqbd/tiktoken';
import { countOrdinary } from './segment-count.js';

const WS = '\\t-\\r \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000';
const CONTRACTION = "'[sS\\u017f]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD]";

const PATTERNS: Partial<Record<TiktokenEncoding, RegExp>> = {
  o200k_base: new RegExp(
    [
      `[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]*[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]+(?:${CONTRACTION})?`,
      `[^\\r\\n\\p{L}\\p{N}]?[\\p{Lu}\\p{Lt}\\p{Lm}\\p{Lo}\\p{M}]+[\\p{Ll}\\p{Lm}\\p{Lo}\\p{M}]*(?:${CONTRACTION})?`,
      `\\p{N}{1,3}`,
      ` ?[^${WS}\\p{L}\\p{N}]+[\\r\\n/]*`,
      `[${WS}]*[\\r\\n]+`,
      `[${WS}]+(?![^${WS}])`,
      `[${WS}]+`,
    ].join('|'),
    'gu',
  ),
  cl100k_base: new RegExp(
    [
      `(?:${CONTRACTION})`,
      `[^\\r\\n\\p{L}\\p{N}]?\\p{L}+`,
      `\\p{N}{1,3}`,
      ` ?[^${WS}\\p{L}\\p{N}]+[\\r\\n]*`,
      `[${WS}]*[\\r\\n]+`,
      `[${WS}]+(?![^${WS}])`,
      `[${WS}]+`,
    ].join('|'),
    'gu',
  ),
};

/** An encoding's ranks, and a memo of which two tokens join into a third. */
interface RankTable {
  /** Rank by token bytes (one latin1 character per byte). */
  ranks: Map<string, number>;
  /** Rank of each single byte (every byte is a token in the encodings served). */
  byteRank: Int32Array;
  joins: JoinMemo;
}

// Read once per thread from the encoder itself (~0.4 s and ~20 MB for o200k_base, half that for
// cl100k_base), only when a long pre-token is first counted: in a gateway, in a counting worker.
const tables = new Map<Tiktoken, RankTable>();

function tableOf(enc: Tiktoken): RankTable {
  let table = tables.get(enc);
  if (table !== undefined) return table;
  const ranks = new Map<string, number>();
  // Ranks are dense from 0; the first missing one ends the table (special tokens sit past a gap
  // and are never merged into ordinary text).
  for (let rank = 0; ; rank++) {
    let bytes: Uint8Array;
    try {
      bytes = enc.decode_single_token_bytes(rank);
    } catch {
      break;
    }
    ranks.set(Buffer.from(bytes.buffer, bytes.byteOffset, bytes.length).toString('latin1'), rank);
  }
  const byteRank = new Int32Array(256);
  for (let b = 0; b < 256; b++) byteRank[b] = ranks.get(String.fromCharCode(b)) ?? -1;
  if (byteRank.includes(-1)) throw new Error('an encoding without every single byte as a token');
  table = { ranks, byteRank, joins: new JoinMemo() };
  tables.set(enc, table);
  return table;
}

/**
 * Which token two tokens make together (-1: none), by their ranks: an open-addressing table in
 * typed arrays (3 MB), cleared when half full. A string slice and a Map look-up per pair cost
 * more, and a long pre-token repeats the same few pairs.
 */
class JoinMemo {
  private static readonly BITS = 18;
  private readonly a = new Int32Array(1 << JoinMemo.BITS);
  private readonly b = new Int32Array(1 << JoinMemo.BITS);
  private readonly r = new Int32Array(1 << JoinMemo.BITS);
  private used = 0;

  constructor() {
    this.a.fill(-1);
  }

  get(a: number, b: number, ranks: Map<string, number>, s: string, from: number, to: number): number {
    const mask = (1 << JoinMemo.BITS) - 1;
    let h = (Math.imul(a, 0x9e3779b1) ^ Math.imul(b, 0x85ebca77)) >>> (32 - JoinMemo.BITS);
    for (;;) {
      const k = this.a[h]!;
      if (k === -1) break;
      if (k === a && this.b[h] === b) return this.r[h]!;
      h = (h + 1) & mask;
    }
    const r = ranks.get(s.slice(from, to)) ?? -1;
    if (this.used >= 1 << (JoinMemo.BITS - 1)) {
      this.a.fill(-1);
      this.used = 0;
      return r;
    }
    this.a[h] = a;
    this.b[h] = b;
    this.r[h] = r;
    this.used++;
    return r;
  }
}

/** Positions per rank in a heap key: a pre-token counted here has fewer bytes than this. */
const POSITIONS = 2 ** 24;

/**
 * Tokens of one pre-token, exactly as tiktoken's `byte_pair_encode` makes them: a pre-token that is
 * a token is one; otherwise its bytes are merged, lowest rank first, leftmost first on a tie.
 */
export function countPreToken(enc: Tiktoken, piece: string): number {
  const { ranks, byteRank, joins } = tableOf(enc);
  const s = Buffer.from(piece, 'utf8').toString('latin1');
  const n = s.length;
  if (n <= 1 || ranks.has(s)) return n === 0 ? 0 : 1;
  if (n >= POSITIONS) throw new RangeError(`a pre-token of ${n} bytes: at most ${POSITIONS - 1} are counted here`);
  // Parts are identified by the byte they start at; `next[i]` is where the following part starts
  // (n: none). Every part is a token (`token[i]`, its rank): bytes are, and so is every merge.
  // `pair[i]` is the rank of part i joined with the next one (-1: not a token).
  const next = new Int32Array(n);
  const prev = new Int32Array(n);
  const token = new Int32Array(n);
  const pair = new Int32Array(n);
  const heap = new PairHeap(3 * n);
  for (let i = 0; i < n; i++) {
    next[i] = i + 1;
    prev[i] = i - 1;
    token[i] = byteRank[s.charCodeAt(i)]!;
  }
  const update = (i: number): void => {
    const j = next[i]!;
    const r = j >= n ? -1 : joins.get(token[i]!, token[j]!, ranks, s, i, next[j]!);
    pair[i] = r;
    if (r >= 0) heap.push(r, i);
  };
  for (let i = 0; i < n - 1; i++) {
    const r = joins.get(token[i]!, token[i + 1]!, ranks, s, i, i + 2);
    pair[i] = r;
    if (r >= 0) heap.add(r, i);
  }
  pair[n - 1] = -1;
  heap.heapify();
  let parts = n;
  while (heap.size > 0) {
    const top = heap.pop();
    const r = Math.floor(top / POSITIONS);
    const i = top - r * POSITIONS;
    if (pair[i] !== r) continue; // stale: the part was merged away, or its pair changed
    const j = next[i]!;
    next[i] = next[j]!;
    if (next[j]! < n) prev[next[j]!] = i;
    pair[j] = -1;
    token[i] = r;
    parts--;
    update(i);
    if (prev[i]! >= 0) update(prev[i]!);
  }
  return parts;
}

/**
 * Exact `encode_ordinary(text).length`: pre-tokens longer than `longChars` characters counted with
 * `countPreToken`, the text between them by tiktoken. Null when the long pre-tokens come to more
 * than `budgetChars` characters, or the encoding's pattern is not known here.
 */
export function countWithLongPreTokens(
  enc: Tiktoken,
  encoding: TiktokenEncoding,
  text: string,
  longChars: number,
  budgetChars: number,
): number | null {
  const pattern = PATTERNS[encoding];
  if (pattern === undefined) return null;
  const long: Array<[number, number]> = [];
  let chars = 0;
  pattern.lastIndex = 0;
  for (let m = pattern.exec(text); m !== null; m = pattern.exec(text)) {
    const len = m[0].length;
    if (len <= longChars) continue;
    chars += len;
    if (chars > budgetChars) return null;
    long.push([m.index, m.index + len]);
  }
  let tokens = 0;
  let last = 0;
  for (const [start, end] of long) {
    if (start > last) tokens += countOrdinary(enc, text.slice(last, start));
    tokens += countPreToken(enc, text.slice(start, end));
    last = end;
  }
  if (last < text.length) tokens += countOrdinary(enc, last === 0 ? text : text.slice(last));
  return tokens;
}

/**
 * A binary min-heap of (rank, position) pairs, by rank then position: the leftmost of equal
 * ranks (the same bytes) merges first, as in tiktoken. Each pair is one number, rank × 2^24 +
 * position (ranks < 2^24, positions < 2^24: pre-tokens are far shorter), in one typed array.
 * At most 3 entries per byte are ever pushed (one per starting pair, two per merge).
 */
class PairHeap {
  private readonly keys: Float64Array;
  size = 0;

  constructor(capacity: number) {
    this.keys = new Float64Array(Math.max(1, capacity));
  }

  /** Adds an entry without keeping the heap order: call `heapify` before the first `pop`. */
  add(r: number, p: number): void {
    this.keys[this.size++] = r * POSITIONS + p;
  }

  heapify(): void {
    for (let i = (this.size >> 1) - 1; i >= 0; i--) this.down(i, this.keys[i]!);
  }

  push(r: number, p: number): void {
    const keys = this.keys;
    const key = r * POSITIONS + p;
    let i = this.size++;
    while (i > 0) {
      const up = (i - 1) >> 1;
      const k = keys[up]!;
      if (k < key) break;
      keys[i] = k;
      i = up;
    }
    keys[i] = key;
  }

  /** Removes the top entry; returns it as rank × POSITIONS + position. */
  pop(): number {
    const top = this.keys[0]!;
    const last = this.keys[--this.size]!;
    if (this.size > 0) this.down(0, last);
    return top;
  }

  private down(at: number, key: number): void {
    const keys = this.keys;
    const n = this.size;
    let i = at;
    for (;;) {
      let c = 2 * i + 1;
      if (c >= n) break;
      if (c + 1 < n && keys[c + 1]! < keys[c]!) c++;
      if (keys[c]! >= key) break;
      keys[i] = keys[c]!;
      i = c;
    }
    keys[i] = key;
  }
}
