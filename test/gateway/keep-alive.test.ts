// Where replicas share a store, each one sweeps reservations left open by a replica that went away
// and keeps its own in-flight ones alive (ADR 0011): a stream that runs longer than the stale
// threshold is never taken for a crash, while a dead replica's reservation still is. Run here on
// the SQLite store with the sweep switched on and a test clock; PostgreSQL applies the same rule
// on the database's clock instead (test/ledger/recovery.test.ts runs it on both).

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';

const tick = () => new Promise((r) => setTimeout(r, 10));

async function rows(gw: { ledger: { exportRows(a: null, b: null): AsyncIterable<LedgerRow> } }): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const r of gw.ledger.exportRows(null, null)) out.push(r);
  return out;
}

t.test('a stream longer than the stale threshold is kept alive; a dead replica\'s reservation is recovered', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 20, stallAfterChunks: 3 });
  t.teardown(upstream.close);
  const STALE = 10 * 60_000;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { clock: true, store: 'sqlite', staleReservationMs: STALE, sweepIntervalMs: 20 });

  // 1. A stream starts and stalls after three tokens: its reservation stays open.
  const abort = new AbortController();
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', stream: true, max_tokens: 20, messages: [{ role: 'user', content: 'a long one' }] }),
    signal: abort.signal,
  });
  t.equal(res.status, 200);
  const [live] = await rows(gw);
  t.equal(live?.state, 'reserved');

  // 2. A reservation some other replica made and never settled (it went away), at the same time.
  const dead = { ...live!, id: 'req-dead-replica' };
  t.same(
    await gw.ledger.admit({
      id: dead.id, time: gw.now.ms, tenant: dead.tenant, keyId: null, conversation: 'conv-elsewhere', parent: null, run: 'run-elsewhere', model: 'gpt-4o',
      upstream: 'openai', endpoint: '/v1/chat/completions', mode: 'normal', finalReason: null, rows: 1, promptTokens: 10, countMethod: 'tiktoken:o200k_base',
      sharedPrefixTokens: 0, promptCharge: 10, allowance: 20, runBudgetTokens: 65536, worstCaseUsd: null, month: '2026-11',
    }),
    { ok: true },
  );

  // 3. Time passes past the threshold, minute by minute, as a long stream's would: the sweep runs.
  for (let minute = 1; minute <= 12; minute++) {
    gw.now.ms += 60_000;
    await new Promise((r) => setTimeout(r, 60)); // a few sweeps of the test interval
  }
  let byId = new Map((await rows(gw)).map((r) => [r.id, r]));
  while (byId.get(dead.id)?.state !== 'recovered') {
    await tick();
    byId = new Map((await rows(gw)).map((r) => [r.id, r]));
  }
  t.equal(byId.get(dead.id)?.state, 'recovered', "the dead replica's reservation is charged in full");
  t.equal(byId.get(live!.id)?.state, 'reserved', 'the stream still in flight is left alone');

  // 4. The stream ends (the client leaves): settled for what it streamed, not recovered.
  abort.abort();
  await res.body?.cancel().catch(() => {});
  for (;;) {
    const row = (await rows(gw)).find((r) => r.id === live!.id);
    if (row?.state !== 'reserved') {
      t.equal(row?.state, 'settled');
      t.equal(row?.status, 499);
      t.equal(row?.generated_tokens, 3);
      break;
    }
    await tick();
  }
  t.equal(gw.app.gateway.inFlight.size, 0, 'nothing left in flight');
});
