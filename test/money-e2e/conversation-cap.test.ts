// A conversation cap set by the operator before the first request (SPEC §6, §7, §11): requests go
// until the next one's worst case would cross it, then a 402 `conversation_cap_reached` with the
// figures and the three choices, marked not to be retried. A child shares its parent's cap, and a
// child of a child every cap above it (ADR 0018).

import t from 'tap';
import { ADMIN, ALICE, admission, call, chat, close, costHeader, listUsd, moneyWorld, type ErrorBody } from './money-fixture.js';

t.test('a cap set before the first request holds, and the 402 offers raise, cheaper models, stop', async (t) => {
  const { gw, metered, other } = await moneyWorld(t, { metered: { completionTokens: 8 } });
  const conv = { 'x-tollgate-conversation': 'capped' };
  const body = { model: 'gpt-4o', messages: [{ role: 'user', content: 'word '.repeat(1000) }], max_tokens: 100 };

  // 1. The operator sets $2.07 before the conversation exists.
  const cap = await call(gw.url, 'PUT', '/admin/conversations/capped/cap', ADMIN, { cap_usd: 2.07 });
  t.equal(cap.status, 200);
  t.same(cap.body, { conversation: 'capped', cap_usd: 2.07 });

  // 2. The provider reports the prompt as the gateway counted it: worst case and cost are exact.
  const plan = await admission(gw, ALICE, body, conv);
  const prompt = plan.sum_tokens;
  metered.options.promptTokens = () => prompt;
  const worst = plan.cost_usd.worst_case!;
  t.ok(close(worst, (prompt * 100 + 100 * 400) / 1e6), 'worst case: whole prompt uncached + whole allowance');
  const cost = listUsd('gpt-4o', prompt, 0, 8);
  let expected = 0;
  while (expected * cost + worst <= 2.07) expected++;
  t.ok(expected >= 10, `the cap admits ${expected} turns`);

  // 3. Requests until the cap.
  let spent = 0;
  let refused: Awaited<ReturnType<typeof chat>> | null = null;
  for (let i = 0; i < expected + 3 && !refused; i++) {
    const r = await chat(gw, ALICE, body, conv);
    if (r.status === 402) refused = r;
    else {
      t.equal(r.status, 200);
      spent += costHeader(r)!;
    }
  }
  t.ok(refused, 'the cap refused a request');
  t.equal(metered.requests.length, expected, 'exactly the affordable turns reached the provider');
  t.ok(close(spent, expected * cost));

  // 4. The refusal: figures as numbers, and what the client can do.
  t.equal(refused!.headers.get('x-should-retry'), 'false');
  const err = (refused!.body as unknown as ErrorBody).error;
  t.equal(err.code, 'conversation_cap_reached');
  t.equal(err.type, 'insufficient_quota');
  t.ok(close(err.spent_usd!, spent), `spent_usd ${err.spent_usd}`);
  t.equal(err.limit_usd, 2.07);
  t.ok(close(err.needed_usd!, worst));
  t.ok(err.spent_usd! + err.needed_usd! > err.limit_usd!);
  t.match(err.message, /conversation cap reached: spent \$\d+\.\d\d of \$2\.07, this request needs up to \$0\.\d+/);
  const choices = err.choices!;
  // Twice $2.07 is $4.14; a person would pick $4.50.
  t.equal(choices.raise_to_usd, 4.5);
  t.equal(choices.stop, true);
  t.same(
    choices.cheaper_models.map((m) => [m.model, m.billing]),
    [
      ['llama-local', 'local'],
      ['plan-model', 'plan'],
      ['gpt-4o-mini', 'metered'],
    ],
    'local first, then plan, then a metered model at a third of the price (never the unpriced one)',
  );
  // A quarter of the cap ($0.5175), in whole cents up, at least $0.50.
  t.equal(choices.cheaper_models[2].allowance_usd, 0.52);

  // 5. The spend view shows the cap; choosing the local model works at once.
  const spend = await call(gw.url, 'GET', '/v1/conversations/capped/spend', { authorization: `Bearer ${ALICE}` });
  t.equal(spend.body.cap_usd, 2.07);
  t.equal(spend.body.turns, expected);
  const local = await chat(gw, ALICE, { ...body, model: 'llama-local' }, conv);
  t.equal(local.status, 200, 'a turn on this machine spends no money and always goes');
  t.equal(other.requests.length, 1);
});

