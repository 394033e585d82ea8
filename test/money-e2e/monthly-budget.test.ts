// The tenant's monthly budget (SPEC §6, §7): admission reserves each request's worst case
// atomically, so no burst of concurrent requests spends past it; at 80 % the response that crossed
// it says `x-tollgate-notice: budget-near`, once per tenant per month.

import t from 'tap';
import { ADMIN, ALICE, admission, call, chat, close, costHeader, moneyWorld, type ErrorBody } from './money-fixture.js';

t.test('200 concurrent requests never overspend the monthly budget', async (t) => {
  // The provider reports exactly what was reserved (whole prompt, whole allowance), so each
  // admitted request settles at its worst case and the count admitted is known in advance.
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 10 } });
  const body = { model: 'gpt-4o', messages: [{ role: 'user', content: 'Summarise the quarterly report' }], max_tokens: 10 };
  const plan = await admission(gw, ALICE, body, { 'x-tollgate-conversation': 'burst-0' });
  metered.options.promptTokens = () => plan.sum_tokens;
  const worst = plan.cost_usd.worst_case!;

  // 1. Room for 100.5 requests, set through the operator API.
  const budget = Math.round(worst * 100.5 * 1e8) / 1e8;
  const put = await call(gw.url, 'PUT', '/admin/tenants/alice/budget', ADMIN, { monthly_budget_usd: budget });
  t.equal(put.status, 200);

  // 2. 200 at once, each its own conversation.
  const replies = await Promise.all(
    Array.from({ length: 200 }, (_, i) => chat(gw, ALICE, body, { 'x-tollgate-conversation': `burst-${i}` })),
  );
  const ok = replies.filter((r) => r.status === 200);
  const refused = replies.filter((r) => r.status === 402);
  t.equal(ok.length, 100, 'exactly the affordable requests were admitted');
  t.equal(refused.length, 100);
  t.equal(metered.requests.length, 100, 'and only they reached the provider');

  // 3. What was settled adds up to no more than the budget, in the responses and in the ledger.
  const settled = ok.reduce((sum, r) => sum + (costHeader(r) ?? Number.NaN), 0);
  t.ok(close(settled, 100 * worst), `settled ${settled}`);
  t.ok(settled <= budget + 1e-9, `settled ${settled} ≤ budget ${budget}`);
  const month = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.ok(close(month.body.spent_usd as number, settled));
  t.ok(close(month.body.reserved_usd as number, 0), 'nothing left reserved');

  // 4. Each refusal is the monthly one, with its figures and no metered choice (the money is gone).
  const errors = refused.map((r) => (r.body as unknown as ErrorBody).error);
  t.same([...new Set(errors.map((e) => e.code))], ['monthly_budget_reached']);
  t.ok(refused.every((r) => r.headers.get('x-should-retry') === 'false'));
  t.ok(errors.every((e) => e.limit_usd === budget && e.spent_usd! + e.reserved_usd! + e.needed_usd! > budget + 1e-9));
  const choices = errors[0].choices!;
  t.same(choices.cheaper_models.map((m) => m.model), ['llama-local', 'plan-model']);
  // Half again the budget, rounded up to a figure a person would pick.
  t.ok(choices.raise_to_usd >= 1.5 * budget);
});

t.test('budget-near on the response that crosses 80 %, once a month', async (t) => {
  // $0.20 a turn (the provider's figure) against a $1 budget set in the key's configuration.
  const { gw } = await moneyWorld(t, {
    clock: true,
    keys: [{ key: ALICE, tenant: 'alice', monthlyBudgetUsd: 1 }],
    metered: { providerCost: 0.2, promptTokens: () => 10, completionTokens: 1 },
  });
  const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Next item' }], max_tokens: 5 };
  const notices = async (n: number) => {
    const seen: Array<string | null> = [];
    for (let i = 0; i < n; i++) {
      const r = await chat(gw, ALICE, body);
      t.equal(r.status, 200);
      seen.push(r.headers.get('x-tollgate-notice'));
    }
    return seen;
  };

  // 1. November: $0.20, $0.40, $0.60, then $0.80 crosses 80 %; $1.00 says nothing more.
  t.same(await notices(5), [null, null, null, 'budget-near', null]);
  const full = await chat(gw, ALICE, body);
  t.equal(full.status, 402);
  t.equal((full.body as unknown as ErrorBody).error.code, 'monthly_budget_reached');

  // 2. December: the month starts again, and so does the notice — once.
  gw.now.ms = Date.parse('2026-12-01T00:00:05Z');
  t.same(await notices(5), [null, null, null, 'budget-near', null]);
  const dec = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.equal(dec.body.month, '2026-12');
  t.ok(close(dec.body.spent_usd as number, 1));
  const nov = await call(gw.url, 'GET', '/admin/tenants/alice/spend?month=2026-11', ADMIN);
  t.ok(close(nov.body.spent_usd as number, 1));
});

