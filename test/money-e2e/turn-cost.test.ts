// What each turn cost, as the client sees it in `x-tollgate-cost-usd` and the operator in the
// ledger (SPEC §7, §11): the provider's own figure first, else list price with cached input at the
// cache-read price, else nothing — never a guess; local is free; a plan spends no money.

import t from 'tap';
import { ALICE, ADMIN, admission, call, chat, listUsd, moneyWorld } from './money-fixture.js';

const ask = (model: string, extra: Record<string, unknown> = {}) => ({ model, messages: [{ role: 'user', content: 'Price this turn' }], max_tokens: 50, ...extra });

async function ledgerRows(url: string) {
  const r = await fetch(`${url}/admin/ledger`, { headers: ADMIN });
  return (await r.text())
    .split('\n')
    .filter((l) => l.length > 0)
    .map((l) => JSON.parse(l) as { model: string; cost_usd: number | null; saved_usd: number | null; billing: string });
}

t.test('the provider figure (usage.cost) is the cost when the provider sends one', async (t) => {
  const { gw } = await moneyWorld(t, { metered: { providerCost: 0.0123, promptTokens: () => 1000, completionTokens: 8 } });
  const r = await chat(gw, ALICE, ask('gpt-4o'));
  t.equal(r.status, 200);
  // 1. Not the list price (1000 × $100/M + 8 × $400/M = $0.1032): the provider said $0.0123.
  t.equal(r.headers.get('x-tollgate-cost-usd'), '0.0123');
  const [row] = await ledgerRows(gw.url);
  t.equal(row.cost_usd, 0.0123);
});

