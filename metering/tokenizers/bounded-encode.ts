// tiktoken encoders, one per encoding for the life of the process, and a counting function whose
// time stays linear in the input.
//
// Why the split: tiktoken's BPE is quadratic in the length of one pre-token, and a run of one kind
// of character is one pre-token (measured: 40,000 repeated characters ≈ 1.9 s in o200k_base; the
// time quadruples per doubling), and even linear work is slow on dense text. Long runs made of
// short pre-tokens (URLs, minified JSON, base64), up to EXACT_RUN_BUDGET characters, are encoded
// whole and exactly. Other long runs are cut into pieces of at most MAX_PIECE characters, which
// bounds the work per piece, so the whole count is linear. Merges across a cut are lost, so the sum
// is an upper bound on the true count, and the caller labels it so (SPEC §2, §3). The second count,
// made before a bound would decide anything, counts long pre-tokens exactly instead, within a
// budget (long-pretoken.ts, ADR 0019).
import { get_encoding, type Tiktoken, type TiktokenEncoding } from '@dqbd/tiktoken';
import { countOrdinary } from './segment-count.js';
import { countWithLongPreTokens } from './long-pretoken.js';
import { ownString } from '../own-string.js';

/** Longest run (of non-whitespace, or of whitespace) encoded in one piece. */
export const MAX_PIECE = 256;

/**
 * Tokens added per cut. A cut is not a free upper bound: it can shift where BPE's merges fall, so
 * the pieces occasionally tokenize *better* than the whole (`intro xxxx…` loses one token per cut in
 * o200k_base). Fuzzing both encodings over repeated patterns found at most ~0.92 tokens lost per
 * cut; 2 per cut keeps the sum above the exact count with room to spare.
 */
export const SLACK_PER_CUT = 2;

/**
 * Characters of distinct long-run pieces that one count may encode. Past it, the rest
 * of a long run counts as its UTF-8 byte length — a true upper bound, since a byte-level BPE token
 * is at least one byte. Dense runs (base64, random bytes) encode at only ~2 MB/s, so without this
 * a 1 MB blob took ~500 ms; with it, any text costs at most this much tiktoken work beyond its
 * ordinary prose (ADR 0010).
 */
export const RUN_WORK_BUDGET = 8_192;

/**
 * Characters of long runs that one count may still encode exactly, whole, when none of them is
 * pathological (see `longRuns`): URLs, minified JSON, base64 and the like in ordinary amounts
 * keep exact counts. Past it the runs are cut as above — the bound that keeps 1 MB without spaces
 * within the planning target (ADR 0010).
 */
export const EXACT_RUN_BUDGET = 65_536;

/**
 * The same, for a second count made only before refusing a request for its size on an upper bound
 * (server/pipeline/plan.ts): a large minified JSON tool result must not be refused for a bound when
 * its exact count fits. Still linear (such runs are many short pre-tokens), and done in a worker for
 * any large text, so the event loop is not stalled; ~2 MB/s of dense text.
 */
export const EXACT_RECOUNT_BUDGET = 1 << 20;

/**
 * Characters of long pre-tokens (a letter, symbol or whitespace run of more than MAX_PIECE) that
 * the second count encodes exactly per text, with its own merge loop (long-pretoken.ts, ADR 0019):
 * O(n log n), ~0.3–1 µs per byte, so at most a few hundred milliseconds of a worker per text.
 * Past it the text is cut as in the first count, and stays an upper bound.
 */
export const EXACT_PRETOKEN_BUDGET = 256 * 1024;

// A run longer than MAX_PIECE. Ordinary prose never has one, so its counts stay exact.
// Written as lookahead + backreference (an atomic group) rather than `\S{257,}`: V8 backtracks a
// greedy counted quantifier position by position, which made a 1 MB run take ~200 ms and a 4 MB
// run ~700 ms (not linear; measured in bench/RESULTS.md). This form takes < 1 ms per MB.
const LONG_RUN = new RegExp(`(?=(\\S{${MAX_PIECE + 1}}))\\1\\S*|(?=(\\s{${MAX_PIECE + 1}}))\\2\\s*`, 'g');

// What makes one pre-token long. In cl100k_base and o200k_base a pre-token is a run of letters
// (marks included) with at most one leading other character and a contraction after it, at most
// three digits, or a run of characters that are neither letters, digits nor whitespace (with one
// leading space). So a run without whitespace whose letter runs and "other" runs are all short is
// many short pre-tokens, and tiktoken encodes it whole in linear time, exactly.
const LONG_LETTERS = new RegExp(`(?=([\\p{L}\\p{M}]{${MAX_PIECE + 1}}))\\1`, 'u');
const LONG_OTHERS = new RegExp(`(?=([^\\s\\p{L}\\p{N}]{${MAX_PIECE + 1}}))\\1`, 'u');

/** The long runs of `text`, found in one pass, and whether all of them can be encoded whole. */
interface LongRuns {
  runs: Array<{ index: number; text: string }>;
  /**
   * Every long run can be encoded whole, exactly and in linear time: none is whitespace (one
   * pre-token), none holds a long letter or symbol run, and together they stay within
   * EXACT_RUN_BUDGET characters.
   */
  benign: boolean;
}

