// The exact second count of long pre-tokens (metering/tokenizers/long-pretoken.ts, ADR 0019): the
// encodings' patterns written out for JavaScript and tiktoken's merge loop with a heap must give
// exactly `encode_ordinary`'s count, and the second count must be exact where the first one cut.

import t from 'tap';
import { get_encoding, type TiktokenEncoding } from '@dqbd/tiktoken';
import { countPreToken, countWithLongPreTokens } from '../../metering/tokenizers/long-pretoken.js';
import { countBounded, EXACT_PRETOKEN_BUDGET, EXACT_RECOUNT_BUDGET, MAX_PIECE } from '../../metering/tokenizers/bounded-encode.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { TokenCache } from '../../metering/token-cache.js';
import { rng } from './worker-texts.js';

const encodings: TiktokenEncoding[] = ['o200k_base', 'cl100k_base'];
const encoders = new Map(encodings.map((e) => [e, get_encoding(e)]));
const exact = (e: TiktokenEncoding, text: string) => encoders.get(e)!.encode_ordinary(text).length;

// Every class the two patterns tell apart: upper, lower, title-case, modifier and other letters,
// marks, digits, symbols, `/`, apostrophes with each contraction (and `ſ`, which folds to `s`),
// `\r`, `\n`, spaces, other Unicode white space, U+FEFF (not white space), emoji.
const CLASSES = [
  'ABCXYZÀÉ',
  'abcxyzàé',
  'ǅǈ',
  'ʰˆ',
  '中文日本',
  '\u0301\u0308',
  '0123456789٣',
  '!?.,;:=-+*#@"(){}[]<>_|~^`$%&',
  '/',
  "'",
  'sStTdDmMlLrReEvVſ',
  '\r',
  '\n',
  ' ',
  '\t\u00a0\u0085\u2028\u3000\u200a',
  '\ufeff',
  '😀👍🏽',
];

function mixture(r: () => number, length: number): string {
  // A few classes per text, so that long runs of one kind happen as often as short ones.
  const classes = Array.from({ length: 1 + Math.floor(r() * 4) }, () => [...CLASSES[Math.floor(r() * CLASSES.length)]!]);
  let s = '';
  while (s.length < length) {
    const chars = classes[Math.floor(r() * classes.length)]!;
    const run = 1 + Math.floor(r() * (r() < 0.2 ? 40 : 4));
    for (let i = 0; i < run; i++) s += chars[Math.floor(r() * chars.length)];
  }
  return s;
}

t.test('every pre-token through the merge loop: the same count as encode_ordinary', async (t) => {
  for (const e of encodings) {
    const enc = encoders.get(e)!;
    const r = rng(e === 'o200k_base' ? 18 : 81);
    let differ = 0;
    for (let i = 0; i < 1500; i++) {
      const text = mixture(r, 1 + Math.floor(r() * 300));
      // longChars 0: no pre-token is left to tiktoken, so the pattern's cuts are all tested too.
      const got = countWithLongPreTokens(enc, e, text, 0, Infinity);
      const want = exact(e, text);
      if (got !== want && differ++ < 5) t.fail(`${e}: ${JSON.stringify(text)} counts ${got}, encode_ordinary ${want}`);
    }
    t.equal(differ, 0, `${e}: 1,500 random mixtures, every count identical`);
  }
});

t.test('long pre-tokens of the kinds that made upper bounds: exact', async (t) => {
  const r = rng(7);
  const acgt = Array.from({ length: 6000 }, () => 'ACGT'[Math.floor(r() * 4)]).join('');
  for (const e of encodings) {
    const enc = encoders.get(e)!;
    for (const [name, text] of [
      ['300 × a', 'a'.repeat(300)],
      ['2,000 × =', '='.repeat(2000)],
      ['6,000 random A/C/G/T', acgt],
      ['spaces then a word', `${' '.repeat(700)}word`],
      ['a pre-token that is one token', 'hello'],
      ['multi-byte run', 'é'.repeat(400)],
    ] as const) {
      t.equal(countWithLongPreTokens(enc, e, `intro ${text} outro`, MAX_PIECE, Infinity), exact(e, `intro ${text} outro`), `${e}: ${name}`);
    }
    t.equal(countPreToken(enc, ''), 0);
    t.equal(countPreToken(enc, 'x'), 1);
  }
});

t.test('the second count is exact where the first cut; past its budget it cuts too', async (t) => {
  const e = 'o200k_base';
  for (const text of ['a'.repeat(300), '='.repeat(2000), `see ${'x'.repeat(5000)}!`]) {
    const first = countBounded(e, text);
    t.equal(first.split, true, 'the first count cuts it: an upper bound');
    t.ok(first.tokens > exact(e, text));
    t.same(countBounded(e, text, EXACT_RECOUNT_BUDGET, EXACT_PRETOKEN_BUDGET), { tokens: exact(e, text), split: false }, 'the second is exact');
  }
  // Over the budget of long pre-tokens per text: cut, as the first count, an upper bound.
  const huge = 'x'.repeat(EXACT_PRETOKEN_BUDGET + 1);
  t.equal(countBounded(e, huge, EXACT_RECOUNT_BUDGET, EXACT_PRETOKEN_BUDGET).split, true);
  t.equal(countWithLongPreTokens(encoders.get(e)!, e, huge, MAX_PIECE, EXACT_PRETOKEN_BUDGET), null);
});

t.test('TiktokenCounter.exactly(): exact labels, and an upper bound in the cache is counted again', async (t) => {
  const cache = new TokenCache();
  const counter = new TiktokenCounter('o200k_base', { cache });
  const text = '='.repeat(2000);
  const first = await counter.countText(text);
  t.equal(first.method, 'tiktoken:o200k_base:upper-bound');
  const second = await counter.exactly().countText(text);
  t.same(second, { tokens: exact('o200k_base', text), method: 'tiktoken:o200k_base', upperBound: false });
  t.same(await counter.countText(text), second, 'the exact count is cached for the next turn');
});
