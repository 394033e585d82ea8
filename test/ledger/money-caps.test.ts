// Money on every store: conversation caps, a parent's cap shared by its children (and theirs), the
// tenant's monthly budget, and the spend each settlement adds up (SPEC §7).
import t from 'tap';
import type { Ledger } from '../../metering/ledger.js';
import { MAX_ANCESTORS } from '../../metering/stores/admission-check.js';
import { collect, reservation, settlement, storeFactories } from '../helpers/stores.js';

const near = (a: number | undefined, b: number) => a !== undefined && Math.abs(a - b) < 1e-9;

/** Admits one turn of `conversation` (naming `parent`) and settles it at `costUsd`. */
async function spend(ledger: Ledger, conversation: string, parent: string | null, costUsd: number) {
  const r = reservation({ conversation, parent, run: `${conversation}-run`, worstCaseUsd: costUsd });
  const verdict = await ledger.admit(r);
  if (!verdict.ok) throw new Error(`${conversation} was refused: ${JSON.stringify(verdict)}`);
  await ledger.settle(r.id, settlement(r, 10, { costUsd }));
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a conversation's cap counts spend and reservations in flight`, async (t) => {
    const { ledger } = await factory.create(t);
    // 1. The cap is set before the conversation's first request: the record exists, unowned.
    await ledger.setConversationCap('conv-cap', null, 1);
    t.match(await ledger.conversationSpend('conv-cap'), { tenant: '', capUsd: 1, turns: 0 });
    // 2. Its first request claims it for the tenant.
    const a = reservation({ conversation: 'conv-cap', run: 'r1', worstCaseUsd: 0.6 });
    t.same(await ledger.admit(a), { ok: true });
    t.equal((await ledger.conversationSpend('conv-cap'))?.tenant, 'acme');
    // 3. A second request while the first is in flight: 0.6 reserved + 0.5 > 1.
    const b = reservation({ conversation: 'conv-cap', run: 'r1', worstCaseUsd: 0.5 });
    t.same(await ledger.admit(b), { ok: false, scope: 'conversation', spentUsd: 0, reservedUsd: 0.6, limitUsd: 1, neededUsd: 0.5 }, 'in flight, not spent');
    // 4. Settling the first at its real cost frees the difference.
    await ledger.settle(a.id, settlement(a, 10, { costUsd: 0.25, savedUsd: 0.05 }));
    t.same(await ledger.admit(b), { ok: true });
    // 5. A request that costs no money passes a full cap.
    await ledger.setConversationCap('conv-cap', null, 0.1);
    t.same(await ledger.admit(reservation({ conversation: 'conv-cap', run: 'r1', worstCaseUsd: null })), { ok: true });
    t.match(await ledger.admit(reservation({ conversation: 'conv-cap', run: 'r1', worstCaseUsd: 0.01 })), {
      ok: false,
      scope: 'conversation',
      limitUsd: 0.1,
    });
    // 6. A cap set for another owner writes nothing: the owner is never replaced.
    t.equal(await ledger.setConversationCap('conv-cap', 'someone-else', null), 'acme');
    t.match(await ledger.conversationSpend('conv-cap'), { tenant: 'acme', capUsd: 0.1 });
    // 7. Removing the cap lifts it.
    t.equal(await ledger.setConversationCap('conv-cap', null, null), 'acme');
    t.same(await ledger.admit(reservation({ conversation: 'conv-cap', run: 'r1', worstCaseUsd: 5 })), { ok: true });
    t.equal(await ledger.setConversationCap('fresh', 'acme', 2), 'acme', 'an owner named for a new conversation');
  });

  t.test(`${factory.kind}: a child shares its parent's cap and its spend counts in both`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.setConversationCap('parent', 'acme', 1);
    const p = reservation({ conversation: 'parent', run: 'p-run', worstCaseUsd: 0.3 });
    t.same(await ledger.admit(p), { ok: true });
    await ledger.settle(p.id, settlement(p, 10, { costUsd: 0.3 }));
    // 1. A child turn reserves against both; its settled cost is the parent's tasks_usd.
    const c = reservation({ conversation: 'child', parent: 'parent', run: 'c-run', worstCaseUsd: 0.5, model: 'gpt-4.1' });
    t.same(await ledger.admit(c), { ok: true });
    t.equal((await ledger.conversationSpend('parent'))?.reservedUsd, 0.5, "in flight on the parent's cap");
    t.equal((await ledger.conversationSpend('child'))?.reservedUsd, 0.5);
    await ledger.settle(c.id, settlement(c, 10, { costUsd: 0.4 }));
    t.equal((await ledger.conversationSpend('parent'))?.reservedUsd, 0, 'released at settlement');
    t.match(await ledger.conversationSpend('child'), { parent: 'parent', spentUsd: 0.4, turns: 1, tasksUsd: 0 });
    const parent = await ledger.conversationSpend('parent');
    t.equal(parent?.spentUsd, 0.3);
    t.ok(Math.abs((parent?.tasksUsd ?? 0) - 0.4) < 1e-9, 'the child turn counts in the parent');
    // 2. The parent is at 0.7 of 1: a child needing 0.31 does not start, with the parent's figures.
    const big = reservation({ conversation: 'child-2', parent: 'parent', run: 'c2', worstCaseUsd: 0.31 });
    const refusal = await ledger.admit(big);
    t.match(refusal, { ok: false, scope: 'parent', limitUsd: 1, neededUsd: 0.31 });
    t.ok(!refusal.ok && refusal.scope === 'parent' && Math.abs(refusal.spentUsd - 0.7) < 1e-9);
    // 3. The child's own cap is checked before its parent's.
    await ledger.setConversationCap('child-3', 'acme', 0.05);
    t.match(await ledger.admit(reservation({ conversation: 'child-3', parent: 'parent', run: 'c3', worstCaseUsd: 0.31 })), {
      scope: 'conversation',
    });
    t.equal((await ledger.tenantMonth('acme', '2025-06')).reservedUsd, 0, 'refusals reserve nothing');
  });

  t.test(`${factory.kind}: the tenant's monthly budget and the spend it adds up`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.createTenant({ id: 'acme', monthlyBudgetUsd: 2 });
    const a = reservation({ run: 'm1', worstCaseUsd: 1.5, month: '2025-06' });
    t.same(await ledger.admit(a), { ok: true });
    t.same(await ledger.admit(reservation({ run: 'm1', worstCaseUsd: 0.75 })), {
      ok: false,
      scope: 'monthly',
      spentUsd: 0,
      reservedUsd: 1.5,
      limitUsd: 2,
      neededUsd: 0.75,
    });
    // Another month is another budget.
    t.same(await ledger.admit(reservation({ run: 'm2', worstCaseUsd: 0.75, month: '2025-07' })), { ok: true });
    await ledger.settle(a.id, settlement(a, 5, { costUsd: 0.5 }));
    t.same(await ledger.tenantMonth('acme', '2025-06'), { spentUsd: 0.5, reservedUsd: 0, unpricedTurns: 0 });
    // Lifting the budget (null) admits anything.
    t.equal(await ledger.setTenantBudget('acme', null), true);
    t.same(await ledger.admit(reservation({ run: 'm1', worstCaseUsd: 100 })), { ok: true });
    t.equal(await ledger.setTenantBudget('nobody', 1), false, 'unknown tenant');
  });

  // Regression (twentieth session): the offer was written whatever the cap was by then, so an
  // operator who set a new cap while a 402 was being built had the old cap's offer kept under it.
  t.test(`${factory.kind}: the room a 402 offered is recorded only under the cap it was made at`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.setConversationCap('offered', null, 0.25);
    await ledger.offerCapRoom('offered', 400, 0.25);
    t.equal((await ledger.conversationSpend('offered'))?.roomCeilingMtok, 400, 'recorded under its own cap');
    await ledger.offerCapRoom('offered', 100, 0.25);
    t.equal((await ledger.conversationSpend('offered'))?.roomCeilingMtok, 400, 'the dearest offer stands');
    await ledger.setConversationCap('offered', null, 0.5);
    t.equal((await ledger.conversationSpend('offered'))?.roomCeilingMtok, null, 'a new cap withdraws it');
    await ledger.offerCapRoom('offered', 400, 0.25);
    t.equal((await ledger.conversationSpend('offered'))?.roomCeilingMtok, null, 'an offer made under the old cap is not recorded');
    await ledger.setConversationCap('offered', null, null);
    await ledger.offerCapRoom('offered', 400, 0.25);
    t.equal((await ledger.conversationSpend('offered'))?.roomCeilingMtok, null, 'nor once the cap is gone');
    await ledger.offerCapRoom('never-made', 400, 0.25);
    t.equal(await ledger.conversationSpend('never-made'), null, 'an offer makes no conversation');
  });

  t.test(`${factory.kind}: spend by model, plan turns, unknown cost`, async (t) => {
    const { ledger } = await factory.create(t);
    const turns = [
      { model: 'gpt-4o', cost: 0.02, billing: 'metered' as const },
      { model: 'gpt-4o', cost: 0.03, billing: 'metered' as const },
      { model: 'claude-plan', cost: 0, billing: 'plan' as const },
      { model: 'llama', cost: null, billing: 'local' as const },
    ];
    for (const x of turns) {
      const r = reservation({ conversation: 'c-models', run: 'r', model: x.model, worstCaseUsd: x.cost === null ? null : 0.1 });
      t.same(await ledger.admit(r), { ok: true });
      await ledger.settle(r.id, settlement(r, 5, { costUsd: x.cost, billing: x.billing, planWorkUsd: x.billing === 'plan' ? 0.2 : null }));
    }
    const spend = await ledger.conversationSpend('c-models');
    t.match(spend, { conversation: 'c-models', tenant: 'acme', turns: 4, planTurns: 1, capUsd: null, parent: null });
    t.ok(Math.abs((spend?.spentUsd ?? 0) - 0.05) < 1e-9);
    t.equal(spend?.byModel['gpt-4o'].turns, 2);
    t.ok(Math.abs((spend?.byModel['gpt-4o'].spentUsd ?? 0) - 0.05) < 1e-9);
    t.same(spend?.byModel['llama'], { turns: 1, spentUsd: 0, unpricedTurns: 1 }, 'unknown cost adds no money, and is counted as unknown');
    t.same(Object.keys(spend?.byModel ?? {}).sort(), ['claude-plan', 'gpt-4o', 'llama']);
    const rows = [];
    for await (const row of ledger.exportRows(null, null)) rows.push(row);
    t.equal(rows.find((r) => r.model === 'llama')?.cost_usd, null, 'the row keeps null, not 0');
    t.equal(await ledger.conversationSpend('missing'), null);
  });

  t.test(`${factory.kind}: a conversation keeps its first parent, even when first requests race naming two`, async (t) => {
    const store = await factory.create(t);
    // Two handles on the same storage, as two replicas (or processes) would have.
    const handles = [store.ledger, await store.reopen()];
    await store.ledger.setConversationCap('p', 'acme', 100);
    await store.ledger.setConversationCap('q', 'acme', 100);
    const rs = Array.from({ length: 24 }, (_, i) =>
      reservation({ conversation: 'racer', run: 'race-run', parent: i % 2 === 0 ? 'p' : 'q', worstCaseUsd: 0.01 }),
    );
    const verdicts = await Promise.all(rs.map((r, i) => handles[i % 2]!.admit(r)));
    t.ok(verdicts.every((v) => v.ok), 'every admission went through (a race is run again, not failed)');
    const rows = (await collect(store.ledger.exportRows(null, null))).filter((row) => row.conversation === 'racer');
    const parents = new Set(rows.map((row) => row.parent));
    t.equal(rows.length, 24);
    t.equal(parents.size, 1, `one parent for every row: ${[...parents].join(', ')}`);
    const parent = [...parents][0]!;
    t.equal((await store.ledger.conversationSpend('racer'))?.parent, parent);
    // The reservations sit on that parent's cap alone.
    t.ok(Math.abs((await store.ledger.conversationSpend(parent))!.reservedUsd - 0.24) < 1e-9);
    t.equal((await store.ledger.conversationSpend(parent === 'p' ? 'q' : 'p'))!.reservedUsd, 0);
  });

  // Regression (outside audit): a child of a child was checked against its parent's cap only, and
  // its spend reached its parent's tasks_usd only — the top conversation's cap never saw it.
  t.test(`${factory.kind}: a child of a child is held by every cap above it, and its spend counts in each`, async (t) => {
    const { ledger } = await factory.create(t);
    // top ← mid ← low ← leaf: the top is capped at $1, and so is `mid`, below it, at $0.50.
    await ledger.setConversationCap('top', 'acme', 1);
    await ledger.setConversationCap('mid', 'acme', 0.5);
    await spend(ledger, 'top', null, 0.2);
    await spend(ledger, 'mid', 'top', 0.1);
    await spend(ledger, 'low', 'mid', 0.1);
    // 1. A conversation's tasks_usd is what every conversation below it spent.
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0.2), 'top: mid and low');
    t.ok(near((await ledger.conversationSpend('mid'))?.tasksUsd, 0.1), 'mid: low');
    t.match(await ledger.conversationSpend('low'), { parent: 'mid', spentUsd: 0.1, tasksUsd: 0 });
    // 2. `leaf`, two levels below `mid`, is held by mid's cap: 0.1 + 0.1 + 0.35 > 0.5.
    const over = await ledger.admit(reservation({ conversation: 'leaf', parent: 'low', run: 'leaf-run', worstCaseUsd: 0.35 }));
    t.match(over, { ok: false, scope: 'parent', limitUsd: 0.5, neededUsd: 0.35 });
    t.ok(!over.ok && over.scope === 'parent' && near(over.spentUsd, 0.2), "mid's figures");
    t.equal(await ledger.conversationSpend('leaf'), null, 'the refusal wrote nothing');
    // 3. What fits is reserved on every conversation above, and settled on each.
    const fits = reservation({ conversation: 'leaf', parent: 'low', run: 'leaf-run', worstCaseUsd: 0.25 });
    t.same(await ledger.admit(fits), { ok: true });
    for (const id of ['leaf', 'low', 'mid', 'top']) t.ok(near((await ledger.conversationSpend(id))?.reservedUsd, 0.25), `${id}: reserved`);
    await ledger.settle(fits.id, settlement(fits, 10, { costUsd: 0.2 }));
    for (const id of ['leaf', 'low', 'mid', 'top']) t.ok(near((await ledger.conversationSpend(id))?.reservedUsd, 0), `${id}: released`);
    t.ok(near((await ledger.conversationSpend('low'))?.tasksUsd, 0.2));
    t.ok(near((await ledger.conversationSpend('mid'))?.tasksUsd, 0.3));
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0.4));
    t.equal((await ledger.conversationSpend('top'))?.spentUsd, 0.2, "the top's own spend is its own");
    // 4. The top cap holds three levels down: lowered to what the family spent, nothing more goes.
    await ledger.setConversationCap('mid', 'acme', null);
    await ledger.setConversationCap('top', 'acme', 0.6);
    const top = await ledger.admit(reservation({ conversation: 'leaf', run: 'leaf-run', worstCaseUsd: 0.01 }));
    t.match(top, { ok: false, scope: 'parent', limitUsd: 0.6 }, 'the parent it has holds, named or not');
    t.ok(!top.ok && top.scope === 'parent' && near(top.spentUsd, 0.6));
    // 5. The row keeps its parent; a crash-recovered turn is charged to every conversation above.
    const lost = reservation({ conversation: 'leaf', parent: 'low', run: 'leaf-run', worstCaseUsd: null });
    t.same(await ledger.admit(lost), { ok: true });
    t.equal((await collect(ledger.exportRows(null, null))).find((row) => row.id === lost.id)?.parent, 'low');
    await ledger.setConversationCap('top', 'acme', null);
    const crashed = reservation({ conversation: 'leaf', run: 'leaf-run', worstCaseUsd: 0.05 });
    t.same(await ledger.admit(crashed), { ok: true });
    await ledger.settle(lost.id, settlement(lost, 1));
    t.equal(await ledger.recoverOpen(crashed.time + 600_000), 1);
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0.45), 'charged at its worst case');
    t.ok(near((await ledger.conversationSpend('top'))?.reservedUsd, 0));
  });

  t.test(`${factory.kind}: a conversation that gains a parent brings those below it under that parent's cap`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.setConversationCap('top', 'acme', 1);
    await spend(ledger, 'top', null, 0.6);
    // 1. `low` names `mid` before `mid` has a parent; one of its turns is still in flight.
    await spend(ledger, 'low', 'mid', 0.1);
    const inFlight = reservation({ conversation: 'low', run: 'low-run', worstCaseUsd: 0.3 });
    t.same(await ledger.admit(inFlight), { ok: true });
    // 2. Then `mid` names `top`: from now on `low` is held by the top's cap too.
    await spend(ledger, 'mid', 'top', 0);
    t.match(await ledger.admit(reservation({ conversation: 'low', run: 'low-run', worstCaseUsd: 0.5 })), {
      ok: false,
      scope: 'parent',
      limitUsd: 1,
    });
    // 3. The turn admitted before settles where it was reserved: nothing is released from the top
    // that was never reserved on it.
    await ledger.settle(inFlight.id, settlement(inFlight, 10, { costUsd: 0.2 }));
    t.equal((await ledger.conversationSpend('top'))?.reservedUsd, 0);
    t.ok(near((await ledger.conversationSpend('mid'))?.tasksUsd, 0.3));
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0), 'spent before it was below the top');
    // 4. A turn admitted now counts in the top.
    await spend(ledger, 'low', null, 0.1);
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0.1));
  });

  t.test(`${factory.kind}: naming a conversation below as the parent makes no loop`, async (t) => {
    const { ledger } = await factory.create(t);
    await spend(ledger, 'mid', 'top', 0.1);
    await spend(ledger, 'low', 'mid', 0.1);
    // `top` names `low`, below it: linked, the two would each hold the other. It stays the top.
    await spend(ledger, 'top', 'low', 0.2);
    t.match(await ledger.conversationSpend('top'), { parent: null, spentUsd: 0.2 });
    t.ok(near((await ledger.conversationSpend('top'))?.tasksUsd, 0.2));
    t.ok(near((await ledger.conversationSpend('low'))?.tasksUsd, 0), "top's turn is not low's task");
    // A conversation naming itself has no parent either.
    await spend(ledger, 'self', 'self', 0.1);
    t.match(await ledger.conversationSpend('self'), { parent: null, tasksUsd: 0 });
  });

  t.test(`${factory.kind}: at most ${MAX_ANCESTORS} conversations above one; a deeper one is refused and writes nothing`, async (t) => {
    const { ledger } = await factory.create(t);
    await ledger.setConversationCap('c0', 'acme', 10);
    for (let i = 1; i <= MAX_ANCESTORS; i++) await spend(ledger, `c${i}`, `c${i - 1}`, 0.01);
    t.ok(near((await ledger.conversationSpend('c0'))?.tasksUsd, MAX_ANCESTORS * 0.01), 'the deepest allowed counts at the top');
    const deep = reservation({ conversation: 'too-deep', parent: `c${MAX_ANCESTORS}`, run: 'deep-run', worstCaseUsd: 0.01 });
    t.same(await ledger.admit(deep), { ok: false, scope: 'nesting', limitAncestors: MAX_ANCESTORS });
    t.same(await ledger.admit({ ...deep, worstCaseUsd: null }), { ok: false, scope: 'nesting', limitAncestors: MAX_ANCESTORS }, 'money or not');
    t.equal(await ledger.conversationSpend('too-deep'), null);
    t.equal(await ledger.getRun('deep-run'), null);
    // A conversation that was within the bound is refused once the top gains a parent.
    await spend(ledger, 'c0', 'above', 0.01);
    t.match(await ledger.admit(reservation({ conversation: `c${MAX_ANCESTORS}`, run: 'again', worstCaseUsd: 0.01 })), { ok: false, scope: 'nesting' });
  });
}

