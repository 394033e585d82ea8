// A crash between admission and settlement leaves reservations open; recovery settles the stale
// ones conservatively (charged in full, at the worst case) and flags them (SPEC §9, ADR 0005).
import t from 'tap';
import { collect, reservation, settlement, storeFactories } from '../helpers/stores.js';

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: stale reservations are charged in full and flagged`, async (t) => {
    const store = await factory.create(t);
    await store.ledger.setConversationCap('parent', 'acme', 10);
    const now = Date.UTC(2025, 5, 10, 13, 0, 0);
    // 1. Three requests: two left open by a "crash" long ago, one still in flight, one settled.
    const old1 = reservation({ run: 'rr', time: now - 600_000, worstCaseUsd: 0.5, conversation: 'child', parent: 'parent' });
    const old2 = reservation({ run: 'rr', time: now - 300_000, worstCaseUsd: null, allowance: 70 });
    const fresh = reservation({ run: 'rr', time: now - 1_000, worstCaseUsd: 0.25 });
    const done = reservation({ run: 'rr', time: now - 900_000, worstCaseUsd: 0.1 });
    for (const r of [old1, old2, fresh, done]) t.same(await store.ledger.admit(r), { ok: true });
    await store.ledger.settle(done.id, settlement(done, 50, { costUsd: 0.1 }));
    // Last said alive when they were made, by the clock the store judges staleness on.
    await store.saidAlive(old1.id, 600_000, now);
    await store.saidAlive(old2.id, 300_000, now);
    await store.ledger.close(); // the crash

    // 2. A restarted gateway recovers what is older than a minute.
    const ledger = await store.reopen();
    t.equal(await ledger.recoverStale(60_000, now), 2);
    t.equal(await ledger.recoverStale(60_000, now), 0, 'recovery is idempotent');
    const rows = await collect(ledger.exportRows(null, null));
    const byId = new Map(rows.map((r) => [r.id, r]));
    t.match(byId.get(old1.id), { state: 'recovered', charge_tokens: 150, refund_tokens: 0, generated_tokens: 50, cost_usd: 0.5, cost_source: 'worst-case' });
    t.match(byId.get(old2.id), { state: 'recovered', charge_tokens: 170, refund_tokens: 0, cost_usd: null });
    t.match(byId.get(fresh.id), { state: 'reserved', charge_tokens: null });
    // 3. Nothing vanished: the run keeps every charge; money moved from reserved to spent.
    t.equal((await ledger.getRun('rr'))?.usedTokens, 150 + 170 + 150 + 150);
    const month = await ledger.tenantMonth('acme', '2025-06');
    t.ok(Math.abs(month.spentUsd - 0.6) < 1e-9, 'worst case + the settled turn');
    t.ok(Math.abs(month.reservedUsd - 0.25) < 1e-9, 'only the fresh request is still reserved');
    const parent = await ledger.conversationSpend('parent');
    t.ok(Math.abs((parent?.tasksUsd ?? 0) - 0.5) < 1e-9, "the parent's reservation became tasks spend");
    // 4. A late settlement of a recovered row does not undo the recovery.
    await ledger.settle(old1.id, settlement(old1, 0, { costUsd: 0 }));
    t.equal((await ledger.getRun('rr'))?.usedTokens, 620);
    // 5. The in-flight one still settles normally.
    await ledger.settle(fresh.id, settlement(fresh, 0, { costUsd: 0 }));
    t.equal((await ledger.getRun('rr'))?.usedTokens, 570);
    t.same(await ledger.tenantMonth('acme', '2025-06'), { spentUsd: month.spentUsd, reservedUsd: 0, unpricedTurns: month.unpricedTurns });
  });
}

// An outside audit: a local or plan turn a crash left open was recovered as one of unknown cost
// (`cost_usd: null`, `billing: null`), and a plan turn was no plan turn in its conversation.
for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a local or plan turn left open is recovered at no cost, as what it was`, async (t) => {
    const store = await factory.create(t);
    const now = Date.UTC(2025, 5, 10, 13, 0, 0);
    const local = reservation({ run: 'rl', conversation: 'home', time: now - 600_000, billing: 'local' });
    const plan = reservation({ run: 'rp', conversation: 'sub', time: now - 600_000, billing: 'plan' });
    const metered = reservation({ run: 'rm', conversation: 'paid', time: now - 600_000, billing: 'metered', worstCaseUsd: 0.25 });
    const settledPlan = reservation({ run: 'rp', conversation: 'sub', time: now - 700_000, billing: 'plan' });
    for (const r of [local, plan, metered, settledPlan]) t.same(await store.ledger.admit(r), { ok: true });
    await store.ledger.settle(settledPlan.id, settlement(settledPlan, 20, { billing: 'plan', costUsd: 0, planWorkUsd: 0.0007 }));
    for (const r of [local, plan, metered]) await store.saidAlive(r.id, 600_000, now);
    await store.ledger.close(); // the crash
    const ledger = await store.reopen();
    t.equal(await ledger.recoverStale(60_000, now), 3);
    const byId = new Map((await collect(ledger.exportRows(null, null))).map((r) => [r.id, r]));
    t.match(byId.get(local.id), { state: 'recovered', cost_usd: 0, billing: 'local', cost_source: 'worst-case', charge_tokens: 150 });
    t.match(byId.get(plan.id), { state: 'recovered', cost_usd: 0, billing: 'plan', plan_work_usd: null });
    t.match(byId.get(metered.id), { state: 'recovered', cost_usd: 0.25, billing: 'metered' });
    t.match(byId.get(settledPlan.id), { state: 'settled', plan_work_usd: 0.0007 }, "a plan turn's work is in the export");
    t.match(await ledger.conversationSpend('sub'), { planTurns: 2, turns: 2, spentUsd: 0 });
    const month = await ledger.tenantMonth('acme', '2025-06');
    t.ok(Math.abs(month.spentUsd - 0.25) < 1e-9, `only the metered turn spent money: ${month.spentUsd}`);
  });
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a reservation said alive recently is not stale, however old it is`, async (t) => {
    const store = await factory.create(t);
    const { ledger } = store;
    const now = Date.UTC(2025, 5, 10, 13, 0, 0);
    const long = reservation({ run: 'ka', time: now - 30 * 60_000 }); // a stream running for 30 minutes
    const dead = reservation({ run: 'ka', time: now - 30 * 60_000 }); // its replica went away
    const quiet = reservation({ run: 'ka', time: now - 30 * 60_000 }); // kept alive, then no more
    for (const r of [long, dead, quiet]) t.same(await ledger.admit(r), { ok: true });
    // Made 30 minutes ago by the store's clock; the quiet one said alive 20 minutes ago, last.
    for (const r of [long, dead, quiet]) await store.saidAlive(r.id, 30 * 60_000, now);
    await store.saidAlive(quiet.id, 20 * 60_000, now);
    // The long one's replica says it alive (a minute ago by the test's clock; on PostgreSQL, now).
    await ledger.keepAlive([long.id, 'no-such-request'], now - 60_000);
    t.equal(await ledger.recoverStale(10 * 60_000, now), 2, 'the dead one and the one not heard of for 20 minutes');
    const rows = new Map((await collect(ledger.exportRows(null, null))).map((r) => [r.id, r]));
    t.equal(rows.get(long.id)?.state, 'reserved', 'alive a minute ago: left alone');
    t.equal(rows.get(dead.id)?.state, 'recovered');
    t.equal(rows.get(quiet.id)?.state, 'recovered');
    // Keeping a settled row alive changes nothing; it settles normally.
    await ledger.settle(long.id, settlement(long, 10));
    await ledger.keepAlive([long.id], now);
    t.equal(await ledger.recoverStale(0, now + 1), 0);
    t.match((await collect(ledger.exportRows(null, null))).find((r) => r.id === long.id), { state: 'settled', generated_tokens: 10 });
  });
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: recoverOpen settles every open reservation, even one stamped after its clock`, async (t) => {
    const { ledger } = await factory.create(t);
    const now = Date.UTC(2025, 5, 10, 13, 0, 0);
    // 1. Open rows on both sides of the clock (a restart with the clock set back), one settled.
    const before = reservation({ run: 'ro', time: now - 60_000, worstCaseUsd: 0.25 });
    const after = reservation({ run: 'ro', time: now + 20_000, worstCaseUsd: 0.5 });
    const done = reservation({ run: 'ro', time: now - 90_000 });
    for (const r of [before, after, done]) t.same(await ledger.admit(r), { ok: true });
    await ledger.keepAlive([after.id], now + 30_000);
    await ledger.settle(done.id, settlement(done, 10));
    // 2. Every open one is recovered, whatever its time or last sign of life; once.
    t.equal(await ledger.recoverOpen(now), 2);
    t.equal(await ledger.recoverOpen(now), 0, 'recovery is idempotent');
    const rows = new Map((await collect(ledger.exportRows(null, null))).map((r) => [r.id, r]));
    t.match(rows.get(before.id), { state: 'recovered', refund_tokens: 0, cost_usd: 0.25 });
    t.match(rows.get(after.id), { state: 'recovered', refund_tokens: 0, cost_usd: 0.5 });
    t.match(rows.get(done.id), { state: 'settled', generated_tokens: 10 });
    // `done` settled at the helper's cost, null: a turn of unknown cost.
    t.same(await ledger.tenantMonth('acme', '2025-06'), { spentUsd: 0.75, reservedUsd: 0, unpricedTurns: 1 });
    // 3. Each finishes at the recovery, or at its own time when that is later: never before it began.
    t.equal(rows.get(before.id)?.finished_at, new Date(now).toISOString());
    t.equal(rows.get(after.id)?.finished_at, new Date(after.time).toISOString(), 'not before its own time');
  });
}

