// Images are counted at the most their model can bill for them (ADR 0022), an upper bound: the
// size checks (413) take them at the least they can cost instead, so a bound never refuses a
// request for its size; budgets take the bound, and say why it is one.

import t, { type Test } from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

type Json = Record<string, unknown>;
type Envelope = { error: Json };

const image = (detail?: string) => ({ type: 'image_url', image_url: { url: 'https://example.com/page.png', ...(detail ? { detail } : {}) } });
const ask = (images: Json[], extra: Json = {}) => ({
  model: 'gpt-4o',
  messages: [{ role: 'user', content: [{ type: 'text', text: 'Describe the pages.' }, ...images] }],
  ...extra,
});

async function setup(t: Test, raw: Json, upstreamExtra: Json = {}) {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, upstreamExtra)], ...raw });
  const post = async (path: string, body: unknown, headers: Record<string, string> = {}) => {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
    return { status: res.status, body: (await res.json()) as Envelope & Json };
  };
  const plan = async (request: Json, headers: Record<string, string> = {}) =>
    (await post('/v1/admission', { endpoint: '/v1/chat/completions', request }, headers)).body;
  // The text alone, as the gateway counts it: what the images are added to.
  const textTokens = (await plan(ask([]))).sum_tokens as number;
  return { upstream, post, plan, textTokens };
}

t.test('row_too_large: refused only when even the least the images can cost is too much', async (t) => {
  const { upstream, post, plan, textTokens } = await setup(t, { limits: { maxRowTokens: 2000 } });
  // 1. Three images: counted at 3 × 1,445 (over 2,000), at least 3 × 85 (auto may pick low): admitted.
  const three = await plan(ask([image(), image(), image()]));
  t.equal(three.sum_tokens, textTokens + 3 * 1445);
  t.equal(three.count_method, 'tiktoken:o200k_base:upper-bound');
  t.same(three.verdict, { admit: true, status: 200, error: null });
  t.equal((await post('/v1/chat/completions', ask([image(), image(), image()]))).status, 200);
  t.equal(upstream.requests.length, 1);
  // 2. Eight high-detail images are at least 8 × (85 + 170) = 2,040 tokens: over 2,000 whatever
  // their size, refused — the figure says it is a lower bound, and why.
  const eight = ask(Array.from({ length: 8 }, () => image('high')));
  const real = await post('/v1/chat/completions', eight);
  t.equal(real.status, 413);
  const least = textTokens + 8 * 255;
  t.same(real.body.error, {
    message: `too many tokens: one row has at least ${least} tokens, the limit is 2000 per row (a lower bound: images counted at the least they can cost)`,
    type: 'invalid_request_error',
    param: null,
    code: 'row_too_large',
    row_index: 0,
    row_tokens: least,
    limit: 2000,
    count_method: 'tiktoken:o200k_base:lower-bound',
  });
  t.same((await plan(eight)).verdict, { admit: false, status: 413, error: real.body }, '/v1/admission gives the same envelope');
  t.equal(upstream.requests.length, 1, 'the refused request reached nobody');
});

t.test('context_window_exceeded: the window is checked, and a default allowance clamped, on the least', async (t) => {
  const { upstream, post, plan, textTokens } = await setup(t, {}, { contextWindow: 1000 });
  // 1. Three auto images can be 4,335 tokens, more than the window, or 255: the default allowance is
  // what the window leaves after the least, and the request goes.
  const p = await plan(ask([image(), image(), image()]));
  t.same(p.verdict, { admit: true, status: 200, error: null });
  t.equal((p.charge as Json).allowance, 1000 - (textTokens + 3 * 85));
  // max_affordable_allowance says the same: the largest it names is admitted, one more is not.
  const most = p.max_affordable_allowance as number;
  t.equal(most, 1000 - (textTokens + 3 * 85));
  t.match((await plan(ask([image(), image(), image()], { max_tokens: most }))).verdict, { admit: true });
  t.match((await plan(ask([image(), image(), image()], { max_tokens: most + 1 }))).verdict, { admit: false, status: 413 });
  t.equal((await post('/v1/chat/completions', ask([image(), image(), image()]))).status, 200);
  t.equal(upstream.requests[0]!.body!.max_tokens ?? upstream.requests[0]!.body!.max_completion_tokens, 1000 - (textTokens + 3 * 85));
  // 2. An explicit max_tokens that does not fit even beside the least is refused.
  const r = await post('/v1/chat/completions', ask([image(), image(), image()], { max_tokens: 900 }));
  t.equal(r.status, 413);
  t.equal(r.body.error.code, 'context_window_exceeded');
  t.equal(
    r.body.error.message,
    `request too large: the prompt needs at least ${textTokens + 255} tokens and max_tokens asks for 900 more, more than the model's context window of 1000 tokens (a lower bound: images counted at the least they can cost)`,
  );
  t.equal(r.body.error.count_method, 'tiktoken:o200k_base:lower-bound');
});

t.test('the run token budget takes the bound, and its refusal says the images made it one', async (t) => {
  const { upstream, post, textTokens } = await setup(t, { runs: { tokenBudget: 3000 } });
  const r = await post('/v1/chat/completions', ask([image('high'), image('high'), image('high')], { max_tokens: 10 }));
  t.equal(r.status, 402);
  t.equal(r.body.error.code, 'token_budget_exhausted');
  const prompt = textTokens + 3 * 1445;
  t.equal(
    r.body.error.message,
    `run token budget: this request needs up to ${prompt + 10} tokens (prompt up to ${prompt} + max output 10), more than the run's whole budget of 3000 tokens (the prompt is an upper bound: images counted at the most they can cost)`,
  );
  t.equal(r.body.error.count_method, 'tiktoken:o200k_base:upper-bound');
  t.equal(upstream.requests.length, 0);
});
