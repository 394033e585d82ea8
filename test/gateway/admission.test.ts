// POST /v1/admission (SPEC §8, §11): the plan with its budgets and the largest max_tokens every
// budget would admit, computed without running a model or changing any budget.

import t, { type Test } from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

type Json = Record<string, unknown>;

t.test('budgets and max_affordable_allowance, and nothing changes', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 10 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 8000 })], runs: { tokenBudget: 1000, answerReserveTokens: 100 } });
  const admission = async (request: Json, conv = 'c-adm') => {
    const res = await fetch(`${gw.url}/v1/admission`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conv },
      body: JSON.stringify({ endpoint: '/v1/chat/completions', request }),
    });
    t.equal(res.status, 200);
    return (await res.json()) as Json;
  };
  const request = { model: 'gpt-4o', max_tokens: 50, n: 2, messages: [{ role: 'user', content: 'Plan this.' }] };
  // 1. before anything ran
  const a = await admission(request);
  const prompt = (a.charge as Json).prompt as number;
  t.equal((a.charge as Json).allowance, 100, 'max_tokens × n');
  t.same(a.budgets, { run: { limit_tokens: 1000, remaining_tokens: 1000 }, conversation: null, parent: null, monthly: null });
  t.equal(a.max_affordable_allowance, Math.floor((1000 - prompt) / 2), 'the run budget binds, split over n');
  t.same(a.verdict, { admit: true, status: 200, error: null });
  t.equal(a.mode, 'normal');
  t.equal(a.shared_prefix_tokens, 0);
  t.equal(a.count_method, 'tiktoken:o200k_base');
  t.match((a.cost_usd as Json).price, { model: 'gpt-4o', source: /^genai-prices@\d/, date: null }, 'the bundled price, with its source');
  t.equal(upstream.requests.length, 0, 'no model was called');
  // 2. twice: still nothing reserved
  const again = await admission(request);
  t.same(again.budgets, a.budgets, 'admission changes no budget');
  // 3. after a real request of the same run the remaining shrinks by its settled charge
  const real = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-adm' }, body: JSON.stringify(request) });
  t.equal(real.status, 200);
  const charge = Number(real.headers.get('x-tollgate-charge-tokens'));
  const after = await admission(request);
  t.equal(((after.budgets as Json).run as Json).remaining_tokens, 1000 - charge);
  // 4. a request larger than what is left gets the verdict the real one would get
  const huge = await admission({ ...request, max_tokens: 600 });
  t.equal((huge.verdict as Json).status, 402);
  t.equal((((huge.verdict as Json).error as Json).error as Json).code, 'token_budget_exhausted');
  const realHuge = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-adm' }, body: JSON.stringify({ ...request, max_tokens: 600 }) });
  t.equal(realHuge.status, 402);
  t.same(await realHuge.json(), (huge.verdict as Json).error, 'exactly the envelope of the real request');
});

t.test('a tool round keeps the answer reserve out of max_affordable_allowance: the figure runs as sent, one more goes as the final answer', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: () => [{ name: 'search', arguments: '{}' }] });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 600, answerReserveTokens: 150 } });
  const request = { model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: 'Search for it.' }], tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }] };
  const planned = (await (
    await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })
  ).json()) as Json;
  t.equal(planned.mode, 'normal');
  const prompt = (planned.charge as Json).prompt as number;
  const most = planned.max_affordable_allowance as number;
  t.equal(most, 600 - 150 - prompt, 'the budget less the answer reserve less the prompt');
  const send = async (maxTokens: number, conversation: string) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation },
      body: JSON.stringify({ ...request, max_tokens: maxTokens }),
    });
    t.equal(res.status, 200);
    await res.text();
    return res.headers.get('x-tollgate-notice');
  };
  t.equal(await send(most, 'c-most'), null, 'at the figure: a tool round as sent');
  t.equal(await send(most + 1, 'c-more'), 'finishing-the-answer; reason=tokens', 'one more: the final answer instead');
});