t.test('the cheaper metered model a 402 offers is admitted with the room it was offered with (regression: refused at the cap)', async (t) => {
  // A run budget large enough that only money refuses the large request below.
  const keys = [{ key: ALICE, tenant: 'alice', runs: { tokenBudget: null } }];
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 8 }, keys });
  const conv = { 'x-tollgate-conversation': 'switch' };
  const body = { model: 'gpt-4o', messages: [{ role: 'user', content: 'word '.repeat(200) }], max_tokens: 100 };
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/switch/cap', ADMIN, { cap_usd: 0.1 })).status, 200);
  let refused: Awaited<ReturnType<typeof chat>> | null = null;
  for (let i = 0; i < 50 && !refused; i++) {
    const r = await chat(gw, ALICE, body, conv);
    if (r.status === 402) refused = r;
  }
  const offer = (refused!.body as unknown as ErrorBody).error.choices!.cheaper_models.find((m) => m.model === 'gpt-4o-mini');
  t.equal(offer?.allowance_usd, 0.5, 'a quarter of $0.10, at least $0.50');

  // Taking the offer: gpt-4o-mini goes, past the cap, inside the room; the dearer model stays refused.
  const mini = { ...body, model: 'gpt-4o-mini' };
  const planned = await admission(gw, ALICE, mini, conv);
  t.same(planned.verdict, { admit: true, status: 200, error: null }, '/v1/admission says it goes');
  t.ok(planned.max_affordable_allowance! > 100, `max_affordable_allowance ${planned.max_affordable_allowance} counts the room`);
  const before = metered.requests.length;
  for (let i = 0; i < 3; i++) t.equal((await chat(gw, ALICE, mini, conv)).status, 200, `cheaper turn ${i + 1}`);
  t.equal(metered.requests.length, before + 3);
  const spend = await call(gw.url, 'GET', '/v1/conversations/switch/spend', { authorization: `Bearer ${ALICE}` });
  t.equal((spend.body.by_model as Record<string, { turns: number }>)['gpt-4o-mini']?.turns, 3);
  t.equal((await chat(gw, ALICE, body, conv)).status, 402, 'the dearer model has no room past the cap');

  // A request on the cheaper model larger than the room left is refused, and says the room.
  const large = await chat(gw, ALICE, { ...mini, max_tokens: 95_000, n: 3 }, conv);
  t.equal(large.status, 402);
  const err = (large.body as unknown as ErrorBody).error;
  t.equal(err.code, 'conversation_cap_reached');
  t.equal(err.limit_usd, 0.1);
  t.match(err.message, /of \$0\.10 \(and \$0\.50 of room past it for a cheaper model\), this request needs up to \$0\.57/);
  const largePlan = await admission(gw, ALICE, { ...mini, max_tokens: 95_000, n: 3 }, conv);
  t.same(largePlan.verdict, { admit: false, status: 402, error: large.body });

  // No room where no refusal offered it.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/fresh/cap', ADMIN, { cap_usd: 0.0001 })).status, 200);
  const fresh = await chat(gw, ALICE, mini, { 'x-tollgate-conversation': 'fresh' });
  t.equal(fresh.status, 402);
  t.notMatch((fresh.body as unknown as ErrorBody).error.message, /room/);
});

