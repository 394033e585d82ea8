import t from 'tap';
import { moneyRefusal, modelNotPriced, refusalChoices, raiseToFor } from '../../pricing/refusal-choices.js';
import type { CheaperModel } from '../../pricing/cheaper-models.js';

const cheaper: CheaperModel[] = [{ model: 'llama', billing: 'local', upstream: 'home', tools: true }];

t.test('conversation_cap_reached: exact figures, numbers in details, three choices', async (t) => {
  const r = moneyRefusal({ scope: 'conversation', spentUsd: 1.84, limitUsd: 2, neededUsd: 0.31, cheaperModels: cheaper });
  t.equal(r.status, 402);
  t.equal(r.code, 'conversation_cap_reached');
  t.equal(r.message, 'conversation cap reached: spent $1.84 of $2.00, this request needs up to $0.31');
  t.same(r.details, {
    scope: 'conversation',
    spent_usd: 1.84,
    reserved_usd: 0,
    limit_usd: 2,
    needed_usd: 0.31,
    spent: 1.84,
    cap: 2,
    needed: 0.31,
    limit_to_admit_usd: 2.5,
    choices: { raise_to_usd: 4, cheaper_models: cheaper, stop: true },
  });
});

t.test("a parent's cap answers with the same code and says whose cap", async (t) => {
  const r = moneyRefusal({ scope: 'parent', spentUsd: 4.9, limitUsd: 5, neededUsd: 0.2, cheaperModels: [] });
  t.equal(r.code, 'conversation_cap_reached');
  t.equal(r.message, 'parent conversation cap reached: spent $4.90 of $5.00, this request needs up to $0.20');
  t.equal((r.details.choices as { raise_to_usd: number }).raise_to_usd, 10);
});

t.test('monthly_budget_reached: half again, on the ladder', async (t) => {
  const r = moneyRefusal({ scope: 'monthly', spentUsd: 29.5, limitUsd: 30, neededUsd: 1.2, cheaperModels: [] });
  t.equal(r.code, 'monthly_budget_reached');
  t.equal(r.message, 'monthly budget reached: spent $29.50 of $30.00 this month, this request needs up to $1.20');
  t.same(r.details.choices, { raise_to_usd: 45, cheaper_models: [], stop: true });
  // SPEC §6 names the monthly figures spent, budget, needed.
  t.same([r.details.spent, r.details.budget, r.details.needed, r.details.cap], [29.5, 30, 1.2, undefined]);
});

t.test('a request larger than the whole limit says so; the raise is still twice the cap, and the figure that admits it is given apart', async (t) => {
  const r = moneyRefusal({ scope: 'conversation', spentUsd: 0.1, limitUsd: 2, neededUsd: 5.2, cheaperModels: [] });
  t.equal(r.message, 'conversation cap reached: this request needs up to $5.20, more than the whole conversation cap of $2.00');
  // SPEC §6: twice the cap ($4), though that would not admit $0.10 + $5.20; the rung above $5.30 is given apart.
  t.equal(raiseToFor('conversation', 2, 0.1, 5.2), 4);
  t.equal(refusalChoices({ scope: 'conversation', spentUsd: 0.1, limitUsd: 2, neededUsd: 5.2, cheaperModels: [] }).raise_to_usd, 4);
  t.equal(r.details.limit_to_admit_usd, 6);
  t.equal((r.details.choices as { raise_to_usd: number }).raise_to_usd, 4);
  // Held money counts toward what admits it: $0.50 spent + $0.30 held + $0.40 needed → $1.20.
  t.equal(moneyRefusal({ scope: 'conversation', spentUsd: 0.5, reservedUsd: 0.3, limitUsd: 1, neededUsd: 0.4, cheaperModels: [] }).details.limit_to_admit_usd, 1.2);
  // A cheaper model's room past the cap counts: $1.90 + $0.70 needs $2.60, less $0.25 of room → $2.50.
  t.equal(moneyRefusal({ scope: 'conversation', spentUsd: 1.9, limitUsd: 2, neededUsd: 0.7, roomUsd: 0.25, cheaperModels: [] }).details.limit_to_admit_usd, 2.5);
  // Half a micro-dollar past a rung is past it (admission allows a billionth, no more).
  t.equal(moneyRefusal({ scope: 'conversation', spentUsd: 0, limitUsd: 0.05, neededUsd: 0.10000035, cheaperModels: [] }).details.limit_to_admit_usd, 0.12);
  // A $0 cap has no multiple: the raise offered is the one that admits the request.
  t.equal(raiseToFor('conversation', 0, 0, 0.031), 0.04);
  // An unpriced model's cost is unknown: so is what would admit it.
  t.equal(moneyRefusal({ scope: 'monthly', spentUsd: 1, limitUsd: 1, neededUsd: null, cheaperModels: [] }).details.limit_to_admit_usd, null);
  const m = moneyRefusal({ scope: 'monthly', spentUsd: 0, limitUsd: 50, neededUsd: 80, cheaperModels: [] });
  t.equal(m.message, 'monthly budget reached: this request needs up to $80.00, more than the whole monthly budget of $50.00');
});