t.test('the context window bounds max_affordable_allowance when no budget does', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 300 })], runs: { tokenBudget: null } });
  const res = await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o', messages: [{ role: 'user', content: 'Hi' }] } }) });
  const a = (await res.json()) as Json;
  t.same((a.budgets as Json).run, { limit_tokens: null, remaining_tokens: null }, 'no run budget: the object, its figures null');
  t.equal(a.max_affordable_allowance, 300 - (a.longest_row as number));
  t.equal((a.charge as Json).allowance, 300 - (a.longest_row as number), 'an unspecified allowance is clamped to the room left');
});

t.test('completions and embeddings are not runs: the run token budget does not hold them', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 100, answerReserveTokens: 10 } });
  const row = ' word'.repeat(60);
  const post = (path: string, body: Json) => fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  t.equal((await post('/v1/embeddings', { model: 'gpt-4o', input: [row, row, row] })).status, 200, '180 tokens of embeddings against a 100-token run budget');
  t.equal((await post('/v1/completions', { model: 'gpt-4o', prompt: row, max_tokens: 80 })).status, 200);
  const plan = (await (await post('/v1/admission', { endpoint: '/v1/embeddings', request: { model: 'gpt-4o', input: [row, row] } })).json()) as Json;
  t.same((plan.budgets as Json).run, { limit_tokens: null, remaining_tokens: null }, 'no run budget holds embeddings');
  // A chat request of the same size is a run, and is held.
  t.equal((await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 80, messages: [{ role: 'user', content: row }] })).status, 402);
});

t.test('a request refused before planning finished gets the same shape, with null for what is not known', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 100 })] });
  const admission = async (request: unknown) =>
    (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })).json()) as Json;
  const ok = await admission({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 5 });
  const keys = Object.keys(ok).sort();
  const cases = [
    [{ model: 'nope-1', messages: [{ role: 'user', content: 'hi' }] }, 404],
    [{ model: 'gpt-4o', messages: 'hi' }, 400],
    [{ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 500 }, 413],
  ] as const;
  for (const [request, status] of cases) {
    const refused = await admission(request);
    t.equal((refused.verdict as Json).status, status);
    t.same(Object.keys(refused).sort(), keys, `the ${status} has the plan's shape`);
  }
  const missing = await admission({ model: 'nope-1', messages: [{ role: 'user', content: 'hi' }] });
  t.match(missing, { model: 'nope-1', upstream: null, sum_tokens: null, conversation: null, run: null });
});

t.test('asking for a plan does not change the conversation the real request then joins', async (t) => {
  // Found by an outside audit: admission remembered the message list in the prefix memo, and the
  // real request that followed joined an older conversation than the plan had said.
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const s = { role: 'system', content: 'You answer briefly.' };
  const u = (n: number) => ({ role: 'user', content: `question number ${n}` });
  const a = (n: number) => ({ role: 'assistant', content: `answer number ${n}` });
  const send = async (path: string, body: Json, conversation?: string) => {
    const res = await fetch(`${gw.url}${path}`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(conversation ? { 'x-tollgate-conversation': conversation } : {}) },
      body: JSON.stringify(body),
    });
    return { headers: res.headers, body: (await res.json()) as Json };
  };
  const chat = (messages: Json[]) => ({ model: 'gpt-4o', max_tokens: 8, messages });
  await send('/v1/chat/completions', chat([s, u(1)]), 'P');
  await send('/v1/chat/completions', chat([s, u(1), a(1), u(2)]), 'Q');
  await send('/v1/chat/completions', chat([s, u(1)]), 'P2');
  const r = chat([s, u(1), a(1), u(2), a(2), u(3)]);
  const planned = await send('/v1/admission', { endpoint: '/v1/chat/completions', request: r });
  const real = await send('/v1/chat/completions', r);
  t.equal(real.headers.get('x-tollgate-conversation'), planned.body.conversation, 'the conversation the plan named');
  t.equal(real.headers.get('x-tollgate-shared-prefix-tokens'), String(planned.body.shared_prefix_tokens));
  t.equal(Number(real.headers.get('x-tollgate-reserved-tokens')), (planned.body.charge as { prompt: number; allowance: number }).prompt + 8);
});