// Regression (nineteenth session): the room was given to any cheaper model once the conversation
// had spent on a dearer one. A first request refused at the cap had spent nothing, so the model
// its 402 offered was then refused too; and a conversation that once used the dearer model ran
// the cheaper one past its cap, by the room, without ever being refused or told.
t.test('the room past a cap is given by the 402 that offered it, and only then', async (t) => {
  const keys = [{ key: ALICE, tenant: 'alice', runs: { tokenBudget: null } }];
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 8 }, keys });
  const dear = { model: 'gpt-4o', messages: [{ role: 'user', content: 'word '.repeat(200) }], max_tokens: 100 };
  const mini = { ...dear, model: 'gpt-4o-mini' };
  const errorOf = (r: { body: unknown }) => (r.body as ErrorBody).error;

  // 1. Refused on its very first request: taking the offer goes, within the room.
  const first = { 'x-tollgate-conversation': 'first' };
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/first/cap', ADMIN, { cap_usd: 0.0002 })).status, 200);
  // /v1/admission shows the offer without making it.
  const asked = await admission(gw, ALICE, dear, first);
  t.equal(asked.verdict.status, 402);
  t.equal((await admission(gw, ALICE, mini, first)).verdict.status, 402, 'an offer /v1/admission showed gives no room');
  const refused = await chat(gw, ALICE, dear, first);
  t.equal(refused.status, 402);
  t.equal(errorOf(refused).choices!.cheaper_models.find((m) => m.model === 'gpt-4o-mini')?.allowance_usd, 0.5);
  t.same((await admission(gw, ALICE, mini, first)).verdict, { admit: true, status: 200, error: null });
  const before = metered.requests.length;
  t.equal((await chat(gw, ALICE, mini, first)).status, 200, 'the model the 402 offered goes');
  t.equal(metered.requests.length, before + 1);
  t.equal((await chat(gw, ALICE, dear, first)).status, 402, 'the refused model stays at the cap');

  // 2. A conversation that spent on the dearer model is not given room by that alone: the cheaper
  //    model meets the cap as any model does, and its 402 says no room.
  const used = { 'x-tollgate-conversation': 'used' };
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/used/cap', ADMIN, { cap_usd: 0.01 })).status, 200);
  t.equal((await chat(gw, ALICE, { ...dear, max_tokens: 5, messages: [{ role: 'user', content: 'hi' }] }, used)).status, 200);
  let atCap: Awaited<ReturnType<typeof chat>> | null = null;
  for (let i = 0; i < 100 && !atCap; i++) {
    const r = await chat(gw, ALICE, mini, used);
    if (r.status === 402) atCap = r;
  }
  t.ok(atCap, 'the cheaper model is refused at the cap');
  t.notMatch(errorOf(atCap!).message, /room/);
  const spent = await call(gw.url, 'GET', '/v1/conversations/used/spend', { authorization: `Bearer ${ALICE}` });
  t.ok((spent.body.spent_usd as number) <= 0.01, `spent $${spent.body.spent_usd as number}, within the $0.01 cap`);

  // 3. An operator who sets the cap again withdraws an offer made under the old one.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/first/cap', ADMIN, { cap_usd: 0.0002 })).status, 200);
  t.equal((await chat(gw, ALICE, mini, first)).status, 402, 'no room after the cap was set again');
});

