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
  t.equal(raiseToForConversation(0.1), 0.25);
});

t.test('the ladder, decade by decade', async (t) => {
  const cases: Array<[number, number]> = [
    [0, 0.25], // a raise is never to $0
    [0.0001, 0.25],
    [0.25, 0.25],
    [0.26, 0.5],
    [0.99, 1],
    [1, 1],
    [1.01, 1.5],
    [4.13, 4.5],
    [4.5, 4.5],
    [9.51, 10],
    [10, 10],
    [10.01, 15],
    [41, 45],
    [99.99, 100],
    [100.01, 150],
    [999, 1000],
    [1000.5, 1500],
    [12_345, 15_000],
  ];
  for (const [input, want] of cases) t.equal(raiseTo(input), want, `${input} → ${want}`);
});

t.test('float noise does not push a rung up a step', async (t) => {
  t.equal(raiseTo(0.1 + 0.2 + 0.2), 0.5, '0.5000000000000001 is $0.50');
  t.equal(raiseTo(2 * 2.07), 4.5);
  t.equal(raiseTo(1.1 * 3), 3.5, '3.3000000000000003 → $3.50');
});

t.test('isOnLadder', async (t) => {
  for (const x of [0.25, 0.5, 1, 1.5, 4, 4.5, 7.5, 10, 15, 45, 100, 150, 1000, 1500]) t.ok(isOnLadder(x), `${x} on`);
  for (const x of [0, -1, 0.3, 1.25, 4.13, 4.14, 12, 46, 110, 1250]) t.notOk(isOnLadder(x), `${x} off`);
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
    if (r > 0.25 && !(r - ladderStepUsd(r) < amount)) failures++;
    if (raiseTo(r) !== r) failures++;
  }
  t.equal(failures, 0);
});