// Regression (twentieth session): admission's exact second count (ADR 0019) was kept in the shared
// token cache, so the real request that followed counted its text exactly where it would have
// counted it on its upper bound: another charge, another ledger row, for having asked.
t.test("asking for a plan does not change how the real request then counts its prompt", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 1000 } });
  // A long run without spaces: counted first on an upper bound.
  const messages = (run: string) => [{ role: 'user', content: `${run}${'z'.repeat(700)}` }];
  const post = async (path: string, body: Json, conversation: string) =>
    (await (await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation }, body: JSON.stringify(body) })).json()) as Json;
  const real = async (run: string) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': `real-${run}` }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: messages(run), max_tokens: 10 }) });
    return { reserved: res.headers.get('x-tollgate-reserved-tokens'), method: res.headers.get('x-tollgate-count-method') };
  };
  const alone = await real('a');
  t.match(alone.method, /upper-bound$/, 'on its own, the real request counts on the upper bound');
  // A plan whose budget decision rests on that bound is counted again, exactly (ADR 0019).
  const plan = await post('/v1/admission', { endpoint: '/v1/chat/completions', request: { model: 'gpt-4o-mini', messages: messages('b'), max_tokens: 640 } }, 'other');
  t.equal(plan.count_method, 'tiktoken:o200k_base', 'the plan was counted exactly');
  const after = await real('b');
  t.same(after, alone, 'the real request after it counts and reserves as it would have without the question');
});

t.test("a final answer's allowance stays within the window its rewritten prompt leaves, and admission says so", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 300 })], runs: { tokenBudget: 20000, maxToolRounds: 1 } });
  const tools = [{ type: 'function', function: { name: 's', parameters: { type: 'object', properties: {} } } }];
  const messages = [
    { role: 'user', content: ' word'.repeat(100) },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 's', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'result' },
  ];
  const post = (path: string, body: Json, conversation: string) =>
    fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation }, body: JSON.stringify(body) });
  // The default allowance (4,096) and an explicit one that fits the request as sent (the gateway's
  // instruction makes the final prompt longer than the tools it removed).
  for (const [label, extra] of [['no max_tokens', {}], ['max_tokens 150', { max_tokens: 150 }]] as const) {
    const request = { model: 'gpt-4o', messages, tools, ...extra };
    const plan = (await (await post('/v1/admission', { endpoint: '/v1/chat/completions', request }, `c-fw-${label}`)).json()) as Json;
    t.equal(plan.mode, 'final-answer', label);
    const finalPrompt = plan.longest_row as number;
    t.ok(finalPrompt + 150 > 300, `${label}: the final prompt (${finalPrompt}) leaves less than 150 of the window`);
    t.equal((plan.charge as Json).allowance, 300 - finalPrompt, `${label}: the allowance is what the window leaves`);
    const res = await post('/v1/chat/completions', request, `c-fw-${label}`);
    t.equal(res.status, 200, label);
    await res.text();
    t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
    const sent = upstream.requests.at(-1)!.body!;
    t.equal(sent.max_completion_tokens ?? sent.max_tokens, 300 - finalPrompt, `${label}: forwarded within the window`);
    t.equal(Number(res.headers.get('x-tollgate-reserved-tokens')), (plan.charge as Json).prompt as number + 300 - finalPrompt, `${label}: reserved as admission planned`);
  }
});

