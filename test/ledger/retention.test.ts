// Retention (DELETE /admin/ledger?until=): the rows of finished requests before a time go, in
// batches; open reservations stay; spend, budgets, caps and conversations keep their own counters
// and do not move.
import t from 'tap';
import { collect, conversationHead, reservation, settlement, storeFactories } from '../helpers/stores.js';
import type { HistoryTable, Ledger } from '../../metering/ledger.js';
import { startGateway } from '../helpers/gateway.js';

const DAY = 86_400_000;
const T0 = Date.UTC(2026, 10, 1);

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: finished rows before the time go, oldest first, at most a batch a call; open ones stay`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 10 });
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

// An outside audit: retention cut on the time a request began, the settled export on the time it
// finished. A billing job that read a window by=settled and then deleted up to its end lost a
// turn admitted before midnight and settled after it, never exported.
for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: rows go by when they finished, as the settled export reads them`, async (t) => {
    const { ledger } = await factory.create(t);
    const midnight = T0 + DAY;
    const early = reservation({ conversation: 'c-mid', run: 'c-mid/r', time: midnight - 60_000, month: '2026-11' });
    const across = reservation({ conversation: 'c-mid', run: 'c-mid/r', time: midnight - 1_000, month: '2026-11' });
    for (const r of [early, across]) t.equal((await ledger.admit(r)).ok, true);
    await ledger.settle(early.id, settlement(early, 1, { finishedAt: midnight - 59_000 }));
    await ledger.settle(across.id, settlement(across, 1, { finishedAt: midnight + 500 }));
    const read = (since: number, until: number) => collect(ledger.exportRows(since, until, 'settled')).then((rows) => rows.map((r) => r.id));
    t.same(await read(T0, midnight), [early.id], "the day's window by=settled");
    t.equal(await ledger.pruneRows(midnight, 100), 1, 'deleted up to its end: what it read');
    t.same(await read(midnight, midnight + DAY), [across.id], "the next day's window still has the turn that finished in it");
  });
}

/** Walks a table as the route does, two keys a call (so the cursor is used), and says how many went. */
async function pruneAll(ledger: Ledger, table: HistoryTable, until: number): Promise<number> {
  let deleted = 0;
  for (let after: string | null = ''; after !== null; ) {
    const batch = await ledger.pruneHistory(table, until, after, 2);
    deleted += batch.deleted;
    after = batch.next;
  }
  return deleted;
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: heads and runs before the time go; a capped or nested conversation's head and an open run stay`, async (t) => {
    const { ledger } = await factory.create(t);
    const turn = async (conversation: string, time: number, opts: { parent?: string; open?: boolean } = {}) => {
      const r = reservation({ conversation, run: `${conversation}/run`, time, parent: opts.parent ?? null, month: '2026-11' });
      t.equal((await ledger.admit(r)).ok, true);
      if (!opts.open) await ledger.settle(r.id, settlement(r, 1), conversationHead({ conversation, time, chain: [`h-${conversation}`] }));
    };
    await turn('old', T0);
    await turn('recent', T0 + 10 * DAY);
    await ledger.setConversationCap('capped', null, 5);
    await turn('capped', T0);
    await turn('top', T0);
    await turn('child', T0, { parent: 'top' });
    await turn('open', T0, { open: true });
    // A run started before the time and still going: its conversation had a request after it.
    const going = reservation({ conversation: 'going', run: 'going/run', time: T0, month: '2026-11' });
    t.equal((await ledger.admit(going)).ok, true);
    await ledger.settle(going.id, settlement(going, 1), conversationHead({ conversation: 'going', time: T0 + 9 * DAY, chain: ['h-going'] }));

    t.equal(await pruneAll(ledger, 'heads', T0 + 5 * DAY), 2, 'the heads of "old" and "top"');
    for (const [conversation, kept] of [['old', false], ['top', false], ['recent', true], ['capped', true], ['child', true]] as const) {
      t.equal((await ledger.getHead(conversation)) !== null, kept, `${conversation}: head ${kept ? 'kept' : 'gone'}`);
    }
    t.equal(await pruneAll(ledger, 'runs', T0 + 5 * DAY), 4, 'the finished runs started before the time');
    for (const [conversation, kept] of [['old', false], ['capped', false], ['open', true], ['recent', true], ['going', true]] as const) {
      t.equal((await ledger.getRun(`${conversation}/run`)) !== null, kept, `${conversation}: run ${kept ? 'kept' : 'gone'}`);
    }
    t.match(await ledger.conversationSpend('capped'), { capUsd: 5 }, 'conversations themselves stay');
    t.equal(await pruneAll(ledger, 'heads', T0 + 5 * DAY), 0, 'nothing more');
    // Where each request's list ended goes by the same rule: a capped or nested conversation is
    // still found by a request that continues it, or its cap would no longer hold.
    t.equal(await pruneAll(ledger, 'chain_ends', T0 + 5 * DAY), 2, 'the chain ends of "old" and "top"');
    for (const [conversation, kept] of [['old', false], ['top', false], ['recent', true], ['capped', true], ['child', true], ['going', true]] as const) {
      const found = await ledger.findConversationByChain('key-1', 'acme', [`h-${conversation}`, 'next']);
      t.equal(found === conversation, kept, `${conversation}: ${kept ? 'still found' : 'no longer found'}`);
    }
    t.equal(await pruneAll(ledger, 'chain_ends', T0 + 5 * DAY), 0, 'nothing more');
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
  // Each finished a second after it began (settlement()): three finished before the cut.
  const res = await del(`?until=${T0 + 1003}`);
  t.equal(res.status, 200);
  t.same(await res.json(), { deleted: 3, heads_deleted: 0, runs_deleted: 1, until: new Date(T0 + 1003).toISOString() }, 'the run the rows were in');
  t.equal((await collect(gw.ledger.exportRows(null, null))).length, 2);
});

