// "Raise to $X" at a money limit (SPEC §6): twice the conversation's cap or one and a half times the
// monthly budget, rounded UP to an amount a person would pick ($4, $4.50, $45 — never $4.14).
//
// The ladder (ADR 0006), in whole cents so float error cannot push a value off it:
//   up to $1          multiples of $0.25   (0.25, 0.50, 0.75, 1)
//   $1 – $10          multiples of $0.50   (1, 1.50, 2, … 7.50, … 10)
//   $10 – $100        multiples of $5      (15, 20, … 45, … 100)
//   $100 – $1,000     multiples of $50     and so on: each decade steps by 5 % of its top.
// Every rung is a round figure a person would type; the cost is an overshoot of at most one step
// (up to half the amount just past a decade's start, $10.01 → $15; about 5 % near its top).

/** The ladder's step, in cents, for an amount of `cents` (rungs are (upper/10, upper]). */
function stepCents(cents: number): number {
  if (cents <= 100) return 25;
  let step = 50;
  let upper = 1000;
  while (cents > upper) {
    step *= 10;
    upper *= 10;
  }
  return step;
}

/** Whole cents, rounding up, without letting 4.14 * 100 = 413.99999… become 413 or 415. */
function centsUp(usd: number): number {
  return Math.ceil(Math.round(usd * 1e6) / 1e4);
}

/** Round `amountUsd` up to the next rung of the ladder (at least $0.25: a raise is never to $0). */
export function raiseTo(amountUsd: number): number {
  if (!Number.isFinite(amountUsd) || amountUsd <= 0) return 0.25;
  const cents = Math.max(1, centsUp(amountUsd));
  const step = stepCents(cents);
  // Each decade's top is a multiple of its step, so rounding up never leaves the decade and the
  // result is itself a rung.
  return (Math.ceil(cents / step) * step) / 100;
}

/** The gap between `usd` (a rung) and the rung below it. */
export function ladderStepUsd(usd: number): number {
  return stepCents(Math.max(1, centsUp(usd))) / 100;
}

/** True when `usd` is exactly a rung of the ladder. */
export function isOnLadder(usd: number): boolean {
  if (!Number.isFinite(usd) || usd <= 0) return false;
  const cents = Math.round(usd * 100);
  if (Math.abs(cents - usd * 100) > 1e-6) return false;
  return cents % stepCents(cents) === 0;
}

/** A conversation at its cap: offer twice the cap. */
export function raiseToForConversation(capUsd: number): number {
  return raiseTo(2 * capUsd);
}

/** A tenant at its monthly budget: offer half again. */
export function raiseToForMonthly(budgetUsd: number): number {
  return raiseTo(1.5 * budgetUsd);
}
