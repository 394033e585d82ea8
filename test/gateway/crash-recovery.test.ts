// A gateway process killed with SIGKILL under load and started again: every admitted request has
// its ledger row, no reservation is left open, and the run invariant holds (SPEC §9).

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { processConfig, startGatewayProcess } from '../helpers/process.js';

t.test('SIGKILL under load, then restart', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 10, delayMs: 120 });
  t.teardown(upstream.close);
  const { configPath } = processConfig(t, upstream.url, 'tollgate-crash-');
  const first = await startGatewayProcess(configPath);
  let child = first.child;
  t.teardown(() => child.kill('SIGKILL'));
  const url = first.url;

  // 1. load: 60 requests, one conversation each, streamed slowly by the upstream
  const outcomes = Array.from({ length: 60 }, (_, i) =>
    fetch(`${url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': `crash-${i}` },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: `question ${i}` }] }),
    }).then(
      async (r) => ({ i, status: r.status, body: await r.text().catch(() => '') }),
      () => ({ i, status: 0, body: '' }),
    ),
  );
  // 2. kill it while requests are in flight
  while (upstream.requests.length < 20) await new Promise((r) => setTimeout(r, 5));
  child.kill('SIGKILL');
  const results = await Promise.all(outcomes);
  const answered = results.filter((r) => r.status === 200).map((r) => `crash-${r.i}`);
  t.ok(results.some((r) => r.status === 0), 'some requests were cut by the kill');

  // 3. restart on the same ledger file
  const second = await startGatewayProcess(configPath);
  child = second.child;
  const ledger = await (await fetch(`${second.url}/admin/ledger`, { headers: { authorization: 'Bearer admin-secret' } })).text();
  const rows = ledger.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, number | string | null>);
  const byConversation = new Map(rows.map((r) => [r.conversation, r]));
  for (const c of answered) t.ok(byConversation.has(c), `answered request ${c} has its ledger row`);
  t.equal(rows.filter((r) => r.state === 'reserved').length, 0, 'no reservation left open');
  t.ok(rows.length >= answered.length);
  for (const r of rows) {
    t.equal(r.reserved_tokens, (r.charge_tokens as number) + (r.refund_tokens as number), `row ${r.id}: reserved = charge + refund`);
    if (r.state === 'recovered') t.equal(r.refund_tokens, 0, 'a crashed request is charged in full');
  }
  child.kill('SIGTERM');
});
