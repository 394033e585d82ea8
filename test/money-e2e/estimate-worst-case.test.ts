// A model no tokenizer here knows is counted by the labelled byte estimate (UTF-8 bytes ÷ 4), which
// is no bound: its real prompt may hold up to one token per byte. Money admission reserves the worst
// case (SPEC §7), so for such a model it takes the prompt at one token per byte — four times the
// estimate — and a cap or budget still holds when the provider's count turns out far higher.

import t, { type Test } from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway } from '../helpers/gateway.js';
import { ADMIN, admission, call, chat, close } from './money-fixture.js';

const KEY = 'tg-estimate';
const ask = { model: 'acme-chat', messages: [{ role: 'user', content: 'Summarise the incident report for the on-call channel' }], max_tokens: 20 };

async function world(t: Test, promptTokens?: () => number) {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-estimate-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const prices = join(dir, 'prices.json');
  // $10 per million input tokens, $20 per million output tokens.
  writeFileSync(prices, JSON.stringify({ models: { 'acme-chat': { input_mtok: 10, output_mtok: 20, date: '2026-11-01' } } }));
  const upstream = await startOpenAiDouble({ completionTokens: 20, promptTokens });
  t.teardown(upstream.close);
  const gw = await startGateway(t, {
    upstreams: [{ name: 'acme', kind: 'openai', baseUrl: `${upstream.url}/v1`, models: ['acme-*'], billing: 'metered', contextWindow: 100_000 }],
    auth: { keys: [{ key: KEY, tenant: 'est' }] },
    prices: { overrides: prices },
  });
  return { gw, upstream };
}

t.test('the worst case of an estimated prompt is one token per byte', async (t) => {
  const { gw } = await world(t);
  const plan = await admission(gw, KEY, ask);
  t.match(plan, { count_method: 'estimate:bytes' });
  const expected = (plan.sum_tokens * 4 * 10 + 20 * 20) / 1e6;
  t.ok(close(plan.cost_usd.worst_case!, expected), `${plan.cost_usd.worst_case} = ${expected}`);
  // The price it used, with its source and date (SPEC §7).
  t.match(plan.cost_usd.price, { model: 'acme-chat', input_mtok: 10, output_mtok: 20, cache_read_mtok: null, source: /^override:.*prices\.json$/, date: '2026-11-01' });
});

t.test('a monthly budget holds when the provider counts one token per byte', async (t) => {
  const probe = await world(t);
  const plan = await admission(probe.gw, KEY, ask);
  // The provider's real count: four times the estimate (every byte a token).
  const { gw, upstream } = await world(t, () => plan.sum_tokens * 4);
  const worst = plan.cost_usd.worst_case!;
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/est/budget', ADMIN, { monthly_budget_usd: worst * 1.5 })).status, 200);

  const first = await chat(gw, KEY, ask, { 'x-tollgate-conversation': 'one' });
  t.equal(first.status, 200);
  const second = await chat(gw, KEY, ask, { 'x-tollgate-conversation': 'two' });
  t.equal(second.status, 402, 'the second would cross the budget at its real cost');
  t.equal(upstream.requests.length, 1);
  const month = await call(gw.url, 'GET', '/admin/tenants/est/spend', ADMIN);
  t.ok((month.body.spent_usd as number) <= worst * 1.5, `spent ${month.body.spent_usd} within ${worst * 1.5}`);
});

t.test('max_affordable_allowance prices the prompt as admission does: the largest it names is admitted, one more is not', async (t) => {
  const { gw, upstream } = await world(t);
  // A budget that leaves room for a few hundred output tokens past the worst-case prompt.
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/est/budget', ADMIN, { monthly_budget_usd: 0.01 })).status, 200);
  const plan = await admission(gw, KEY, ask);
  const most = plan.max_affordable_allowance!;
  t.ok(most > 20 && most < 10_000, `max_affordable_allowance ${most}`);
  const over = await admission(gw, KEY, { ...ask, max_tokens: most + 1 });
  t.equal(over.verdict.status, 402, 'one token more is refused');
  const real = await chat(gw, KEY, { ...ask, max_tokens: most }, { 'x-tollgate-conversation': 'most' });
  t.equal(real.status, 200, 'the allowance admission named is admitted');
  t.equal(upstream.requests.length, 1);
});

t.test("a prediction for such a model is held at one token per byte too (regression: bytes ÷ 4)", async (t) => {
  const { gw } = await world(t);
  const code = '変数の名前を変えてください。'.repeat(200);
  const plain = await admission(gw, KEY, ask);
  const predicted = await admission(gw, KEY, { ...ask, prediction: { type: 'content', content: code } });
  t.ok(close(predicted.cost_usd.worst_case! - plain.cost_usd.worst_case!, (Buffer.byteLength(code) * 20) / 1e6), `${Buffer.byteLength(code)} bytes at $20/M output`);
});