t.test('sub-cent figures are not shown as $0.00', async (t) => {
  const r = moneyRefusal({ scope: 'conversation', spentUsd: 0.0995, limitUsd: 0.1, neededUsd: 0.0031, cheaperModels: [] });
  t.match(r.message, /needs up to \$0\.0031$/);
});

t.test('model_not_priced names the model and the way out', async (t) => {
  const r = modelNotPriced('acme-9');
  t.equal(r.status, 402);
  t.equal(r.code, 'model_not_priced');
  t.equal(r.param, 'model');
  t.equal(r.message, 'no price for model "acme-9": add it to the price overrides file (prices.overrides) or set prices.unpriced to "allow"');
  t.same(r.details, { model: 'acme-9', choices: { raise_to_usd: null, cheaper_models: [], stop: true } });
});

t.test('figures that two decimals would make read alike get more decimals, in the whole message', async (t) => {
  t.equal(
    moneyRefusal({ scope: 'parent', spentUsd: 0, limitUsd: 0.025, neededUsd: 0.034, cheaperModels: [] }).message,
    "parent conversation cap reached: this request needs up to $0.034, more than the whole parent conversation's cap of $0.025",
  );
  t.equal(
    moneyRefusal({ scope: 'conversation', spentUsd: 0.0213, limitUsd: 0.05, neededUsd: 0.0291, cheaperModels: [] }).message,
    'conversation cap reached: spent $0.02 of $0.05, this request needs up to $0.03',
    'distinct at two decimals: left as they are',
  );
  t.equal(
    moneyRefusal({ scope: 'monthly', spentUsd: 9.996, limitUsd: 10, neededUsd: 0.02, cheaperModels: [] }).message,
    'monthly budget reached: spent $9.996 of $10.000 this month, this request needs up to $0.020',
  );
  // An outside audit: the decimals that tell $0.012 from $0.010 made a need of $0.00012 read $0.000.
  t.equal(
    moneyRefusal({ scope: 'monthly', spentUsd: 0.012, limitUsd: 0.01, neededUsd: 0.00012, cheaperModels: [] }).message,
    'monthly budget reached: spent $0.012 of $0.010 this month, this request needs up to $0.00012',
    'a need that is not zero is never said as $0.000',
  );
});

t.test('a limit partly held by requests still running says so apart from what was spent', async (t) => {
  const r = moneyRefusal({ scope: 'conversation', spentUsd: 0.5, reservedUsd: 0.3, limitUsd: 1, neededUsd: 0.4, cheaperModels: [] });
  t.equal(r.message, 'conversation cap reached: spent $0.50 of $1.00 and $0.30 is held by requests still running, this request needs up to $0.40');
  t.match(r.details, { spent_usd: 0.5, reserved_usd: 0.3, needed_usd: 0.4, spent: 0.5 });
  t.equal((r.details.choices as { raise_to_usd: number }).raise_to_usd, 2, 'twice the cap admits it (0.5 + 0.3 + 0.4)');
});
