// No budget is ever crossed under concurrency (SPEC §4, §7): many admissions at once, through
// several handles on the same storage (two connections / pools, and for SQLite several processes
// on one file), admit exactly as many as fit.
import t from 'tap';
import { spawn } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import type { Ledger, Reservation } from '../../metering/ledger.js';
import { reservation, settlement, storeFactories } from '../helpers/stores.js';

const ROOT = join(dirname(fileURLToPath(import.meta.url)), '..', '..');

/** Fire every admission at once, round-robin over the handles; count the admitted ones. */
async function admitAll(handles: Ledger[], rs: Reservation[]): Promise<Reservation[]> {
  const verdicts = await Promise.all(rs.map((r, i) => handles[i % handles.length].admit(r)));
  return rs.filter((_, i) => verdicts[i].ok);
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: 200 concurrent admits against a run budget that fits exactly K`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    // Several rounds with different K, each on its own run.
    for (const k of [1, 37, 120]) {
      const run = `run-k${k}`;
      const budget = k * 150; // each request charges 100 + 50
      const rs = Array.from({ length: 200 }, () => reservation({ run, runBudgetTokens: budget }));
      const admitted = await admitAll(handles, rs);
      t.equal(admitted.length, k, `K=${k}: exactly K admitted`);
      t.equal((await store.ledger.getRun(run))?.usedTokens, budget, `K=${k}: the budget is used to the token`);
    }
  });

  t.test(`${factory.kind}: a monthly budget in USD is never overspent`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    await store.ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 10 });
    const money = (conversation: string, i: number) =>
      reservation({ conversation, run: `${conversation}-run-${i}`, worstCaseUsd: 0.25 });
    // 1. 200 at once at $0.25 worst case against $10: exactly 40 fit.
    const first = await admitAll(handles, Array.from({ length: 200 }, (_, i) => money(`c${i % 7}`, i)));
    t.equal(first.length, 40);
    t.same(await store.ledger.tenantMonth('acme', '2025-06'), { spentUsd: 0, reservedUsd: 10, unpricedTurns: 0 });
    // 2. Settle those at a real $0.20 while 200 more race for what the settlements free up.
    const settles = first.map((r, i) =>
      handles[i % 2].settle(r.id, settlement(r, 10, { costUsd: 0.2 })),
    );
    const second = await admitAll(handles, Array.from({ length: 200 }, (_, i) => money(`d${i % 5}`, i)));
    await Promise.all(settles);
    const month = await store.ledger.tenantMonth('acme', '2025-06');
    t.ok(Math.abs(month.spentUsd - 8) < 1e-9, `settled spend is 40 × $0.20 (got ${month.spentUsd})`);
    t.ok(Math.abs(month.reservedUsd - second.length * 0.25) < 1e-9, 'reserved = the second wave in flight');
    t.ok(month.spentUsd + month.reservedUsd <= 10 + 1e-9, 'spent + reserved within the budget');
    t.ok(second.length <= 8, `the race admitted no more than the freed $2 allows (${second.length})`);
    // 3. With every settlement done, the rest of the freed money fits exactly 8 − |second| more.
    const third = await admitAll(handles, Array.from({ length: 200 }, (_, i) => money(`e${i % 3}`, i)));
    t.equal(third.length, 8 - second.length, 'what is left fits exactly');
    const final = await store.ledger.tenantMonth('acme', '2025-06');
    t.ok(Math.abs(final.spentUsd + final.reservedUsd - 10) < 1e-9, 'the budget is used to the cent, not past it');
  });

  t.test(`${factory.kind}: a parent's cap is shared by children admitted concurrently`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    await store.ledger.setConversationCap('parent', 'acme', 1);
    const rs = Array.from({ length: 100 }, (_, i) =>
      reservation({ conversation: `child-${i % 5}`, parent: 'parent', run: `child-run-${i}`, worstCaseUsd: 0.1 }),
    );
    const admitted = await admitAll(handles, rs);
    t.equal(admitted.length, 10, '$1 cap / $0.10 each');
  });

  t.test(`${factory.kind}: a top cap is shared by grandchildren admitted concurrently`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    // 1. top ← mid ← low-0…4, linked first; then 100 grandchildren race for the top's $1.
    await store.ledger.setConversationCap('top', 'acme', 1);
    const link = async (conversation: string, parent: string) => {
      const r = reservation({ conversation, parent, run: `${conversation}-link`, worstCaseUsd: null });
      t.same(await store.ledger.admit(r), { ok: true });
      await store.ledger.settle(r.id, settlement(r, 1));
    };
    await link('mid', 'top');
    for (let i = 0; i < 5; i++) await link(`low-${i}`, 'mid');
    const rs = Array.from({ length: 100 }, (_, i) =>
      reservation({ conversation: `low-${i % 5}`, run: `low-run-${i}`, worstCaseUsd: 0.1 }),
    );
    const admitted = await admitAll(handles, rs);
    t.equal(admitted.length, 10, '$1 cap / $0.10 each, two levels up');
    t.ok(Math.abs((await store.ledger.conversationSpend('top'))!.reservedUsd - 1) < 1e-9);
  });

  t.test(`${factory.kind}: a conversation gaining its parent while those below it are admitted leaves no reservation behind`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    await store.ledger.setConversationCap('top', 'acme', 100);
    for (let i = 0; i < 5; i++) {
      const r = reservation({ conversation: `low-${i}`, parent: 'mid', run: `low-${i}-link`, worstCaseUsd: null });
      t.same(await store.ledger.admit(r), { ok: true });
      await store.ledger.settle(r.id, settlement(r, 1));
    }
    // 1. `mid` names `top` in the middle of 60 admissions of the conversations below it.
    const rs = Array.from({ length: 60 }, (_, i) =>
      i === 30
        ? reservation({ conversation: 'mid', parent: 'top', run: 'mid-run', worstCaseUsd: 0.1 })
        : reservation({ conversation: `low-${i % 5}`, run: `low-run-${i}`, worstCaseUsd: 0.1 }),
    );
    const admitted = await admitAll(handles, rs);
    t.equal(admitted.length, 60);
    // 2. Each settles where it was reserved: nothing is left reserved, and nothing goes negative.
    await Promise.all(admitted.map((r, i) => handles[i % 2].settle(r.id, settlement(r, 10, { costUsd: 0.05 }))));
    for (const id of ['top', 'mid', 'low-0', 'low-4']) {
      t.ok(Math.abs((await store.ledger.conversationSpend(id))!.reservedUsd) < 1e-9, `${id}: nothing reserved`);
    }
    t.equal((await store.ledger.conversationSpend('mid'))?.parent, 'top');
    const top = (await store.ledger.conversationSpend('top'))!.tasksUsd;
    t.ok(top >= 0.05 - 1e-9 && top <= 60 * 0.05 + 1e-9, `the top counts mid's turn and those admitted after it (${top})`);
  });

  t.test(`${factory.kind}: budget-near is claimed exactly once per tenant and month`, async (t) => {
    const store = await factory.create(t);
    const handles = [store.ledger, await store.reopen()];
    const claims = await Promise.all(
      Array.from({ length: 50 }, (_, i) => handles[i % 2].claimBudgetNearNotice('acme', '2025-06')),
    );
    t.equal(claims.filter(Boolean).length, 1);
    t.equal(await store.ledger.claimBudgetNearNotice('acme', '2025-07'), true, 'next month: again');
    t.equal(await store.ledger.claimBudgetNearNotice('other', '2025-06'), true, 'another tenant');
    t.equal(await store.ledger.claimBudgetNearNotice('acme', '2025-06'), false);
  });

  if (factory.kind === 'sqlite') {
    t.test('sqlite: four processes on one file admit exactly K', async (t) => {
      const store = await factory.create(t);
      const k = 53;
      const results = await Promise.all(
        [0, 1, 2, 3].map((p) => admitInChild(store.sqlitePath ?? '', p, 50, k * 150)),
      );
      t.equal(results.reduce((a, b) => a + b, 0), k, 'across processes, exactly K admitted');
      t.equal((await store.ledger.getRun('run-procs'))?.usedTokens, k * 150);
    });
  }
}

