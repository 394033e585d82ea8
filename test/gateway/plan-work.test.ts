// A plan (subscription) turn spends no money, and its work is shown at list price "of work"
// (SPEC §7): in the conversation's spend, never in its money.

import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

t.test('plan turns: $0 spent, list-price work recorded', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-plan-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const prices = join(dir, 'prices.json');
  writeFileSync(prices, JSON.stringify({ models: { 'gpt-4o-mini': { input_mtok: 1, output_mtok: 4, source: 'test', date: '2026-11-01' } } }));
  const upstream = await startOpenAiDouble({ completionTokens: 250, promptTokens: () => 1000 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'plan' })], prices: { overrides: prices } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-plan' },
    body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 300, messages: [{ role: 'user', content: 'Summarise.' }] }),
  });
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-cost-usd'), '0', 'no money spent');
  const spend = (await (await fetch(`${gw.url}/v1/conversations/c-plan/spend`)).json()) as Record<string, number>;
  t.equal(spend.spent_usd, 0);
  t.equal(spend.plan_turns, 1);
  // 1000 input × $1/M + 250 output × $4/M = $0.002 of work
  t.ok(Math.abs(spend.plan_work_usd - 0.002) < 1e-9, `plan work ${spend.plan_work_usd}`);
});