// PostgreSQL: replicas' clocks differ, so staleness is judged on the database's clock alone
// (ADR 0011). A replica 11 minutes ahead took another's live stream for a crash and charged it
// the worst case; the real settlement was then dropped.
for (const factory of storeFactories(t).filter((f) => f.kind === 'postgres')) {
  t.test(`${factory.kind}: no replica's clock makes a live reservation stale`, async (t) => {
    const { ledger } = await factory.create(t);
    const skew = 11 * 60_000;
    // 1. Replica B's clock runs 11 minutes behind the database's; it admits two requests.
    const kept = reservation({ run: 'skew', time: Date.now() - skew }); // a stream B keeps alive
    const fresh = reservation({ run: 'skew', time: Date.now() - skew }); // before B's next keep-alive
    for (const r of [kept, fresh]) t.same(await ledger.admit(r), { ok: true });
    await ledger.keepAlive([kept.id], Date.now() - skew);
    // 2. Replica A, 11 minutes ahead, sweeps with the 10-minute threshold: to its clock both look
    //    22 minutes old. A replica with the right clock sweeps too: to it they look 11.
    t.equal(await ledger.recoverStale(10 * 60_000, Date.now() + skew), 0, 'a replica ahead recovers nothing');
    t.equal(await ledger.recoverStale(10 * 60_000, Date.now()), 0, 'nor does one on time, for a row stamped by a clock behind');
    const rows = await collect(ledger.exportRows(null, null));
    t.same(rows.map((r) => r.state), ['reserved', 'reserved']);
    // 3. B's stream ends and settles with its real figures.
    await ledger.settle(kept.id, settlement(kept, 7));
    t.match((await collect(ledger.exportRows(null, null))).find((r) => r.id === kept.id), { state: 'settled', generated_tokens: 7 });
  });

  t.test(`${factory.kind}: a reservation silent for the threshold by the database's clock is recovered, whatever the sweeper's clock`, async (t) => {
    const store = await factory.create(t);
    const { ledger } = store;
    // 1. A request of a replica that then went away: last said alive 11 minutes ago, by the database.
    const lost = reservation({ run: 'gone', time: Date.now() - 11 * 60_000 });
    const live = reservation({ run: 'gone' });
    for (const r of [lost, live]) t.same(await ledger.admit(r), { ok: true });
    await store.saidAlive(lost.id, 11 * 60_000, Date.now());
    // 2. A replica whose clock is an hour behind sweeps: the lost one is recovered, the live one not.
    t.equal(await ledger.recoverStale(10 * 60_000, Date.now() - 60 * 60_000), 1);
    const rows = new Map((await collect(ledger.exportRows(null, null))).map((r) => [r.id, r]));
    t.match(rows.get(lost.id), { state: 'recovered', refund_tokens: 0 });
    t.equal(rows.get(live.id)?.state, 'reserved');
  });
}