// Regression: a research round sent as the final answer for want of tokens was given the final
// answer's figure (its short prompt, tools dropped); that max_tokens planned the round itself, whose
// worst case the cap could not hold — a 402 for the figure admission had just offered.
t.test("max_affordable_allowance of a round over the run's tokens is one the cap admits as that round", async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 5 }, runs: { tokenBudget: 20000 } });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/research/cap', ADMIN, { cap_usd: 0.2 })).status, 200);
  const conv = { 'x-tollgate-conversation': 'research' };
  const describe = 'Searches the corpus for documents matching the query and returns ranked passages. '.repeat(6);
  const tools = Array.from({ length: 8 }, (_, i) => ({ type: 'function', function: { name: `tool_${i}`, description: describe, parameters: { type: 'object', properties: { q: { type: 'string', description: describe } } } } }));
  const messages = [
    { role: 'user', content: 'Find the capital of France.' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'tool_0', arguments: '{"q":"x"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'Paris is the capital.' },
  ];
  const plan = await admission(gw, ALICE, { model: 'gpt-4o', messages, tools, max_tokens: 30000 }, conv);
  t.equal((plan as unknown as { mode: string }).mode, 'final-answer', 'as asked, the round goes as the final answer');
  const most = plan.max_affordable_allowance!;
  t.ok(most >= 1);
  const at = await admission(gw, ALICE, { model: 'gpt-4o', messages, tools, max_tokens: most }, conv);
  t.same(at.verdict, { admit: true, status: 200, error: null }, `max_tokens ${most} is admitted`);
  const over = await admission(gw, ALICE, { model: 'gpt-4o', messages, tools, max_tokens: most + 1 }, conv);
  t.equal(over.verdict.status, 402, 'one more is past the cap');
  const r = await chat(gw, ALICE, { model: 'gpt-4o', messages, tools, max_tokens: most }, conv);
  t.equal(r.status, 200, 'and the real request goes');
  t.equal(r.headers.get('x-tollgate-notice'), null, 'as the round it was');
  t.ok(Array.isArray(metered.requests.at(-1)!.body!.tools), 'tools offered');
});

t.test('a child sent while its parent is past its cap does not start', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { promptTokens: () => 1000, completionTokens: 8 } });
  const small = (model: string) => ({ model, messages: [{ role: 'user', content: 'one more step' }], max_tokens: 1 });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/lead/cap', ADMIN, { cap_usd: 1 })).status, 200);

  // 1. The parent spends $0.3096 in three turns, under its $1 cap.
  for (let i = 0; i < 3; i++) t.equal((await chat(gw, ALICE, small('gpt-4o'), { 'x-tollgate-conversation': 'lead' })).status, 200);
  // 2. A child's turns count against the parent's cap as they go.
  const first = await chat(gw, ALICE, small('gpt-4o-mini'), { 'x-tollgate-conversation': 'helper', 'x-tollgate-parent': 'lead' });
  t.equal(first.status, 200);
  const before = (await call(gw.url, 'GET', '/v1/conversations/lead/spend', { authorization: `Bearer ${ALICE}` })).body;
  t.ok(close(before.tasks_usd as number, costHeader(first)!));

  // 3. The operator lowers the cap below what was spent: the parent is now past it.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/lead/cap', ADMIN, { cap_usd: 0.25 })).status, 200);
  const seen = metered.requests.length;
  const child = await chat(gw, ALICE, small('gpt-4o-mini'), { 'x-tollgate-conversation': 'helper', 'x-tollgate-parent': 'lead' });
  t.equal(child.status, 402);
  t.equal(child.headers.get('x-should-retry'), 'false');
  const err = (child.body as unknown as ErrorBody).error;
  t.equal(err.code, 'conversation_cap_reached');
  t.equal(err.scope, 'parent');
  t.equal(err.limit_usd, 0.25);
  t.match(err.message, /^parent conversation cap reached/);
  // At a parent's cap a child cannot be given metered room: only models that spend no money.
  t.same(err.choices!.cheaper_models.map((m) => m.billing), ['local', 'plan']);
  // 4. A brand-new child naming the parent is refused the same way; nothing reached the provider.
  const fresh = await chat(gw, ALICE, small('gpt-4o-mini'), { 'x-tollgate-conversation': 'helper-2', 'x-tollgate-parent': 'lead' });
  t.equal(fresh.status, 402);
  t.equal(metered.requests.length, seen, 'the child did not start');
  // 5. A client cannot lift the cap: the operator API refuses a client key.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/lead/cap', { authorization: `Bearer ${ALICE}` }, { cap_usd: null })).status, 403);
  t.equal((await chat(gw, ALICE, small('gpt-4o-mini'), { 'x-tollgate-conversation': 'helper', 'x-tollgate-parent': 'lead' })).status, 402);
  // 6. Nor can the child leave its parent: without the header, or naming another parent, the
  // parent it had still holds, and /v1/admission says the same.
  const admissionOf = async (headers: Record<string, string>) =>
    (await call(gw.url, 'POST', '/v1/admission', { authorization: `Bearer ${ALICE}`, ...headers }, { endpoint: '/v1/chat/completions', request: small('gpt-4o-mini') })).body;
  const escapes: Array<Record<string, string>> = [{ 'x-tollgate-conversation': 'helper' }, { 'x-tollgate-conversation': 'helper', 'x-tollgate-parent': 'elsewhere' }];
  for (const headers of escapes) {
    const escape = await chat(gw, ALICE, small('gpt-4o-mini'), headers);
    t.equal(escape.status, 402, JSON.stringify(headers));
    t.equal((escape.body as unknown as ErrorBody).error.scope, 'parent');
    const plan = await admissionOf(headers);
    t.match(plan.verdict, { admit: false, status: 402 });
    t.match(plan.budgets, { parent: { limit_usd: 0.25 } });
  }
  t.equal(metered.requests.length, seen, 'no escape reached the provider');
});