// Many tools: the request as sent is much longer than its final answer, which drops them.
const manyTools = Array.from({ length: 6 }, (_, i) => ({ type: 'function', function: { name: `search_${i}`, description: 'find things', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }));

async function finalAnswerGateway(t: Test, runs: Json) {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 300 })], runs });
  const post = (path: string, body: Json) =>
    fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-maa-final' }, body: JSON.stringify(body) });
  const plan = async (request: Json) => (await (await post('/v1/admission', { endpoint: '/v1/chat/completions', request })).json()) as Json;
  return { post, plan };
}

// Regression: a round sent as the final answer for want of tokens was given the final answer's
// figure, worked out on the answer's shorter prompt without the reserve; that max_tokens then
// planned the round itself, which could be refused (a money cap) or leave room unused.
t.test('a round that goes as the final answer for its max_tokens alone is given the figure of the round it was', async (t) => {
  const { post, plan } = await finalAnswerGateway(t, { tokenBudget: 400, answerReserveTokens: 50 });
  const request = { model: 'gpt-4o', n: 2, messages: [{ role: 'user', content: ' word'.repeat(40) }], tools: manyTools };
  const asked = await plan(request);
  t.equal(asked.mode, 'final-answer', 'the default allowance does not fit a round');
  const small = await plan({ ...request, max_tokens: 10 });
  t.equal(small.mode, 'normal');
  const most = asked.max_affordable_allowance as number;
  t.equal(most, small.max_affordable_allowance, 'the same figure whatever max_tokens was asked');
  // (400 − the round's prompt − the 50 reserved for the answer) ÷ 2 choices.
  t.equal(most, Math.floor((400 - ((small.charge as Json).prompt as number) - 50) / 2));
  const res = await post('/v1/chat/completions', { ...request, max_tokens: most });
  await res.text();
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), null, 'sent as the round');
  const over = await plan({ ...request, max_tokens: most + 1 });
  t.equal(over.mode, 'final-answer', 'one more goes as the final answer');
});

t.test('in final-answer mode, with no round possible, max_affordable_allowance is what the window admits for the request as sent', async (t) => {
  // The reserve leaves a round no room at all: every max_tokens goes as the final answer.
  const { post, plan } = await finalAnswerGateway(t, { tokenBudget: 500, answerReserveTokens: 310 });
  const request = { model: 'gpt-4o', n: 2, messages: [{ role: 'user', content: ' word'.repeat(40) }], tools: manyTools };
  const first = await plan(request);
  t.equal(first.mode, 'final-answer');
  const most = first.max_affordable_allowance as number;
  t.ok(most > 0);
  const again = await plan({ ...request, max_tokens: most });
  t.same(again.verdict, { admit: true, status: 200, error: null }, 'the figure itself is admitted');
  t.equal((again.charge as Json).allowance, 2 * most, 'and honoured as asked');
  const over = await plan({ ...request, max_tokens: most + 1 });
  t.equal((over.verdict as Json).status, 413, 'one more is past the window');
  const res = await post('/v1/chat/completions', { ...request, max_tokens: most });
  t.equal(res.status, 200, 'and so is the real request');
  await res.text();
});

t.test('an unpriced metered model under a money limit affords no allowance, whichever refusal comes first', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(upstream.url, { contextWindow: 100 })],
    runs: { tokenBudget: 50 },
    auth: { keys: [{ key: 'tg-a', tenant: 'a', monthlyBudgetUsd: 10 }] },
  });
  const plan = async (request: Json) =>
    (await (
      await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer tg-a' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })
    ).json()) as Json;
  for (const maxTokens of [10, 60, 200]) {
    const a = await plan({ model: 'gpt-zzz', messages: [{ role: 'user', content: 'hi' }], max_tokens: maxTokens });
    t.equal((a.verdict as Json).admit, false, `max_tokens ${maxTokens}: refused`);
    t.equal(a.max_affordable_allowance, 0, `max_tokens ${maxTokens}: no max_tokens would be admitted`);
  }
  t.equal(upstream.requests.length, 0);
});
