// Regression: rows were refused on an upper bound when their real count was within the limit.
// A run without spaces that is one long pre-token (60,000 random A/C/G/T characters, 300 × `a`,
// 2,000 × `=`) is cut by the first count, which gives an upper bound; the exact second count
// before a refusal cut it the same way, so the bound decided. Now the second count counts such
// pre-tokens exactly (ADR 0019) before a size refusal, and /v1/admission agrees. Only past its
// budget does a bound still refuse, and the message says so.

import t from 'tap';
import { get_encoding } from '@dqbd/tiktoken';
import { plannedGateway } from '../helpers/planned-gateway.js';
import { rng } from '../tokenizers/worker-texts.js';

const o200k = get_encoding('o200k_base');
const tokens = (s: string) => o200k.encode_ordinary(s).length;

const setup = plannedGateway;

const a300 = 'a'.repeat(300);
const eq2000 = '='.repeat(2000);

t.test('default limits: 60,000 random A/C/G/T characters (a bound of 56,105) are admitted on their exact count', async (t) => {
  // 1. Default limits (36,864 per row): the A/C/G/T row's bound was 56,105, its count ~31,100.
  const r = rng(2026);
  const acgt = Array.from({ length: 60_000 }, () => 'ACGT'[Math.floor(r() * 4)]).join('');
  const count = tokens(acgt);
  t.ok(count < 36_864, `exact ${count} is within the limit`);
  const { upstream, post, plan } = await setup(t, {});
  const request = { model: 'gpt-4o-mini', prompt: acgt, max_tokens: 1 };
  const planned = await plan('/v1/completions', request);
  t.match(planned, { row_tokens: [count], count_method: 'tiktoken:o200k_base', count_is_upper_bound: false, verdict: { admit: true } });
  const real = await post('/v1/completions', request);
  t.equal(real.status, 200);
  t.equal(real.headers.get('x-tollgate-count-method'), 'tiktoken:o200k_base');
  t.equal(Number(real.headers.get('x-tollgate-reserved-tokens')), count + 1, 'the exact prompt is reserved, not the bound');
  t.equal(upstream.requests.length, 1);
});

t.test('maxRowTokens 40: rows within it go, a row over it is refused with its exact figure, a bound only past the budget', async (t) => {
  const { upstream, post, plan } = await setup(t, { limits: { maxRowTokens: 40 } });
  // 1. 300 × a is 38 tokens (bound 44), 2,000 × = is 31 (bound 49): both go.
  t.same([tokens(a300), tokens(eq2000)], [38, 31]);
  for (const [endpoint, request, count] of [
    ['/v1/completions', { model: 'gpt-4o-mini', prompt: a300, max_tokens: 1 }, 38],
    ['/v1/embeddings', { model: 'gpt-4o-mini', input: eq2000 }, 31],
  ] as const) {
    const planned = await plan(endpoint, request);
    t.match(planned, { row_tokens: [count], count_method: 'tiktoken:o200k_base', verdict: { admit: true } }, `${endpoint}: admission admits`);
    const real = await post(endpoint, request);
    t.equal(real.status, 200, `${endpoint}: the request goes`);
  }
  t.equal(upstream.requests.length, 2);

  // 2. 400 × a is really over the limit: refused with the exact figure and label.
  const a400 = 'a'.repeat(400);
  const over = { model: 'gpt-4o-mini', prompt: ['short', a400], max_tokens: 1 };
  const refused = await post('/v1/completions', over);
  t.equal(refused.status, 413);
  t.match(refused.body.error, {
    code: 'row_too_large',
    message: `too many tokens: one row has ${tokens(a400)} tokens, the limit is 40 per row`,
    row_index: 1,
    row_tokens: tokens(a400),
    count_method: 'tiktoken:o200k_base',
  });
  t.same((await plan('/v1/completions', over)).verdict.error, refused.body, 'admission gives the same envelope');

  // 3. One pre-token of 300,000 characters, more than the second count encodes per text: the
  // bound refuses, and the message and the label say it is one.
  const huge = { model: 'gpt-4o-mini', prompt: 'x'.repeat(300_000), max_tokens: 1 };
  const bound = await post('/v1/completions', huge);
  t.equal(bound.status, 413);
  t.equal(bound.body.error.code, 'row_too_large');
  t.match(bound.body.error.message, /^too many tokens: one row has up to \d+ tokens, the limit is 40 per row \(an upper bound: text without spaces too long to count exactly\)$/);
  t.equal(bound.body.error.count_method, 'tiktoken:o200k_base:upper-bound');
  t.same((await plan('/v1/completions', huge)).verdict.error, bound.body);
  t.equal(upstream.requests.length, 2, 'nothing refused reached the upstream');
});

t.test('request_tokens_exceeded and context_window_exceeded decide on the exact count too', async (t) => {
  const { upstream, post, plan } = await setup(t, { limits: { maxRequestTokens: 100 } }, { contextWindow: 64 });
  // 1. Three rows of 31 tokens (bounds of 49): 93 fit a limit of 100, where 147 did not; four
  // rows are 124, refused with the exact sum.
  const three = { model: 'gpt-4o-mini', input: [eq2000, eq2000, eq2000] };
  t.match(await plan('/v1/embeddings', three), { sum_tokens: 93, verdict: { admit: true } });
  t.equal((await post('/v1/embeddings', three)).status, 200);
  const four = await post('/v1/embeddings', { ...three, input: [eq2000, eq2000, eq2000, eq2000] });
  t.equal(four.status, 413);
  t.equal(four.body.error.message, 'too many tokens: the rows add up to 124 tokens, the limit is 100');
  t.equal(four.body.error.count_method, 'tiktoken:o200k_base');
  // 2. A window of 64: 31 + 30 fit, where 49 + 30 did not; 31 + 40 does not, said with exact figures.
  const fits = { model: 'gpt-4o-mini', prompt: eq2000, max_tokens: 30 };
  t.match(await plan('/v1/completions', fits), { row_tokens: [31], verdict: { admit: true } });
  t.equal((await post('/v1/completions', fits)).status, 200);
  const over = await post('/v1/completions', { ...fits, max_tokens: 40 });
  t.equal(over.status, 413);
  t.equal(over.body.error.message, "request too large: the prompt needs 31 tokens and max_tokens asks for 40 more, more than the model's context window of 64 tokens");
  t.equal(over.body.error.count_method, 'tiktoken:o200k_base');
  t.equal(upstream.requests.length, 2);
});

t.test('an exact count that fails leaves the first count standing, not the byte estimate', async (t) => {
  const { gw, post } = await setup(t, { limits: { maxRowTokens: 40 } });
  // The exact count runs in the worker pool: with the pool closed it fails.
  await gw.app.gateway.counters.close();
  const res = await post('/v1/completions', { model: 'gpt-4o-mini', prompt: a300, max_tokens: 1 });
  t.equal(res.status, 413);
  t.equal(res.body.error.row_tokens, 44, 'the first count, 44, not 300 bytes ÷ 4');
  t.equal(res.body.error.count_method, 'tiktoken:o200k_base:upper-bound');
});
