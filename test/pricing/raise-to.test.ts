import t from 'tap';
import { raiseTo, isOnLadder, ladderStepUsd, raiseToForConversation, raiseToForMonthly } from '../../pricing/raise-to.js';

t.test('SPEC cases', async (t) => {
  t.equal(raiseToForConversation(2), 4, '$2 cap → $4');
  t.equal(raiseToForConversation(2.07), 4.5, '$2.07 cap → $4.50, never $4.14');
  t.equal(raiseToForMonthly(30), 45, 'monthly $30 → $45');
  t.equal(raiseToForMonthly(5), 7.5, 'monthly $5 → $7.50');
  t.equal(raiseToForConversation(2.5), 5);
  t.equal(raiseToForMonthly(50), 75);
  t.equal(raiseToForMonthly(100), 150);
  t.equal(raiseToForConversation(0.1), 0.2, 'a $0.10 cap → $0.20 (no floor at $0.25)');
  t.equal(raiseToForConversation(0.001), 0.01, 'a tenth of a cent → one cent, the lowest rung');
  t.equal(raiseToForConversation(0.03), 0.06);
  t.equal(raiseToForMonthly(0.05), 0.08);
});

t.test('the ladder, decade by decade', async (t) => {
  const cases: Array<[number, number]> = [
    [0, 0.01], // a raise is never to $0
    [0.0001, 0.01],
    [0.01, 0.01],
    [0.011, 0.02],
    [0.09, 0.09],
    [0.091, 0.1],
    [0.11, 0.12],
    [0.16, 0.2],
    [0.25, 0.25],
    [0.26, 0.3],
    [0.76, 0.8],
    [0.99, 1],
    [1, 1],
    [1.01, 1.2],
    [1.21, 1.5],
    [3.01, 3.5],
    [4.13, 4.5],
    [4.5, 4.5],
    [5.01, 6],
    [6.01, 7.5],
    [7.51, 8],
    [8.01, 10],
    [9.51, 10],
    [10, 10],
    [10.01, 12],
    [41, 45],
    [99.99, 100],
    [100.01, 120],
    [999, 1000],
    [1000.5, 1200],
    [12_345, 15_000],
  ];
  for (const [input, want] of cases) t.equal(raiseTo(input), want, `${input} → ${want}`);
});

t.test('just past a decade the offer stays close (regression: $60 cap → $150)', async (t) => {
  // Multiples of the decade's step rounded 2 × $60 = $120 up to $150, though $120 is itself a
  // figure a person would pick.
  t.equal(raiseToForConversation(60), 120, '$60 cap → $120');
  t.equal(raiseToForConversation(5.1), 12, '$5.10 cap → $12 (2× is $10.20), not $15');
  t.equal(raiseToForConversation(510), 1200, '$510 cap → $1,200, not $1,500');
  t.equal(raiseToForMonthly(700), 1200, '$700 month → $1,200 (1.5× is $1,050), not $1,500');
});

t.test('float noise does not push a rung up a step', async (t) => {
  t.equal(raiseTo(0.1 + 0.2 + 0.2), 0.5, '0.5000000000000001 is $0.50');
  t.equal(raiseTo(2 * 2.07), 4.5);
  t.equal(raiseTo(1.1 * 3), 3.5, '3.3000000000000003 → $3.50');
  t.equal(raiseTo(0.1 * 3 * 4), 1.2, '1.2000000000000002 is $1.20');
});

t.test('isOnLadder', async (t) => {
  for (const x of [0.01, 0.05, 0.09, 0.1, 0.12, 0.2, 0.25, 0.3, 0.5, 1, 1.2, 1.5, 4, 4.5, 7.5, 8, 10, 12, 15, 45, 100, 120, 150, 1000, 1500]) t.ok(isOnLadder(x), `${x} on`);
  for (const x of [0, -1, 0.005, 0.11, 0.33, 1.25, 4.13, 4.14, 5.5, 7, 9, 46, 110, 1250]) t.notOk(isOnLadder(x), `${x} off`);
});

t.test('property: result ≥ input, on the ladder, and the rung below it is under the input', async (t) => {
  // A deterministic generator (no flaky seeds): amounts spread over eight decades.
  let seed = 12345;
  const next = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
  let failures = 0;
  for (let i = 0; i < 5000; i++) {
    const amount = Math.round(10 ** (next() * 8 - 3) * 1e6) / 1e6; // $0.001 … $100,000
    const r = raiseTo(amount);
    if (!(r >= amount - 1e-9) || !isOnLadder(r)) failures++;
    // Minimality: the rung below the result is already under the input.
    if (r > 0.01 && !(r - ladderStepUsd(r) < amount)) failures++;
    if (raiseTo(r) !== r) failures++;
  }
  t.equal(failures, 0);
});
