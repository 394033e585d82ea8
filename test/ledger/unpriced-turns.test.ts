// Turns whose cost is unknown (ADR 0006): a metered model without a price settles with
// `costUsd: null`, adds nothing to any sum of money, and is counted beside each sum instead — the
// conversation's own turns, each model's, the `tasks` of the conversations above, and the tenant's
// month. Regression (an outside audit): they were added as $0, and read as free turns.
import t from 'tap';
import type { Ledger, Settlement } from '../../metering/ledger.js';
import { reservation, settlement, storeFactories } from '../helpers/stores.js';

const unknownBeside = (u: number, tasks: number) => ({ unpricedTurns: u, tasksUnpricedTurns: tasks });

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a turn of unknown cost is counted in its conversation, its model, those above and the month`, async (t) => {
    const { ledger } = await factory.create(t);
    // 1. low → mid → top: each turn of `low` is drawn on both conversations above it.
    const turnIn = async (conversation: string, parent: string | null, over: Partial<Settlement>, model = 'gpt-unpriced-x') => {
      const r = reservation({ conversation, parent, run: `${conversation}-run`, model, worstCaseUsd: over.costUsd ? 0.5 : null });
      t.same(await ledger.admit(r), { ok: true });
      await ledger.settle(r.id, settlement(r, 10, over));
    };
    await turnIn('top', null, { costUsd: null });
    await turnIn('mid', 'top', { costUsd: null });
    await turnIn('low', 'mid', { costUsd: null });
    await turnIn('low', 'mid', { costUsd: null });

    // 2. Turns of known cost: priced, local, plan — none is counted.
    await turnIn('low', 'mid', { costUsd: 0.25 }, 'gpt-4o-mini');
    await turnIn('low', 'mid', { costUsd: 0, billing: 'local' }, 'llama');
    await turnIn('low', 'mid', { costUsd: 0, billing: 'plan', planWorkUsd: 0.01 }, 'claude-plan');

    // 3. A request the upstream failed before any output is no turn, whatever its cost says.
    await turnIn('low', 'mid', { status: 503, generatedTokens: 0, chargeTokens: 0, refundTokens: 150, costUsd: null });

    const low = await ledger.conversationSpend('low');
    t.match(low, { turns: 5, ...unknownBeside(2, 0) });
    t.ok(Math.abs((low?.spentUsd ?? -1) - 0.25) < 1e-9, 'spent_usd is the known costs');
    t.same(low?.byModel['gpt-unpriced-x'], { turns: 2, spentUsd: 0, unpricedTurns: 2 });
    t.same(low?.byModel['gpt-4o-mini'], { turns: 1, spentUsd: 0.25, unpricedTurns: 0 });
    t.same(low?.byModel['llama'], { turns: 1, spentUsd: 0, unpricedTurns: 0 });
    t.same(low?.byModel['claude-plan'], { turns: 1, spentUsd: 0, unpricedTurns: 0 });
    t.match(await ledger.conversationSpend('mid'), { turns: 1, ...unknownBeside(1, 2) });
    t.match(await ledger.conversationSpend('top'), { turns: 1, ...unknownBeside(1, 3) });
    const month = await ledger.tenantMonth('acme', '2025-06');
    t.equal(month.unpricedTurns, 4, "the month counts each turn once: top's, mid's and low's two");
    t.ok(Math.abs(month.spentUsd - 0.25) < 1e-9);
  });

  t.test(`${factory.kind}: a turn of unknown cost a crash left open is recovered as one, a local one is not`, async (t) => {
    const store = await factory.create(t);
    const now = Date.UTC(2025, 5, 10, 13, 0, 0);
    // An unpriced metered turn has no worst case, so recovery, which charges the worst case, has
    // no cost for it either (ledger-row.ts recoveredSettlement).
    const unpriced = reservation({ run: 'ru', conversation: 'child', parent: 'parent', model: 'gpt-unpriced-x', time: now - 600_000, billing: 'metered', worstCaseUsd: null });
    const local = reservation({ run: 'rl', conversation: 'child', parent: 'parent', model: 'llama', time: now - 600_000, billing: 'local' });
    const priced = reservation({ run: 'rp', conversation: 'child', parent: 'parent', model: 'gpt-4o', time: now - 600_000, billing: 'metered', worstCaseUsd: 0.25 });
    for (const r of [unpriced, local, priced]) t.same(await store.ledger.admit(r), { ok: true });
    await store.ledger.close(); // the crash
    const ledger: Ledger = await store.reopen();
    t.equal(await ledger.recoverOpen(now), 3);
    const child = await ledger.conversationSpend('child');
    t.match(child, { turns: 3, ...unknownBeside(1, 0) });
    t.same(child?.byModel['gpt-unpriced-x'], { turns: 1, spentUsd: 0, unpricedTurns: 1 });
    t.same(child?.byModel['llama'], { turns: 1, spentUsd: 0, unpricedTurns: 0 });
    t.same(child?.byModel['gpt-4o'], { turns: 1, spentUsd: 0.25, unpricedTurns: 0 });
    t.match(await ledger.conversationSpend('parent'), unknownBeside(0, 1));
    t.same(await ledger.tenantMonth('acme', '2025-06'), { spentUsd: 0.25, reservedUsd: 0, unpricedTurns: 1 });
  });
}
