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