// Regression (outside audit): a grandchild — a child of a child — was held by no cap but its own
// parent's, and its spend never reached the top. Three grandchildren spent $0.90 past a $0.50 cap
// while the top conversation's `tasks_usd` stayed at the one child's $0.30.
t.test('a child of a child is held by the top conversation cap, and its spend counts there', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { providerCost: 0.3, completionTokens: 1 } });
  const step = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'one step' }], max_tokens: 1 };
  const as = (conversation: string, parent?: string) => ({
    'x-tollgate-conversation': conversation,
    ...(parent ? { 'x-tollgate-parent': parent } : {}),
  });
  const spendOf = async (id: string) => (await call(gw.url, 'GET', `/v1/conversations/${id}/spend`, { authorization: `Bearer ${ALICE}` })).body;
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/P1/cap', ADMIN, { cap_usd: 0.5 })).status, 200);

  // 1. The top conversation and one child each spend $0.30: the family is at $0.60 of $0.50.
  t.equal((await chat(gw, ALICE, step, as('P1'))).status, 200);
  t.equal((await chat(gw, ALICE, step, as('C1', 'P1'))).status, 200);
  // 2. Another child does not start.
  t.equal((await chat(gw, ALICE, step, as('C2', 'P1'))).status, 402);
  const seen = metered.requests.length;
  // 3. Nor does a grandchild: it shares its parent's cap, and so its parent's parent's.
  for (const g of ['G0', 'G1', 'G2']) {
    const r = await chat(gw, ALICE, step, as(g, 'C1'));
    t.equal(r.status, 402, g);
    t.match(r.body, { error: { code: 'conversation_cap_reached', scope: 'parent', limit_usd: 0.5 } });
    const spent = (r.body as unknown as ErrorBody).error?.spent_usd ?? NaN;
    t.ok(close(spent, 0.6), `spent_usd ${spent}`);
  }
  t.equal(metered.requests.length, seen, 'no grandchild reached the provider');
  // 4. /v1/admission says the same for a grandchild.
  const plan = await admission(gw, ALICE, step, as('G3', 'C1'));
  t.match(plan.verdict, { admit: false, status: 402 });
  t.equal(plan.max_affordable_allowance, 0);

  // 5. With room again, a grandchild's and a great-grandchild's spend count in the tasks_usd of
  // every conversation above them.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/P1/cap', ADMIN, { cap_usd: 1 })).status, 200);
  t.equal((await chat(gw, ALICE, step, as('G0', 'C1'))).status, 200);
  t.equal((await chat(gw, ALICE, step, as('H0', 'G0'))).status, 200, 'the family was at $0.90 of $1');
  t.match(await spendOf('H0'), { spent_usd: 0.3, tasks_usd: 0 });
  t.match(await spendOf('G0'), { spent_usd: 0.3, tasks_usd: 0.3 });
  t.ok(close((await spendOf('C1')).tasks_usd as number, 0.6), 'the child: its child and grandchild');
  t.ok(close((await spendOf('P1')).tasks_usd as number, 0.9), 'the top: every conversation below');
  const late = await chat(gw, ALICE, step, as('G1', 'C1'));
  t.equal(late.status, 402, 'the family is at $1.20 of $1');
  t.match(late.body, { error: { scope: 'parent', limit_usd: 1 } });
});

