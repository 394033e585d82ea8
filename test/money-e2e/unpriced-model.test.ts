// A metered model with no price (SPEC §7, §11): while a money limit applies it is refused with a
// 402 `model_not_priced` naming the model and how to add a price — never counted as $0 — unless
// the operator chose `prices.unpriced: "allow"`.

import t from 'tap';
import { ADMIN, ALICE, BOB, admission, call, chat, moneyWorld, type ErrorBody } from './money-fixture.js';

const ask = { model: 'gpt-unpriced-x', messages: [{ role: 'user', content: 'What will this cost?' }], max_tokens: 20 };

t.test('refused while a cap or a monthly budget applies, allowed without a limit', async (t) => {
  const { gw, metered } = await moneyWorld(t);
  // 1. A conversation with a cap.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/capped/cap', ADMIN, { cap_usd: 5 })).status, 200);
  const r = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.equal(r.status, 402);
  t.equal(r.headers.get('x-should-retry'), 'false');
  const err = (r.body as unknown as ErrorBody).error;
  t.equal(err.code, 'model_not_priced');
  t.equal(err.type, 'insufficient_quota');
  t.equal(err.param, 'model');
  t.match(err.message, /gpt-unpriced-x/);
  t.match(err.message, /prices\.overrides/);
  // Its choices, as every money refusal has (SPEC §6): no raise admits a cost no one knows; the
  // models that spend no money are admitted at any limit.
  t.same(
    err.choices,
    {
      raise_to_usd: null,
      cheaper_models: [
        { model: 'llama-local', billing: 'local', upstream: 'box', tools: true },
        { model: 'plan-model', billing: 'plan', upstream: 'sub', tools: true },
      ],
      stop: true,
    },
    'a 402 for money carries its choices (regression: none)',
  );
  const local = await chat(gw, ALICE, { ...ask, model: err.choices!.cheaper_models[0]!.model }, { 'x-tollgate-conversation': 'capped' });
  t.equal(local.status, 200, 'the model offered goes');
  // The admission endpoint gives exactly the envelope the real request got.
  const planned = await admission(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.same(planned.verdict, { admit: false, status: 402, error: r.body });
  t.equal(planned.max_affordable_allowance, 0, 'no max_tokens would be admitted');

  // 2. A tenant with a monthly budget, in any conversation.
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/bob/budget', ADMIN, { monthly_budget_usd: 50 })).status, 200);
  const monthly = await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'bobs' });
  t.equal(monthly.status, 402);
  t.equal((monthly.body as unknown as ErrorBody).error.code, 'model_not_priced');
  t.equal(metered.requests.length, 0, 'nothing reached the provider');

  // 3. No limit at all: it goes, and its cost is unknown rather than $0.
  const free = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'uncapped' });
  t.equal(free.status, 200);
  t.equal(free.headers.get('x-tollgate-cost-usd'), null);
  t.equal(metered.requests.length, 1);
});

t.test('with prices.unpriced "allow" it goes under a cap, and its cost stays unknown', async (t) => {
  const { gw, metered } = await moneyWorld(t, { prices: { unpriced: 'allow' } });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/capped/cap', ADMIN, { cap_usd: 5 })).status, 200);
  const r = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.equal(r.status, 200);
  t.equal(r.headers.get('x-tollgate-cost-usd'), null);
  t.equal(metered.requests.length, 1);
  const spend = await call(gw.url, 'GET', '/v1/conversations/capped/spend', { authorization: `Bearer ${ALICE}` });
  t.match(spend.body, { turns: 1, spent_usd: 0, cap_usd: 5 });
});

t.test('with "allow", a request of unknown cost starts only while its limits have room (regression: spend ran past them)', async (t) => {
  // The provider says what each turn cost: $0.015, against a cap of $0.02 and a month of $0.03.
  const { gw, metered } = await moneyWorld(t, { prices: { unpriced: 'allow' }, metered: { providerCost: 0.015 } });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/capped/cap', ADMIN, { cap_usd: 0.02 })).status, 200);
  const first = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.equal(first.status, 200);
  t.equal(first.headers.get('x-tollgate-cost-usd'), '0.015', "the provider's figure counts");
  const second = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.equal(second.status, 200, 'room was left: it starts, and may cross the cap once');
  const third = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.equal(third.status, 402, 'past the cap, a turn of unknown cost does not start');
  const err = (third.body as unknown as ErrorBody).error;
  t.equal(err.code, 'conversation_cap_reached');
  t.match(err, { scope: 'conversation', spent_usd: 0.03, limit_usd: 0.02, needed_usd: null });
  t.match(err.message, /spent \$0\.03 of \$0\.02.*no price, so its cost is unknown/);
  t.equal(err.choices?.stop, true);
  t.same(err.choices?.cheaper_models.map((m) => m.model), ['llama-local', 'plan-model'], 'free models are still offered');
  t.equal(metered.requests.length, 2, 'the refused turn reached no provider');
  const planned = await admission(gw, ALICE, ask, { 'x-tollgate-conversation': 'capped' });
  t.same(planned.verdict, { admit: false, status: 402, error: third.body }, '/v1/admission agrees');
  // A free model still goes past the cap, as it spends no money.
  const local = await chat(gw, ALICE, { ...ask, model: 'llama-local' }, { 'x-tollgate-conversation': 'capped' });
  t.equal(local.status, 200);

  // The month: $0.03 budget, two turns spend it, the third is refused in any conversation.
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/bob/budget', ADMIN, { monthly_budget_usd: 0.03 })).status, 200);
  t.equal((await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'b1' })).status, 200);
  t.equal((await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'b2' })).status, 200);
  const month = await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'b3' });
  t.equal(month.status, 402);
  t.match((month.body as unknown as ErrorBody).error, { code: 'monthly_budget_reached', spent_usd: 0.03, needed_usd: null });
});

