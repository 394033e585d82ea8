// A refused admission changes nothing in the ledger (SPEC §2.4: refuse or reserve). Found by an
// outside audit: the store created the conversation, its parent link and the run — and claimed an
// unowned conversation — before the checks, and kept them when the verdict was a refusal, so a
// refusal started the run's clock and fixed a parent for good.
import t from 'tap';
import type { Ledger } from '../../metering/ledger.js';
import { collect, reservation, storeFactories } from '../helpers/stores.js';

/** Everything a refusal could have left behind about these ids. */
async function traces(ledger: Ledger, ids: { conversations: string[]; runs: string[] }) {
  return {
    conversations: await Promise.all(ids.conversations.map((c) => ledger.conversationSpend(c))),
    runs: await Promise.all(ids.runs.map((r) => ledger.getRun(r))),
    month: await ledger.tenantMonth('acme', '2025-06'),
    rows: (await collect(ledger.exportRows(null, null))).length,
  };
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a refusal of a new conversation leaves no conversation, parent, run or month`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 0.1 });
    const r = reservation({ conversation: 'fresh', parent: 'lead', run: 'fresh/run', worstCaseUsd: 0.5 });
    t.match(await ledger.admit(r), { ok: false, scope: 'monthly' });
    t.same(await traces(ledger, { conversations: ['fresh', 'lead'], runs: ['fresh/run'] }), {
      conversations: [null, null],
      runs: [null],
      month: { spentUsd: 0, reservedUsd: 0, unpricedTurns: 0 },
      rows: 0,
    });
  });

  t.test(`${factory.kind}: a refusal does not claim a conversation whose cap was set before its first request`, async (t) => {
    const { ledger } = await factory.create(t);
    // 1. The operator caps `capped` before anyone used it: the record is unowned, with no parent.
    await ledger.setConversationCap('capped', null, 1e-8);
    // 2. A request naming a parent is refused at the cap: still unowned, still no parent.
    const refused = reservation({ conversation: 'capped', parent: 'p', run: 'capped/run', worstCaseUsd: 0.01 });
    t.match(await ledger.admit(refused), { ok: false, scope: 'conversation' });
    t.match(await ledger.conversationSpend('capped'), { tenant: '', parent: null, reservedUsd: 0, turns: 0 });
    t.equal(await ledger.conversationSpend('p'), null, 'the named parent was not created');
    t.equal(await ledger.getRun('capped/run'), null);
    // 3. The cap is raised; the first admitted request names another parent: that one holds for
    // good, since the refused request never made `p` the parent.
    await ledger.setConversationCap('capped', null, 10);
    t.same(await ledger.admit(reservation({ conversation: 'capped', parent: 'q', run: 'capped/run', worstCaseUsd: 0.01 })), { ok: true });
    t.match(await ledger.conversationSpend('capped'), { tenant: 'acme', parent: 'q' });
    t.equal(await ledger.conversationSpend('p'), null);
    t.ok(Math.abs((await ledger.conversationSpend('q'))!.reservedUsd - 0.01) < 1e-12);
  });

  t.test(`${factory.kind}: a refusal does not start the run's clock`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.setConversationCap('R', 'acme', 1e-8);
    const t0 = Date.UTC(2025, 5, 10, 12, 0, 0);
    // 1. Refused at t0 (the cap), then again at t0 + 1 s on the run budget (a prompt bigger than it).
    t.match(await ledger.admit(reservation({ conversation: 'R', run: 'R/run', time: t0, worstCaseUsd: 0.01 })), { scope: 'conversation' });
    t.match(await ledger.admit(reservation({ conversation: 'R', run: 'R/run', time: t0 + 1000, runBudgetTokens: 10 })), { scope: 'run' });
    t.equal(await ledger.getRun('R/run'), null, 'no run yet');
    // 2. 301 s later, with the cap raised, the first admitted request starts the run: its clock
    // and its budget are this request's, not the refused ones'.
    await ledger.setConversationCap('R', 'acme', 10);
    const later = t0 + 301_000;
    t.same(await ledger.admit(reservation({ conversation: 'R', run: 'R/run', time: later, worstCaseUsd: 0.01, runBudgetTokens: 5000 })), { ok: true });
    t.match(await ledger.getRun('R/run'), { startedAt: later, budgetTokens: 5000, usedTokens: 150 });
  });

  t.test(`${factory.kind}: refusals among concurrent admissions leave nothing; the admitted are all there`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    await store.ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 1 });
    // 1. 40 first requests at once, each its own new conversation and run ($0.10 each, every fourth
    // naming a parent): the month fits exactly 10. SQLite runs those of one event-loop turn in one
    // group commit, so admitted and refused share transactions.
    const rs = Array.from({ length: 40 }, (_, i) =>
      reservation({ conversation: `c${i}`, parent: i % 4 === 0 ? `p${i}` : null, run: `c${i}/run`, worstCaseUsd: 0.1 }),
    );
    const verdicts = await Promise.all(rs.map((r, i) => handles[i % 2]!.admit(r)));
    const admitted = rs.filter((_, i) => verdicts[i]!.ok);
    const refused = rs.filter((_, i) => !verdicts[i]!.ok);
    t.equal(admitted.length, 10);
    // 2. The admitted ones are written whole; the refused ones left no trace.
    const month = await store.ledger.tenantMonth('acme', '2025-06');
    t.ok(Math.abs(month.reservedUsd - 1) < 1e-9, `reserved $1 (got ${month.reservedUsd})`);
    const rows = await collect(store.ledger.exportRows(null, null));
    t.same(rows.map((row) => row.id).sort(), admitted.map((r) => r.id).sort());
    for (const r of admitted) {
      t.match(await store.ledger.conversationSpend(r.conversation), { tenant: 'acme', parent: r.parent });
      t.match(await store.ledger.getRun(r.run), { usedTokens: 150 });
      if (r.parent) t.ok(Math.abs((await store.ledger.conversationSpend(r.parent))!.reservedUsd - 0.1) < 1e-9);
    }
    for (const r of refused) {
      t.equal(await store.ledger.conversationSpend(r.conversation), null, `${r.conversation}: no conversation`);
      t.equal(await store.ledger.getRun(r.run), null, `${r.run}: no run`);
      if (r.parent) t.equal(await store.ledger.conversationSpend(r.parent), null, `${r.parent}: no parent`);
    }
  });

  t.test(`${factory.kind}: a refused first request fixes no parent, even racing admitted ones`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    // `p` has no room at all, `q` plenty. The conversation's parent is the first it is *admitted*
    // with: q. A request naming p is refused only while no q request has been admitted; after
    // that, p is not its parent and is not checked.
    await store.ledger.setConversationCap('p', 'acme', 1e-8);
    await store.ledger.setConversationCap('q', 'acme', 100);
    // 1. The conversation's very first request names p, alone: refused, it leaves no parent.
    t.match(await store.ledger.admit(reservation({ conversation: 'racer', run: 'racer/run', parent: 'p', worstCaseUsd: 0.01 })), {
      ok: false,
      scope: 'parent',
    });
    // 2. Then 24 at once over two handles, naming p and q in turn.
    const rs = Array.from({ length: 24 }, (_, i) =>
      reservation({ conversation: 'racer', run: 'racer/run', parent: i % 2 === 0 ? 'p' : 'q', worstCaseUsd: 0.01 }),
    );
    const verdicts = await Promise.all(rs.map((r, i) => handles[i % 2]!.admit(r)));
    const admitted = rs.filter((_, i) => verdicts[i]!.ok);
    t.ok(rs.every((r, i) => r.parent === 'p' || verdicts[i]!.ok), 'every request naming q was admitted');
    t.ok(verdicts.every((v) => v.ok || (v.scope === 'parent' && v.limitUsd === 1e-8)), "the refusals were p's cap");
    // 3. q holds; only admitted requests are in the ledger, all of them on q's cap.
    t.equal((await store.ledger.conversationSpend('racer'))?.parent, 'q');
    const rows = (await collect(store.ledger.exportRows(null, null))).filter((row) => row.conversation === 'racer');
    t.same(rows.map((row) => row.id).sort(), admitted.map((r) => r.id).sort());
    t.ok(rows.every((row) => row.parent === 'q'));
    t.ok(Math.abs((await store.ledger.conversationSpend('q'))!.reservedUsd - 0.01 * admitted.length) < 1e-9);
    t.equal((await store.ledger.conversationSpend('p'))!.reservedUsd, 0);
    t.equal((await store.ledger.getRun('racer/run'))?.usedTokens, 150 * admitted.length);
  });
}