t.test('a turn admitted in one month and settled in the next says nothing of the month that ended', async (t) => {
  const { gw, metered } = await moneyWorld(t, {
    clock: true,
    keys: [{ key: ALICE, tenant: 'alice', monthlyBudgetUsd: 1 }],
    metered: { providerCost: 0.2, promptTokens: () => 10, completionTokens: 1, delayMs: 100 },
  });
  const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Next item' }], max_tokens: 5 };
  gw.now.ms = Date.parse('2026-11-30T23:59:50Z');
  for (let i = 0; i < 3; i++) t.equal((await chat(gw, ALICE, body)).headers.get('x-tollgate-notice'), null);
  // The fourth November turn ($0.80: 80 %), streamed, is still being answered at midnight.
  const crossing = chat(gw, ALICE, { ...body, stream: true });
  while (metered.requests.length < 4) await new Promise((resolve) => setTimeout(resolve, 5));
  gw.now.ms = Date.parse('2026-12-01T00:00:00.200Z');
  const late = await crossing;
  t.equal(late.status, 200);
  const closing = /^: tollgate (.*)$/m.exec(String(late.body.text));
  t.ok(closing, 'the stream has its closing comment');
  t.notMatch(closing?.[1] ?? '', /budget-near/, 'no notice for November, once it is over');
  const nov = await call(gw.url, 'GET', '/admin/tenants/alice/spend?month=2026-11', ADMIN);
  t.ok(close(nov.body.spent_usd as number, 0.8), 'the turn is November\'s spend');
  // December's own crossing is told, once.
  const seen: Array<string | null> = [];
  for (let i = 0; i < 5; i++) seen.push((await chat(gw, ALICE, body)).headers.get('x-tollgate-notice'));
  t.same(seen, [null, null, null, 'budget-near', null]);
});

t.test('budget-near at exactly 80 % when the spend adds up in float dust (regression)', async (t) => {
  // Eight $0.10 turns add up to 0.7999999999999999 in doubles, not 0.8: the notice was missed at
  // 80 % and came with the ninth turn, at 90 %.
  const { gw } = await moneyWorld(t, {
    keys: [{ key: ALICE, tenant: 'alice', monthlyBudgetUsd: 1 }],
    metered: { providerCost: 0.1, promptTokens: () => 10, completionTokens: 1 },
  });
  const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Next item' }], max_tokens: 5 };
  const seen: Array<string | null> = [];
  for (let i = 0; i < 9; i++) {
    const r = await chat(gw, ALICE, body);
    t.equal(r.status, 200);
    seen.push(r.headers.get('x-tollgate-notice'));
  }
  t.same(seen, [null, null, null, null, null, null, null, 'budget-near', null], 'the eighth turn, at 80 %, says it');
});