// An outside audit: allowed without a limit, an unpriced turn added $0 to every spend view, and
// nothing said that any turn's cost was unknown — an operator billing from the views billed $0.
// The sums stay the known costs; beside each, how many turns of unknown cost they leave out.
t.test('spend views count the turns whose cost is unknown beside the sums (regression: they read as free)', async (t) => {
  const { gw, metered } = await moneyWorld(t);
  const own = { 'x-tollgate-conversation': 'u' };
  const child = { 'x-tollgate-conversation': 'u-child', 'x-tollgate-parent': 'u' };
  const spendOf = async (id: string) => (await call(gw.url, 'GET', `/v1/conversations/${id}/spend`, { authorization: `Bearer ${ALICE}` })).body;
  const monthOf = async () => (await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN)).body;

  // 1. Three unpriced turns: no cost header, $0 spent — and three turns of unknown cost.
  for (let i = 0; i < 3; i++) {
    const r = await chat(gw, ALICE, ask, own);
    t.equal(r.status, 200);
    t.equal(r.headers.get('x-tollgate-cost-usd'), null);
  }
  t.match(await spendOf('u'), { spent_usd: 0, unpriced_turns: 3, turns: 3, tasks_usd: 0, tasks_unpriced_turns: 0 });
  t.same((await spendOf('u')).by_model, { 'gpt-unpriced-x': { turns: 3, spent_usd: 0, unpriced_turns: 3 } });
  t.match(await monthOf(), { spent_usd: 0, unpriced_turns: 3 });

  // 2. A priced turn, a local one and a plan one are turns of known cost: not counted.
  for (const model of ['gpt-4o-mini', 'llama-local', 'plan-model']) t.equal((await chat(gw, ALICE, { ...ask, model }, own)).status, 200, model);
  const mixed = await spendOf('u');
  t.match(mixed, { unpriced_turns: 3, turns: 6 });
  t.ok((mixed.spent_usd as number) > 0, 'the priced turn is spent');
  const byModel = mixed.by_model as Record<string, { unpriced_turns?: number }>;
  t.same(Object.fromEntries(Object.entries(byModel).map(([m, v]) => [m, v.unpriced_turns])), {
    'gpt-4o-mini': undefined,
    'gpt-unpriced-x': 3,
    'llama-local': undefined,
    'plan-model': undefined,
  });
  // A model of known cost keeps SPEC §11's {turns, spent_usd}, nothing more.
  t.same(Object.keys(byModel['llama-local']!).sort(), ['spent_usd', 'turns']);

  // 3. A child's unpriced turn: its own, and its parent's tasks_unpriced_turns beside tasks_usd.
  t.equal((await chat(gw, ALICE, ask, child)).status, 200);
  t.equal((await chat(gw, ALICE, { ...ask, model: 'gpt-4o-mini' }, child)).status, 200);
  t.match(await spendOf('u-child'), { unpriced_turns: 1, tasks_unpriced_turns: 0, turns: 2 });
  const parent = await spendOf('u');
  t.match(parent, { unpriced_turns: 3, tasks_unpriced_turns: 1 });
  t.ok((parent.tasks_usd as number) > 0, "the child's priced turn is in tasks_usd");

  // 4. An upstream that fails before any output: no turn, so no turn of unknown cost either.
  metered.options.failWith = { status: 503, body: { error: { message: 'overloaded', type: 'server_error', param: null, code: null } } };
  t.equal((await chat(gw, ALICE, ask, own)).status, 503);
  t.equal((await chat(gw, ALICE, ask, child)).status, 503);
  delete metered.options.failWith;
  t.match(await spendOf('u'), { unpriced_turns: 3, tasks_unpriced_turns: 1, turns: 6 });
  t.match(await spendOf('u-child'), { unpriced_turns: 1, turns: 2 });

  // 5. The month counts each turn once (the child's not again through its parent); the operator's
  // view of a conversation says the same as the client's.
  t.match(await monthOf(), { unpriced_turns: 4 });
  t.match((await call(gw.url, 'GET', '/admin/conversations/u/spend', ADMIN)).body, { unpriced_turns: 3, tasks_unpriced_turns: 1 });
});