t.test('a conversation nested more than 16 deep is refused with a 400 naming x-tollgate-parent', async (t) => {
  const { gw, other } = await moneyWorld(t);
  const step = { model: 'llama-local', messages: [{ role: 'user', content: 'one step' }], max_tokens: 1 };
  // 1. n0 ← n1 ← … ← n16: sixteen conversations above the deepest, the most a request may have.
  t.equal((await chat(gw, ALICE, step, { 'x-tollgate-conversation': 'n0' })).status, 200);
  for (let i = 1; i <= 16; i++) {
    t.equal((await chat(gw, ALICE, step, { 'x-tollgate-conversation': `n${i}`, 'x-tollgate-parent': `n${i - 1}` })).status, 200, `n${i}`);
  }
  // 2. One more level is refused before anything reaches a model — even one that costs nothing.
  const seen = other.requests.length;
  const deep = { 'x-tollgate-conversation': 'n17', 'x-tollgate-parent': 'n16' };
  const r = await chat(gw, ALICE, step, deep);
  t.equal(r.status, 400);
  t.equal(r.headers.get('x-should-retry'), 'false');
  t.match(r.body, { error: { code: 'invalid_request', type: 'invalid_request_error', param: 'x-tollgate-parent', limit: 16 } });
  t.match((r.body as unknown as ErrorBody).error.message, /more than 16 conversations above it/);
  t.equal(other.requests.length, seen);
  // 3. /v1/admission gives the same verdict.
  const plan = await admission(gw, ALICE, step, deep);
  t.match(plan.verdict, { admit: false, status: 400, error: { error: { param: 'x-tollgate-parent' } } });
  t.equal(plan.max_affordable_allowance, 0);
});

t.test('an upstream configured by pattern offers the model it reports serving as a cheaper choice', async (t) => {
  const { startOpenAiDouble } = await import('../doubles/openai.js');
  const { startLlamaCppDouble } = await import('../doubles/llamacpp.js');
  const { startGateway, llamaUpstream } = await import('../helpers/gateway.js');
  const metered = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(metered.close);
  const local = await startLlamaCppDouble();
  t.teardown(local.close);
  // The spec's own example: a local llama.cpp server taking every name (`*`), a metered provider for gpt-*.
  const gw = await startGateway(t, {
    upstreams: [
      llamaUpstream(local.url),
      { name: 'openai', kind: 'openai', baseUrl: `${metered.url}/v1`, apiKeyEnv: 'DOUBLE_KEY', models: ['gpt-*'], billing: 'metered', contextWindow: 128000 },
    ],
  });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/tiny-cap/cap', ADMIN, { cap_usd: 0.0001 })).status, 200);
  const res = await call(gw.url, 'POST', '/v1/chat/completions', { 'x-tollgate-conversation': 'tiny-cap' }, { model: 'gpt-4o', messages: [{ role: 'user', content: 'Hello there' }], max_tokens: 50 });
  t.equal(res.status, 402);
  const error = (res.body as unknown as ErrorBody).error;
  t.equal(error.code, 'conversation_cap_reached');
  t.same(error.choices!.cheaper_models, [{ model: 'tiny.gguf', billing: 'local', upstream: 'local', tools: true }], 'the model the llama.cpp server reports (its /props), not its pattern');
  t.equal(metered.requests.length, 0, 'nothing reached the provider, not even a question about its models');
});