// An outside audit: `?until=2099-01-01&tenant=nobody` deleted every tenant's rows (the filter that
// is not one was ignored, and a time to come deletes everything).
t.test('DELETE /admin/ledger refuses a query parameter it does not take, and a time to come; nothing is deleted', async (t) => {
  const gw = await startGateway(t, { upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['*'] }] });
  for (let i = 0; i < 3; i++) {
    const r = reservation({ tenant: 'local', time: T0 + i });
    await gw.ledger.admit(r);
    await gw.ledger.settle(r.id, settlement(r, 1));
  }
  const call = (method: string, query: string) => fetch(`${gw.url}/admin/ledger${query}`, { method, headers: { authorization: 'Bearer admin-secret' } });
  const filtered = await call('DELETE', `?until=${T0 + 2}&tenant=nobody`);
  t.equal(filtered.status, 400);
  t.match(await filtered.json(), { error: { code: 'invalid_request', param: 'tenant', message: 'tenant: unknown query parameter (this route takes until); nothing was done' } });
  const future = await call('DELETE', '?until=2099-01-01');
  t.equal(future.status, 400);
  t.match(await future.json(), { error: { param: 'until', message: /^until: 2099-01-01T00:00:00\.000Z is later than now \(.*\): give a time up to now; nothing was deleted$/ } });
  t.equal((await collect(gw.ledger.exportRows(null, null))).length, 3, 'every row is still there');
  // The export: a filter it does not take, and a window that ends before it starts, are 400s too.
  const exportFiltered = await call('GET', '?tenant=nobody');
  t.equal(exportFiltered.status, 400);
  t.match(await exportFiltered.json(), { error: { param: 'tenant' } });
  const backwards = await call('GET', `?since=${T0 + 2}&until=${T0}`);
  t.equal(backwards.status, 400);
  t.match(await backwards.json(), { error: { param: 'since' } });
  const spend = await fetch(`${gw.url}/admin/tenants/local/spend?mnth=2026-11`, { headers: { authorization: 'Bearer admin-secret' } });
  t.equal(spend.status, 400);
  t.match(await spend.json(), { error: { param: 'mnth' } });
});

t.test('DELETE /admin/ledger keeps heads and runs younger than a day, whatever `until` says', async (t) => {
  const gw = await startGateway(t, { upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['*'] }] }, { clock: true });
  const now = gw.now.ms;
  for (const [conversation, age] of [['paused', 3_600_000], ['idle', 2 * DAY]] as const) {
    const r = reservation({ tenant: 'local', conversation, run: `${conversation}/run`, time: now - age });
    await gw.ledger.admit(r);
    await gw.ledger.settle(r.id, settlement(r, 1), conversationHead({ conversation, tenant: 'local', time: now - age, chain: [`h-${conversation}`] }));
  }
  const res = await fetch(`${gw.url}/admin/ledger?until=${now}`, { method: 'DELETE', headers: { authorization: 'Bearer admin-secret' } });
  t.same(await res.json(), { deleted: 2, heads_deleted: 1, runs_deleted: 1, until: new Date(now).toISOString() });
  t.not(await gw.ledger.getHead('paused'), null, 'a conversation paused for an hour keeps its shared prefix');
  t.not(await gw.ledger.getRun('paused/run'), null, 'and its run its budget');
  t.equal(await gw.ledger.getHead('idle'), null);
});
