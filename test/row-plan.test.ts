import t from 'tap';
import { allowanceFor, countRows, planRows, RowShapeError, textRows, type RowPlanInput } from '../metering/row-plan.js';
import { ByteEstimateCounter } from '../metering/tokenizers/byte-estimate.js';
import { TiktokenCounter } from '../metering/tokenizers/tiktoken-counter.js';
import { TokenCache } from '../metering/token-cache.js';

const base: RowPlanInput = {
  kind: 'chat',
  rowTokens: [100],
  countMethod: 'tiktoken:o200k_base',
  upperBound: false,
  maxTokens: null,
  n: 1,
  defaultMaxTokens: 4096,
  contextWindow: null,
};

t.test('rows of a prompt / input: string, strings, token ids, token-id arrays', async (t) => {
  t.same(textRows('hi', 'prompt'), [{ kind: 'text', text: 'hi' }]);
  t.same(textRows(['a', 'b'], 'prompt'), [
    { kind: 'text', text: 'a' },
    { kind: 'text', text: 'b' },
  ]);
  t.same(textRows([1, 2, 3], 'input'), [{ kind: 'tokens', length: 3 }]);
  t.same(textRows([[1, 2], [3]], 'input'), [
    { kind: 'tokens', length: 2 },
    { kind: 'tokens', length: 1 },
  ]);
  t.same(textRows([], 'input'), []);
  t.throws(() => textRows(42, 'prompt'), RowShapeError);
  t.throws(() => textRows(['a', { x: 1 }], 'input'), { param: 'input', message: 'input[1] must be a string or an array of token ids' });
});

t.test('countRows: one row per element; token arrays count by length; label stays the counter\'s', async (t) => {
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
  const c = await countRows('completions', 'gpt-4o', { prompt: ['Hello world', [1, 2, 3, 4, 5]] }, counter);
  t.same(c.rowTokens, [2, 5]);
  t.equal(c.countMethod, 'tiktoken:o200k_base');
  t.equal(c.chat, null);
  const e = await countRows('embeddings', 'x', { input: 'abcdefgh' }, new ByteEstimateCounter());
  t.same(e.rowTokens, [2]);
  t.equal(e.countMethod, 'estimate:bytes');
  const long = await countRows('embeddings', 'gpt-4o', { input: ['short', 'z'.repeat(3000)] }, counter);
  t.equal(long.upperBound, true);
  t.equal(long.countMethod, 'tiktoken:o200k_base:upper-bound');
  const chat = await countRows('chat', 'gpt-4o', { messages: [{ role: 'user', content: 'hi' }] }, counter);
  t.equal(chat.rowTokens.length, 1);
  t.equal(chat.chat?.tokens, chat.rowTokens[0]);
  t.equal(chat.chat?.prefix.length, 2);
});

t.test('countRows: a completions suffix is read with every prompt, so every row carries it', async (t) => {
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
  const suffix = '\n\nreturn result\n\n# Tests follow below; the function above must pass them all.';
  const alone = await countRows('completions', 'gpt-4o', { prompt: suffix }, counter);
  const head = await countRows('completions', 'gpt-4o', { prompt: 'def add(a, b):' }, counter);
  const c = await countRows('completions', 'gpt-4o', { prompt: ['def add(a, b):', [1, 2, 3]], suffix }, counter);
  t.same(c.rowTokens, [head.rowTokens[0]! + alone.rowTokens[0]!, 3 + alone.rowTokens[0]!]);
  t.equal(c.countMethod, 'tiktoken:o200k_base');
  const long = await countRows('completions', 'gpt-4o', { prompt: ['a', 'b'], suffix: 'z'.repeat(3000) }, counter);
  t.same(long.rowUpperBound, [true, true], 'a suffix counted at most makes every row an upper bound');
  t.equal(long.countMethod, 'tiktoken:o200k_base:upper-bound');
  const embeddings = await countRows('embeddings', 'gpt-4o', { input: 'a', suffix }, counter);
  t.same(embeddings.rowTokens, [1], 'embeddings have no suffix');
});

t.test('plan totals: rows, sum, longest row and its index', async (t) => {
  const p = planRows({ ...base, kind: 'completions', rowTokens: [5, 40, 7, 40] });
  t.equal(p.rows, 4);
  t.equal(p.sumTokens, 92);
  t.equal(p.longestRow, 40);
  t.equal(p.longestRowIndex, 1, 'the first of equals');
  const empty = planRows({ ...base, kind: 'embeddings', rowTokens: [] });
  t.same([empty.rows, empty.longestRow, empty.sumTokens, empty.allowance], [0, 0, 0, 0]);
});

t.test('allowance: explicit × n (chat), × n × rows (completions), none for embeddings', async (t) => {
  const chat = planRows({ ...base, maxTokens: 50, n: 3 });
  t.same([chat.allowance, chat.perRowAllowance, chat.explicitAllowance], [150, 50, true]);
  const comp = planRows({ ...base, kind: 'completions', rowTokens: [10, 20], maxTokens: 16, n: 2 });
  t.equal(comp.allowance, 16 * 2 * 2);
  const emb = planRows({ ...base, kind: 'embeddings', rowTokens: [10, 20], maxTokens: 16 });
  t.same([emb.allowance, emb.perRowAllowance, emb.explicitAllowance], [0, 0, false]);
});

t.test('a default allowance is clamped to what the window leaves; an explicit one is not', async (t) => {
  const def = planRows({ ...base, rowTokens: [4000], contextWindow: 4096 });
  t.same([def.perRowAllowance, def.allowance, def.explicitAllowance], [96, 96, false]);
  const full = planRows({ ...base, rowTokens: [5000], contextWindow: 4096 });
  t.equal(full.allowance, 0, 'nothing left: 0, never negative');
  const roomy = planRows({ ...base, rowTokens: [10], contextWindow: 128_000 });
  t.equal(roomy.allowance, 4096, 'the default when it fits');
  const unknown = planRows({ ...base, rowTokens: [4000] });
  t.equal(unknown.allowance, 4096, 'no window known: the default');
  const explicit = planRows({ ...base, rowTokens: [4000], contextWindow: 4096, maxTokens: 1000 });
  t.same([explicit.perRowAllowance, explicit.allowance], [1000, 1000]);
  // Completions clamp against the longest row, then multiply by rows.
  const comp = planRows({ ...base, kind: 'completions', rowTokens: [100, 4000], contextWindow: 4096, n: 2 });
  t.equal(comp.allowance, 96 * 2 * 2);
  t.same(allowanceFor({ kind: 'chat', maxTokens: 0, n: 1, defaultMaxTokens: 10, contextWindow: null }, 1, 5), {
    allowance: 0,
    perRow: 0,
    explicit: true,
  });
});