function longRuns(text: string, exactRunBudget: number): LongRuns {
  const runs: LongRuns['runs'] = [];
  let benign = true;
  let chars = 0;
  LONG_RUN.lastIndex = 0;
  for (let m = LONG_RUN.exec(text); m !== null; m = LONG_RUN.exec(text)) {
    const run = m[0];
    runs.push({ index: m.index, text: run });
    if (!benign) continue;
    chars += run.length;
    // The letter and symbol scans run only while within the budget: their work stays bounded.
    benign = chars <= exactRunBudget && m[2] === undefined && !LONG_LETTERS.test(run) && !LONG_OTHERS.test(run);
  }
  return { runs, benign };
}

// Creating an encoder allocates WASM memory that is only returned by `free()`: keep one per
// encoding and never free it (SPEC §3).
const encoders = new Map<string, Tiktoken>();

export function getEncoder(encoding: TiktokenEncoding): Tiktoken {
  let enc = encoders.get(encoding);
  if (enc === undefined) {
    enc = get_encoding(encoding);
    encoders.set(encoding, enc);
  }
  return enc;
}

/** Loads each encoding now, so that no request pays for it (o200k_base takes ~0.5 s to load). */
export function loadEncoders(encodings: Iterable<TiktokenEncoding>): void {
  for (const e of encodings) getEncoder(e);
}

export interface PieceCount {
  tokens: number;
  /** True when a long run was cut: `tokens` is then an upper bound, not exact. */
  split: boolean;
}

// Pieces of a cut run repeat in pathological input (a megabyte of one character is 4,000 copies of
// the same piece), so remember their counts. Bounded and cleared when full: a cheap memo, not a cache.
const PIECE_MEMO_LIMIT = 4096;
const pieceMemo = new Map<string, Map<string, number>>();

/**
 * Work left for one count: characters of distinct long-run pieces it may still encode. It depends
 * on the text alone (a piece repeated within the text is free; the process-wide memo only saves
 * time), so the same text always gets the same count — admission and the real request agree.
 */
interface Budget {
  chars: number;
  seen: Map<string, number>;
}

function countPiece(enc: Tiktoken, encoding: string, piece: string, budget: Budget): number | null {
  const again = budget.seen.get(piece);
  if (again !== undefined) return again;
  if (budget.chars <= 0) return null;
  budget.chars -= piece.length;
  let memo = pieceMemo.get(encoding);
  if (memo === undefined) {
    memo = new Map();
    pieceMemo.set(encoding, memo);
  }
  const known = memo.get(piece);
  if (known !== undefined) {
    budget.seen.set(piece, known);
    return known;
  }
  const n = enc.encode_ordinary(piece).length;
  budget.seen.set(piece, n);
  if (memo.size >= PIECE_MEMO_LIMIT) memo.clear();
  memo.set(ownString(piece), n);
  return n;
}

/**
 * Token count of `text` as user text (`encode_ordinary`: special-token text such as
 * `<|endoftext|>` is plain text here, never a control token and never an exception).
 */
export function countBounded(
  encoding: TiktokenEncoding,
  text: string,
  exactRunBudget = EXACT_RUN_BUDGET,
  /** Characters of long pre-tokens to count exactly (0 in the first count: they are cut). */
  preTokenBudget = 0,
): PieceCount {
  if (text.length === 0) return { tokens: 0, split: false };
  const enc = getEncoder(encoding);
  if (text.length <= MAX_PIECE) return { tokens: countOrdinary(enc, text), split: false };
  const { runs, benign } = longRuns(text, exactRunBudget);
  if (benign) return { tokens: countOrdinary(enc, text), split: false };
  if (preTokenBudget > 0 && runChars(runs) <= exactRunBudget) {
    const exact = countWithLongPreTokens(enc, encoding, text, MAX_PIECE, preTokenBudget);
    if (exact !== null) return { tokens: exact, split: false };
  }

  let tokens = 0;
  let last = 0;
  const budget: Budget = { chars: RUN_WORK_BUDGET, seen: new Map() };
  for (const run of runs) {
    if (run.index > last) tokens += countOrdinary(enc, text.slice(last, run.index));
    tokens += countRun(enc, encoding, run.text, budget);
    last = run.index + run.text.length;
  }
  if (last < text.length) tokens += countOrdinary(enc, last === 0 ? text : text.slice(last));
  return { tokens, split: true };
}

function runChars(runs: LongRuns['runs']): number {
  let chars = 0;
  for (const run of runs) chars += run.text.length;
  return chars;
}

function countRun(enc: Tiktoken, encoding: string, run: string, budget: Budget): number {
  let tokens = 0;
  let pieces = 0;
  for (let start = 0; start < run.length; ) {
    let end = Math.min(start + MAX_PIECE, run.length);
    // Never cut a surrogate pair in half: that would turn one character into two replacement ones.
    if (end < run.length && isHighSurrogate(run.charCodeAt(end - 1))) end--;
    const n = countPiece(enc, encoding, run.slice(start, end), budget);
    if (n === null) {
      // Out of work budget: the rest of the run counts as its bytes (an upper bound).
      tokens += Buffer.byteLength(start === 0 ? run : run.slice(start), 'utf8');
      pieces++;
      break;
    }
    tokens += n;
    pieces++;
    start = end;
  }
  // Cuts: between pieces, plus one on each side of the run (the text around it is encoded apart).
  return tokens + SLACK_PER_CUT * (pieces + 1);
}

function isHighSurrogate(code: number): boolean {
  return code >= 0xd800 && code <= 0xdbff;
}
