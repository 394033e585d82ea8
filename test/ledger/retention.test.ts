// Retention (DELETE /admin/ledger?until=): the rows of finished requests before a time go, in
// batches; open reservations stay; spend, budgets, caps and conversations keep their own counters
// and do not move.
import t from 'tap';
import { collect, reservation, settlement, storeFactories } from '../helpers/stores.js';
import { startGateway } from '../helpers/gateway.js';

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 10, 1);

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: finished rows before the time go, oldest first, at most a batch a call; open ones stay`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.upsertTenant({ id: 'acme', monthlyBudgetUsd: 10 });
    const ids: string[] = [];
    for (let day = 0; day < 5; day++) {
      const r = reservation({ tenant: 'acme', conversation: 'c-ret', run: 'c-ret/run', time: T0 + day * DAY, worstCaseUsd: 0.5, month: '2026-11' });
      t.equal((await ledger.admit(r)).ok, true);
      if (day !== 1) await ledger.settle(r.id, settlement(r, 1, { costUsd: 0.1 }));
      ids.push(r.id);
    }
    const before = await ledger.tenantMonth('acme', '2026-11');
    const spendBefore = await ledger.conversationSpend('c-ret');

    t.equal(await ledger.pruneRows(T0 + 3 * DAY, 1), 1, 'a batch at most');
    t.equal(await ledger.pruneRows(T0 + 3 * DAY, 100), 1, 'the rest before the time, the open one kept');
    t.equal(await ledger.pruneRows(T0 + 3 * DAY, 100), 0);
    const left = await collect(ledger.exportRows(null, null));
    t.same(left.map((r) => r.id), [ids[1], ids[3], ids[4]], 'day 1 (open) and days 3–4 (after the time) are kept');
    t.equal(left[0]!.state, 'reserved');

    t.same(await ledger.tenantMonth('acme', '2026-11'), before, "the month's spend and reservations are unchanged");
    t.same(await ledger.conversationSpend('c-ret'), spendBefore, "the conversation's spend is unchanged");
  });
}

t.test('DELETE /admin/ledger?until= needs the admin token and the time, and says how many went', async (t) => {
  const gw = await startGateway(t, { upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['*'] }] });
  for (let i = 0; i < 5; i++) {
    const r = reservation({ tenant: 'local', time: T0 + i });
    await gw.ledger.admit(r);
    await gw.ledger.settle(r.id, settlement(r, 1));
  }
  const del = (query: string, auth = 'Bearer admin-secret') => fetch(`${gw.url}/admin/ledger${query}`, { method: 'DELETE', headers: { authorization: auth } });
  t.equal((await del('?until=2026-11-02', 'Bearer tg-client')).status, 401);
  const missing = await del('');
  t.equal(missing.status, 400);
  t.match(await missing.json(), { error: { code: 'invalid_request', param: 'until' } });
  t.equal((await del('?until=yesterday')).status, 400);
  const res = await del(`?until=${T0 + 3}`);
  t.equal(res.status, 200);
  t.same(await res.json(), { deleted: 3, until: new Date(T0 + 3).toISOString() });
  t.equal((await collect(gw.ledger.exportRows(null, null))).length, 2);
});