t.test('one cost, one figure: the header, the closing comment, the ledger, the spend views and admission agree to the ledger\'s 10 decimals', async (t) => {
  // $0.000123456789 needs more than 8 decimals: the ledger keeps 0.0001234568.
  const { gw } = await moneyWorld(t, { metered: { providerCost: 0.000123456789, promptTokens: () => 1000, completionTokens: 8 } });
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/precise/cap', ADMIN, { cap_usd: 1 })).status, 200);
  const conv = { 'x-tollgate-conversation': 'precise' };
  const r = await chat(gw, ALICE, ask('gpt-4o'), conv);
  t.equal(r.status, 200);
  t.equal(r.headers.get('x-tollgate-cost-usd'), '0.0001234568');
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ALICE}`, 'content-type': 'application/json', ...conv },
    body: JSON.stringify(ask('gpt-4o', { stream: true })),
  });
  const trailer = JSON.parse(/^: tollgate (\{.*\})$/m.exec(await res.text())![1]) as { cost_usd: number };
  t.equal(trailer.cost_usd, 0.0001234568);
  t.same((await ledgerRows(gw.url)).map((row) => row.cost_usd), [0.0001234568, 0.0001234568]);
  const spent = 0.0002469136;
  t.equal((await call(gw.url, 'GET', '/v1/conversations/precise/spend', { authorization: `Bearer ${ALICE}` })).body.spent_usd, spent);
  const month = (await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN)).body as { spent_usd: number; remaining_usd: number | null };
  t.equal(month.spent_usd, spent);
  const plan = await admission(gw, ALICE, ask('gpt-4o'), conv);
  const budgets = (plan as unknown as { budgets: { conversation: { spent_usd: number; remaining_usd: number }; monthly: { spent_usd: number; remaining_usd: number } | null } }).budgets;
  t.equal(budgets.conversation.spent_usd, spent, 'admission shows the spend the spend view shows');
  t.equal(budgets.conversation.remaining_usd, 1 - spent);
  if (budgets.monthly) t.same(budgets.monthly, { ...budgets.monthly, spent_usd: month.spent_usd, remaining_usd: month.remaining_usd });
});

t.test('a provider figure no turn could cost (1e308) is no measurement: list price, and the month stays a number', async (t) => {
  const { gw } = await moneyWorld(t, { metered: { providerCost: 1e308, promptTokens: () => 1000, completionTokens: 8 } });
  const r = await chat(gw, ALICE, ask('gpt-4o'));
  t.equal(r.status, 200, 'the answer is passed on, not a 500');
  t.equal(r.headers.get('x-tollgate-cost-usd'), String(listUsd('gpt-4o', 1000, 0, 8)));
  const [row] = await ledgerRows(gw.url);
  t.equal(row.cost_usd, listUsd('gpt-4o', 1000, 0, 8));
  const spend = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.ok(Number.isFinite((spend.body as { spent_usd: number }).spent_usd), 'the month spent a finite amount');
  t.equal((await chat(gw, ALICE, ask('gpt-4o'))).status, 200, 'and the tenant can go on');
});

t.test('list price: uncached input, cached input at the cache-read price, output; the saving', async (t) => {
  const { gw } = await moneyWorld(t, { metered: { promptTokens: () => 1000, cachedTokens: 400, completionTokens: 8 } });
  const r = await chat(gw, ALICE, ask('gpt-4o'), { 'x-tollgate-conversation': 'listed' });
  t.equal(r.status, 200);
  // 600 × $100/M + 400 × $10/M + 8 × $400/M = 0.06 + 0.004 + 0.0032
  const expected = listUsd('gpt-4o', 1000, 400, 8);
  t.equal(expected, 0.0672);
  t.equal(r.headers.get('x-tollgate-cost-usd'), '0.0672');
  const spend = await call(gw.url, 'GET', '/v1/conversations/listed/spend', { authorization: `Bearer ${ALICE}` });
  // 400 cached tokens × ($100 − $10)/M
  t.equal(spend.body.spent_usd, 0.0672);
  t.equal(spend.body.saved_usd, 0.036);

  // The same figure in a stream's closing comment.
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { authorization: `Bearer ${ALICE}`, 'content-type': 'application/json' },
    body: JSON.stringify(ask('gpt-4o', { stream: true })),
  });
  const text = await res.text();
  const trailer = /^: tollgate (\{.*\})$/m.exec(text);
  t.ok(trailer, 'the settled figures come in a last SSE comment');
  t.equal((JSON.parse(trailer![1]) as { cost_usd: number }).cost_usd, 0.0672);
});

t.test('local costs 0; a plan spends no money; an unpriced metered turn has no cost at all', async (t) => {
  const { gw, other, metered } = await moneyWorld(t, { prices: { unpriced: 'allow' } });
  // 1. This machine: free, said as 0.
  const local = await chat(gw, ALICE, ask('llama-local'), { 'x-tollgate-conversation': 'c-local' });
  t.equal(local.status, 200);
  t.equal(local.headers.get('x-tollgate-cost-usd'), '0');
  t.equal(other.requests.length, 1);

  // 2. A plan with no known list price: no money spent, counted as a plan turn (ADR 0006: a plan
  //    turn's cost is 0; its list-price "of work" is what is unknown).
  const plan = await chat(gw, ALICE, ask('plan-model'), { 'x-tollgate-conversation': 'c-plan' });
  t.equal(plan.status, 200);
  t.equal(plan.headers.get('x-tollgate-cost-usd'), '0', 'a plan turn spends no money, priced or not: the header says 0, as the ledger does');
  const planSpend = await call(gw.url, 'GET', '/v1/conversations/c-plan/spend', { authorization: `Bearer ${ALICE}` });
  t.match(planSpend.body, { spent_usd: 0, plan_turns: 1, turns: 1 });

  // 3. A metered model nobody priced (allowed by the operator, no limit applies): unknown, so the
  //    header is absent and the ledger says null — not $0.
  const unpriced = await chat(gw, ALICE, ask('gpt-unpriced-x'), { 'x-tollgate-conversation': 'c-unpriced' });
  t.equal(unpriced.status, 200);
  t.equal(unpriced.headers.get('x-tollgate-cost-usd'), null);
  t.equal(metered.requests.length, 1);

  const rows = await ledgerRows(gw.url);
  const byModel = Object.fromEntries(rows.map((r) => [r.model, r]));
  t.match(byModel['llama-local'], { cost_usd: 0, billing: 'local' });
  t.match(byModel['plan-model'], { cost_usd: 0, billing: 'plan' });
  t.match(byModel['gpt-unpriced-x'], { cost_usd: null, billing: 'metered' });
  // 4. The month counts money only: nothing of the three was money.
  const month = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.equal(month.body.spent_usd, 0);
  // 5. /v1/admission says the same before the turn: the worst a local or plan turn can spend is $0
  //    (regression: null, "unknown"), and a metered model nobody priced is unknown.
  t.equal((await admission(gw, ALICE, ask('llama-local'))).cost_usd.worst_case, 0);
  t.equal((await admission(gw, ALICE, ask('plan-model'))).cost_usd.worst_case, 0);
  t.equal((await admission(gw, ALICE, ask('gpt-unpriced-x'))).cost_usd.worst_case, null);
});