/**
 * A separate Node process (tsx loader) admitting `count` requests against the same run.
 * Children wait for a common start instant so their transactions really overlap.
 */
function admitInChild(path: string, proc: number, count: number, budget: number): Promise<number> {
  const storeUrl = new URL('../../metering/stores/sqlite-store.ts', import.meta.url).href;
  const code = `
    const { SqliteLedger } = await import(${JSON.stringify(storeUrl)});
    const ledger = new SqliteLedger({ path: ${JSON.stringify(path)} });
    const start = Number(process.env.START_AT);
    while (Date.now() < start) await new Promise((r) => setTimeout(r, 1));
    let ok = 0;
    for (let i = 0; i < ${count}; i++) {
      const v = await ledger.admit({
        id: 'p${proc}-' + i, time: Date.now(), tenant: 'acme', keyId: null, conversation: 'conv-procs',
        parent: null, run: 'run-procs', model: 'm', upstream: 'u', endpoint: '/v1/chat/completions',
        mode: 'normal', finalReason: null, rows: 1, promptTokens: 100, countMethod: 'estimate:bytes',
        sharedPrefixTokens: 0, promptCharge: 100, allowance: 50, runBudgetTokens: ${budget},
        worstCaseUsd: null, month: '2025-06',
      });
      if (v.ok) ok++;
    }
    await ledger.close();
    process.stdout.write(String(ok));
  `;
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
      cwd: ROOT,
      env: { ...process.env, START_AT: String(Date.now() + 1500) },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d: Buffer) => (out += d.toString()));
    child.stderr.on('data', (d: Buffer) => (err += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => {
      if (code === 0 && /^\d+$/.test(out)) resolve(Number(out));
      else reject(new Error(`child ${proc} exited ${code}: ${err || out}`));
    });
  });
}
