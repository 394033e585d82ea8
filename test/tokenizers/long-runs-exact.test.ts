// Long runs without whitespace that are made of short pre-tokens — URLs, minified JSON, base64 —
// are counted exactly, whole (metering/tokenizers/bounded-encode.ts, ADR 0010). Only runs that
// would be one long pre-token (a run of letters, of symbols, of whitespace), or more long-run text
// than the exact budget, are cut and labelled as an upper bound.

import t from 'tap';
import { randomBytes } from 'node:crypto';
import { get_encoding, type TiktokenEncoding } from '@dqbd/tiktoken';
import { countBounded, EXACT_RUN_BUDGET, MAX_PIECE } from '../../metering/tokenizers/bounded-encode.js';

const encodings: TiktokenEncoding[] = ['o200k_base', 'cl100k_base'];
const encoders = new Map(encodings.map((e) => [e, get_encoding(e)]));
const exact = (e: TiktokenEncoding, text: string) => encoders.get(e)!.encode_ordinary(text).length;

const url = `https://example.com/${Array.from({ length: 40 }, (_, i) => `segment${i}/item-${i * 7}?q=abc&x=${i}`).join('/')}`;
const minified = JSON.stringify(Array.from({ length: 150 }, (_, i) => ({ id: i, title: `Item_${i}`, tags: ['alpha', 'beta'], url: `https://x.io/${i}` })));
const base64 = randomBytes(6000).toString('base64');
const accented = 'naïve-café_'.repeat(60); // letters with combining-free accents and symbols, no spaces
const camel = 'parseJsonResponseBodyFromUpstreamServer'.repeat(8); // a long letter run of mixed case

t.test('URLs, minified JSON, base64 and mixed runs count exactly, labelled exact', async (t) => {
  for (const e of encodings) {
    for (const [name, run] of [['url', url], ['minified JSON', minified], ['base64', base64], ['accented', accented]] as const) {
      t.ok(run.length > MAX_PIECE && !/\s/.test(run), `${name} is one long run`);
      const text = `Here is the tool result: ${run} — end of result.`;
      t.same(countBounded(e, text), { tokens: exact(e, text), split: false }, `${e}: ${name}`);
    }
  }
});

t.test('a run that would be one long pre-token is still cut, an upper bound', async (t) => {
  for (const e of encodings) {
    for (const [name, run] of [['letters', 'x'.repeat(1963)], ['camel-case letters', camel], ['symbols', '=-'.repeat(400)], ['whitespace', ' '.repeat(600)]] as const) {
      const text = `intro ${run} outro`;
      const c = countBounded(e, text);
      t.equal(c.split, true, `${e}: ${name} labelled as an upper bound`);
      t.ok(c.tokens >= exact(e, text), `${e}: ${name} ${c.tokens} ≥ ${exact(e, text)}`);
    }
  }
});

t.test('past the exact budget, long runs are cut again (the 1 MB bound holds)', async (t) => {
  const runs = Array.from({ length: Math.ceil(EXACT_RUN_BUDGET / 4000) + 1 }, () => randomBytes(3000).toString('base64'));
  const text = runs.join(' ');
  t.ok(runs.reduce((a, r) => a + r.length, 0) > EXACT_RUN_BUDGET);
  const c = countBounded('o200k_base', text);
  t.equal(c.split, true);
  t.ok(c.tokens >= exact('o200k_base', text));
  // Within the budget the same runs are exact.
  const few = runs.slice(0, 3).join(' ');
  t.same(countBounded('o200k_base', few), { tokens: exact('o200k_base', few), split: false });
});
