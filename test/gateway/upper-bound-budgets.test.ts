// Regression: budgets decided on an upper bound. A prompt holding a run without spaces that is one
// long pre-token (2,000 × `=`: 31 tokens, a bound of 49) was refused by the run token budget or the
// monthly budget, or sent as the run's final answer, on the bound alone. A budget decision that
// rests on a bound is now taken again on the exact count (ADR 0019), and /v1/admission agrees;
// past the second count's budget the bound still refuses, and the message says it is one.

import t from 'tap';
import { get_encoding } from '@dqbd/tiktoken';
import { plannedGateway } from '../helpers/planned-gateway.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { openaiUpstream, startGateway } from '../helpers/gateway.js';
import { ADMIN, ALICE, call, moneyWorld } from '../money-e2e/money-fixture.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { TokenCache } from '../../metering/token-cache.js';
import type { ToolDefinition } from '../../metering/types.js';

const o200k = get_encoding('o200k_base');
const tokens = (s: string) => o200k.encode_ordinary(s).length;

const setup = plannedGateway;

const eq2000 = '='.repeat(2000);

/**
 * The exact count of a chat whose messages may hold `eq2000`: counted the ordinary way with a
 * one-token text in its place, then with its real count (31) instead.
 */
function exactChat(messages: Array<{ role: string; content: string }>, tools?: ToolDefinition[]): number {
  const swapped = messages.map((m) => (m.content === eq2000 ? { ...m, content: 'x' } : m));
  const held = messages.filter((m) => m.content === eq2000).length;
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
  const c = counter.countChatSync({ model: 'gpt-4o', messages: swapped, ...(tools ? { tools } : {}) });
  return c.tokens + held * (tokens(eq2000) - tokens('x'));
}

t.test('the run token budget: a prompt of 38 tokens (a bound of 56) and 8 of output fit 50', async (t) => {
  const { upstream, post, plan } = await setup(t, { runs: { tokenBudget: 50 } });
  // 3 per message + "user" (1) + 31 + 3 to prime the reply.
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: eq2000 }], max_tokens: 8 };
  t.match(await plan('/v1/chat/completions', request), { sum_tokens: 38, count_method: 'tiktoken:o200k_base', verdict: { admit: true } });
  const res = await post('/v1/chat/completions', request);
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-reserved-tokens'), '46');
  t.equal(upstream.requests.length, 1);
});

t.test('a request planned again on its exact count still joins its conversation', async (t) => {
  // The double answers " hi" once per allowed token.
  const first = [{ role: 'user', content: 'hi' }];
  const messages = [...first, { role: 'assistant', content: ' hi'.repeat(8) }, { role: 'user', content: eq2000 }];
  // A new user message starts a new run: room for the exact prompt and 8, with 5 to spare.
  const prompt = exactChat(messages);
  const { post } = await setup(t, { runs: { tokenBudget: prompt + 8 + 5 } });
  const one = await post('/v1/chat/completions', { model: 'gpt-4o', messages: first, max_tokens: 8 });
  t.equal(((one.body.choices as Array<{ message: { content: string } }>)[0]!).message.content, ' hi'.repeat(8));
  const two = await post('/v1/chat/completions', { model: 'gpt-4o', messages, max_tokens: 8 });
  t.equal(two.status, 200);
  t.equal(two.headers.get('x-tollgate-reserved-tokens'), String(prompt + 8));
  t.equal(two.headers.get('x-tollgate-conversation'), one.headers.get('x-tollgate-conversation'), 'inferred: the same conversation');
});

t.test('the monthly budget: $0.004 holds 31 tokens at $100 per million (the bound of 49 did not)', async (t) => {
  const { gw, metered } = await moneyWorld(t);
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/alice/budget', ADMIN, { monthly_budget_usd: 0.004 })).status, 200);
  const request = { model: 'gpt-4o', input: eq2000 };
  const auth = { authorization: `Bearer ${ALICE}` };
  const planned = await call(gw.url, 'POST', '/v1/admission', auth, { endpoint: '/v1/embeddings', request });
  t.match(planned.body, { sum_tokens: 31, count_method: 'tiktoken:o200k_base', cost_usd: { worst_case: 0.0031 }, verdict: { admit: true } });
  t.equal((await call(gw.url, 'POST', '/v1/embeddings', auth, request)).status, 200);
  t.equal(metered.requests.length, 1);
});

t.test('a run is not sent as its final answer for want of tokens that only the bound lacked', async (t) => {
  const tools: ToolDefinition[] = [{ type: 'function', function: { name: 'search', description: 'Search the web', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const prompt = exactChat([{ role: 'user', content: eq2000 }], tools);
  // One more round needs prompt + 8 and must leave the reserve of 10: 5 tokens to spare exactly,
  // 13 short on the bound (18 tokens more).
  const { upstream, post, plan } = await setup(t, { runs: { tokenBudget: prompt + 8 + 10 + 5, answerReserveTokens: 10, maxToolRounds: 64, patience: null } });
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: eq2000 }], tools, max_tokens: 8 };
  t.match(await plan('/v1/chat/completions', request), { sum_tokens: prompt, mode: 'normal', verdict: { admit: true } });
  const res = await post('/v1/chat/completions', request);
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), null, 'no final-answer notice');
  t.ok(upstream.requests[0]?.body?.tools, 'the tools were sent: a normal round');
});

t.test('past the exact budget the run budget refuses on the bound, and the message says it is one', async (t) => {
  const { upstream, post, plan } = await setup(t, { limits: { maxRowTokens: 100_000 }, runs: { tokenBudget: 1000 } });
  // One pre-token of 300,000 characters: more than the second count encodes per text.
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(300_000) }], max_tokens: 8 };
  const res = await post('/v1/chat/completions', request);
  t.equal(res.status, 402);
  t.equal(res.body.error.code, 'token_budget_exhausted');
  t.match(
    res.body.error.message,
    /^run token budget: this request needs up to \d+ tokens \(prompt up to \d+ \+ max output 8\), more than the run's whole budget of 1000 tokens \(the prompt is an upper bound: text without spaces too long to count exactly\)$/,
  );
  t.equal(res.body.error.count_method, 'tiktoken:o200k_base:upper-bound');
  t.same((await plan('/v1/chat/completions', request)).verdict.error, res.body, 'admission gives the same envelope');
  t.equal(upstream.requests.length, 0);
});

t.test("a run's token 402 on the byte estimate says the prompt is one", async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { models: ['mystery-*'], billing: 'local' })], runs: { tokenBudget: 100 } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'mystery-1', messages: [{ role: 'user', content: 'x'.repeat(400) }], max_tokens: 10 }),
  });
  t.equal(res.status, 402);
  const error = ((await res.json()) as { error: { message: string; prompt_tokens: number; count_method: string } }).error;
  t.equal(error.count_method, 'estimate:bytes');
  t.equal(
    error.message,
    `run token budget: this request needs about ${error.prompt_tokens + 10} tokens (prompt about ${error.prompt_tokens} + max output 10), more than the run's whole budget of 100 tokens (the prompt is an estimate, UTF-8 bytes ÷ 4: no tokenizer here knows this model)`,
  );
  t.equal(upstream.requests.length, 0);
});
