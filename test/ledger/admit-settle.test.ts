// Admission and settlement of run tokens, on every store: reserve prompt + allowance, refund the
// unused allowance, settle once, and keep remaining == budget − Σcharges + Σrefunds.
import t from 'tap';
import { reservation, settlement, storeFactories } from '../helpers/stores.js';

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a settlement reports the tenant's month as it left it`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 10 });
    const a = reservation({ run: 'run-m', worstCaseUsd: 0.5 });
    const b = reservation({ run: 'run-m', worstCaseUsd: 0.5 });
    t.same(await ledger.admit(a), { ok: true });
    t.same(await ledger.admit(b), { ok: true });
    t.same(await ledger.settle(a.id, settlement(a, 10, { costUsd: 0.25 })), { spentUsd: 0.25, monthlyBudgetUsd: 10 });
    t.same(await ledger.settle(b.id, settlement(b, 10, { costUsd: 0.5 })), { spentUsd: 0.75, monthlyBudgetUsd: 10 }, 'this settlement included');
    t.equal(await ledger.settle(b.id, settlement(b, 10, { costUsd: 0.5 })), null, 'settling twice: nothing, and no month');
    await ledger.setTenantBudget('acme', null);
    const c = reservation({ run: 'run-m' });
    t.same(await ledger.admit(c), { ok: true });
    t.same(await ledger.settle(c.id, settlement(c, 1)), { spentUsd: 0.75, monthlyBudgetUsd: null }, 'no budget: null');
  });

  t.test(`${factory.kind}: admit reserves prompt + allowance, settle refunds`, async (t) => {
    const { ledger } = await factory.create(t);
    const r = reservation({ run: 'run-a', promptCharge: 120, allowance: 80, runBudgetTokens: 1000 });
    // 1. Admission creates the run with its budget and reserves the whole charge.
    t.same(await ledger.admit(r), { ok: true });
    const run = await ledger.getRun('run-a');
    t.match(run, { run: 'run-a', conversation: 'conv-1', budgetTokens: 1000, usedTokens: 200, startedAt: r.time });
    // 2. Settling refunds the unused allowance.
    await ledger.settle(r.id, settlement(r, 30));
    t.equal((await ledger.getRun('run-a'))?.usedTokens, 150);
    // 3. A second settle of the same row changes nothing.
    await ledger.settle(r.id, settlement(r, 0));
    t.equal((await ledger.getRun('run-a'))?.usedTokens, 150);
    const spend = await ledger.conversationSpend('conv-1');
    t.equal(spend?.turns, 1, 'counted as one turn');
  });

  t.test(`${factory.kind}: the run budget refuses with exact figures and records nothing`, async (t) => {
    const { ledger } = await factory.create(t);
    const first = reservation({ run: 'run-b', promptCharge: 600, allowance: 300, runBudgetTokens: 1000 });
    t.same(await ledger.admit(first), { ok: true });
    const second = reservation({ run: 'run-b', promptCharge: 60, allowance: 50, runBudgetTokens: 1000 });
    t.same(await ledger.admit(second), {
      ok: false,
      scope: 'run',
      remainingTokens: 100,
      neededTokens: 110,
      limitTokens: 1000,
    });
    t.equal((await ledger.getRun('run-b'))?.usedTokens, 900, 'a refusal reserves nothing');
    // Exactly what remains fits.
    const exact = reservation({ run: 'run-b', promptCharge: 60, allowance: 40, runBudgetTokens: 1000 });
    t.same(await ledger.admit(exact), { ok: true });
    t.equal((await ledger.getRun('run-b'))?.usedTokens, 1000);
  });

  t.test(`${factory.kind}: no token budget (null) admits anything`, async (t) => {
    const { ledger } = await factory.create(t);
    const r = reservation({ run: 'run-free', promptCharge: 10_000_000, allowance: 1, runBudgetTokens: null });
    t.same(await ledger.admit(r), { ok: true });
    t.equal((await ledger.getRun('run-free'))?.budgetTokens, null);
  });

  t.test(`${factory.kind}: remaining == budget − Σcharges + Σrefunds after a random mix`, async (t) => {
    const { ledger } = await factory.create(t);
    const budget = 20_000;
    // A seeded generator: the mix is random but the same on every run, so a failure reproduces.
    let s = 42;
    const rand = (n: number) => {
      s = (s * 1103515245 + 12345) % 2147483648;
      return s % n;
    };
    let charges = 0;
    let refunds = 0;
    let maxUsed = 0;
    const open: { r: ReturnType<typeof reservation> }[] = [];
    for (let i = 0; i < 120; i++) {
      if (open.length > 0 && rand(3) === 0) {
        const { r } = open.splice(rand(open.length), 1)[0];
        const generated = rand(r.allowance + 1);
        await ledger.settle(r.id, settlement(r, generated));
        refunds += r.allowance - generated;
      } else {
        const r = reservation({
          run: 'run-mix',
          runBudgetTokens: budget,
          promptCharge: rand(400),
          allowance: 1 + rand(300),
        });
        const verdict = await ledger.admit(r);
        if (verdict.ok) {
          charges += r.promptCharge + r.allowance;
          open.push({ r });
        }
      }
      maxUsed = Math.max(maxUsed, (await ledger.getRun('run-mix'))?.usedTokens ?? 0);
    }
    t.ok(maxUsed <= budget, `never over budget (peak ${maxUsed} of ${budget})`);
    // Settle what is left, some twice (no-ops).
    for (const { r } of open) {
      await ledger.settle(r.id, settlement(r, 0));
      await ledger.settle(r.id, settlement(r, 0));
      refunds += r.allowance;
    }
    const run = await ledger.getRun('run-mix');
    t.ok(charges > 0 && refunds > 0, 'the mix did admit and refund');
    t.equal(budget - (run?.usedTokens ?? NaN), budget - charges + refunds);
  });

  t.test(`${factory.kind}: settlement records every figure on the row`, async (t) => {
    const { ledger } = await factory.create(t);
    const r = reservation({ run: 'run-c', worstCaseUsd: 0.5 });
    await ledger.admit(r);
    await ledger.settle(
      r.id,
      settlement(r, 20, {
        costUsd: 0.125,
        savedUsd: 0.01,
        fallback: true,
        upstreamFigures: { promptTokens: 100, completionTokens: 20, cachedTokens: 64, promptN: 36, cacheN: 64 },
      }),
    );
    const rows = [];
    for await (const row of ledger.exportRows(null, null)) rows.push(row);
    t.equal(rows.length, 1);
    t.match(rows[0], {
      id: r.id,
      state: 'settled',
      status: 200,
      reserved_tokens: 150,
      charge_tokens: 120,
      refund_tokens: 30,
      generated_tokens: 20,
      cost_usd: 0.125,
      saved_usd: 0.01,
      worst_case_usd: 0.5,
      upstream_cached_tokens: 64,
      upstream_prompt_n: 36,
      upstream_cache_n: 64,
      fallback: true,
      finished_at: new Date(r.time + 1000).toISOString(),
    });
  });
}