t.test("/v1/admission's money budgets: spent is what settled, remaining also takes off what is in flight", async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 10 } });
  const body = { model: 'gpt-4o', messages: [{ role: 'user', content: 'Summarise the quarterly report' }], max_tokens: 10 };
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/alice/budget', ADMIN, { monthly_budget_usd: 1 })).status, 200);
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/held/cap', ADMIN, { cap_usd: 1 })).status, 200);
  // 1. One turn settles.
  const first = await chat(gw, ALICE, body, { 'x-tollgate-conversation': 'held' });
  const spent = costHeader(first)!;
  // 2. Another is held in flight at the provider, with its worst case reserved.
  const plan = await admission(gw, ALICE, body, { 'x-tollgate-conversation': 'held' });
  const worst = plan.cost_usd.worst_case!;
  metered.options.hang = true;
  const leave = new AbortController();
  const inFlight = fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${ALICE}`, 'x-tollgate-conversation': 'held' },
    body: JSON.stringify(body),
    signal: leave.signal,
  }).catch(() => 'aborted');
  while (metered.requests.length < 2) await new Promise((r) => setTimeout(r, 20));
  const during = (await call(gw.url, 'POST', '/v1/admission', { authorization: `Bearer ${ALICE}`, 'x-tollgate-conversation': 'held' }, { endpoint: '/v1/chat/completions', request: body })).body;
  const budgets = during.budgets as Record<string, { spent_usd: number; remaining_usd: number }>;
  for (const scope of ['monthly', 'conversation']) {
    t.ok(close(budgets[scope]!.spent_usd, spent), `${scope}: spent ${budgets[scope]!.spent_usd} is the settled ${spent}`);
    t.ok(close(budgets[scope]!.remaining_usd, 1 - spent - worst), `${scope}: remaining ${budgets[scope]!.remaining_usd} takes off the reservation`);
  }
  leave.abort();
  t.equal(await inFlight, 'aborted');
});

t.test('a ledger that fails to claim the budget-near notice still lets the settled answer out, without the notice', async (t) => {
  const { gw } = await moneyWorld(t, {
    keys: [{ key: ALICE, tenant: 'alice', monthlyBudgetUsd: 1 }],
    metered: { providerCost: 0.9, promptTokens: () => 10, completionTokens: 1 },
  });
  gw.ledger.claimBudgetNearNotice = async () => {
    throw Object.assign(new Error('database is locked'), { name: 'SqliteError', code: 'SQLITE_BUSY' });
  };
  const r = await chat(gw, ALICE, { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'one item' }], max_tokens: 5 });
  t.equal(r.status, 200, 'the answer, not a 503 for a notice');
  t.equal(r.headers.get('x-tollgate-notice'), null);
  const month = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.ok(close(month.body.spent_usd as number, 0.9), 'settled');
});

// Regression: three $0.28 turns sum to a hair over $0.84 in floating point, and the figure came
// out one below the largest max_tokens the budget admits, where the room divides exactly.
t.test('max_affordable_allowance is exactly the largest max_tokens admitted, also where the room divides exactly', async (t) => {
  const { gw } = await moneyWorld(t, {
    metered: { providerCost: 0.28, completionTokens: 1 },
    keys: [{ key: ALICE, tenant: 'alice', monthlyBudgetUsd: 1, runs: { tokenBudget: null } }],
  });
  const turn = { model: 'gpt-4o', messages: [{ role: 'user', content: 'a turn' }], max_tokens: 1 };
  for (let i = 0; i < 3; i++) t.equal((await chat(gw, ALICE, turn)).status, 200);
  // gpt-4o: $100 in, $400 out per million. $0.16 left: with a prompt of 4k tokens, the room for
  // output is (1,600 − 4k) / 4 tokens, a whole number.
  let request: Record<string, unknown> | null = null;
  let prompt = 0;
  for (let words = 1; words < 40 && request === null; words++) {
    const candidate = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi '.repeat(words).trim() }], max_tokens: 8 };
    prompt = (await admission(gw, ALICE, candidate)).sum_tokens;
    if (prompt % 4 === 0) request = candidate;
  }
  t.ok(request, `a prompt of ${prompt} tokens`);
  const plan = await admission(gw, ALICE, request!);
  t.equal(plan.max_affordable_allowance, (1600 - prompt) / 4);
  const at = await admission(gw, ALICE, { ...request!, max_tokens: plan.max_affordable_allowance });
  t.same(at.verdict, { admit: true, status: 200, error: null }, 'admitted at the figure');
  const past = await admission(gw, ALICE, { ...request!, max_tokens: plan.max_affordable_allowance! + 1 });
  t.match(past.verdict, { admit: false, status: 402 }, 'refused one past it');
});
