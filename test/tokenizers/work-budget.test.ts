// The counting work per text is bounded (ADR 0010): a dense run without spaces past the budget is
// counted by its bytes — still an upper bound, the same count every time, and prose untouched.

import t from 'tap';
import { randomBytes } from 'node:crypto';
import { get_encoding } from '@dqbd/tiktoken';
import { countBounded, RUN_WORK_BUDGET } from '../../metering/tokenizers/bounded-encode.js';

const o200k = get_encoding('o200k_base');

t.test('a dense 300 KB run: upper bound, deterministic, bounded by its bytes', async (t) => {
  const blob = randomBytes(225_000).toString('base64'); // 300,000 characters, no whitespace
  const exact = o200k.encode_ordinary(blob).length;
  const first = countBounded('o200k_base', blob);
  const second = countBounded('o200k_base', blob);
  t.equal(first.split, true, 'labelled as an upper bound');
  t.ok(first.tokens >= exact, `upper bound: ${first.tokens} ≥ exact ${exact}`);
  t.ok(first.tokens <= blob.length + 16, 'never more than its bytes plus a little slack');
  t.equal(second.tokens, first.tokens, 'the same text always counts the same');
  // Counted again inside other text (so the process-wide memo is warm): still the same share.
  t.equal(countBounded('o200k_base', `intro ${blob}`).tokens - countBounded('o200k_base', 'intro ').tokens, first.tokens);
});

t.test('a run within the budget is counted piece by piece, far below its bytes', async (t) => {
  const run = 'ab'.repeat(RUN_WORK_BUDGET / 4); // half the budget
  const c = countBounded('o200k_base', run);
  t.ok(c.tokens < run.length / 2, 'pieces were really encoded');
  t.ok(c.tokens >= o200k.encode_ordinary(run).length);
});

t.test('a long repeated run stays cheap and close: its pieces repeat', async (t) => {
  const run = '='.repeat(1_000_000);
  const c = countBounded('o200k_base', run);
  t.ok(c.tokens < run.length / 4, `${c.tokens} tokens for 1 MB of one character`);
});

t.test('prose is exact whatever its size', async (t) => {
  const prose = 'The quick brown fox jumps over the lazy dog. '.repeat(5000);
  t.same(countBounded('o200k_base', prose), { tokens: o200k.encode_ordinary(prose).length, split: false });
});
