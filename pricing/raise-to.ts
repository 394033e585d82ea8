// "Raise to $X" at a money limit (SPEC §6): twice the conversation's cap or one and a half times the
// monthly budget, rounded UP to an amount a person would pick ($4, $4.50, $45 — never $4.14).
//
// The ladder (ADR 0006), in whole cents so float error cannot push a value off it: every whole cent
// below $0.10, then in each decade
//   1, 1.20, 1.50, 2, 2.50, 3, 3.50, 4, 4.50, 5, 6, 7.50, 8  (× $0.10, $1, $10, $100, …)
// Every rung is a round figure a person would type, and above $0.10 the overshoot is at most a
// third (just past $1.50 → $2) and otherwise a quarter or less: a $60 cap offers $120, not $150.
// The lowest rung is one cent (a raise is never to $0).

/** The rungs of one decade, in units of a tenth of the decade's first rung. */
const MANTISSAS = [10, 12, 15, 20, 25, 30, 35, 40, 45, 50, 60, 75, 80] as const;
/** Below this many cents, every whole cent is a rung. */
const CENT_RUNGS_BELOW = 10;

/**
 * Whole cents, rounding up. A sum within a billionth of a dollar above a whole cent is that cent:
 * float noise (4.14 * 100 = 413.99999…, 0.1 + 0.2 + 0.2 = 0.5000000000000001) must not push a
 * figure a step, and admission allows the same billionth (USD_EPSILON) — so a sum past that is
 * rounded up, and the figure still admits it.
 */
function centsUp(usd: number): number {
  return Math.ceil(usd * 100 - 1e-7);
}

/** The lowest rung at or above `cents` (whole cents to 9, then 10–80 cents, $1–$8, …). */
function rungAtOrAbove(cents: number): number {
  const c = Math.max(1, cents);
  if (c < CENT_RUNGS_BELOW) return c;
  for (let scale = 1; ; scale *= 10) {
    for (const m of MANTISSAS) if (m * scale >= c) return m * scale;
  }
}

/** The rung just below `cents` (itself a rung above one cent): the cent before, the next decade down's top, or the mantissa before. */
function rungBelow(cents: number): number {
  if (cents <= CENT_RUNGS_BELOW) return cents - 1;
  let scale = 1;
  while (MANTISSAS[MANTISSAS.length - 1] * scale < cents) scale *= 10;
  const i = MANTISSAS.findIndex((m) => m * scale === cents);
  return i > 0 ? MANTISSAS[i - 1]! * scale : MANTISSAS[MANTISSAS.length - 1] * (scale / 10);
}

/** Round `amountUsd` up to the next rung of the ladder (at least one cent: a raise is never to $0). */
export function raiseTo(amountUsd: number): number {
  if (!Number.isFinite(amountUsd) || amountUsd <= 0) return 0.01;
  return rungAtOrAbove(Math.max(1, centsUp(amountUsd))) / 100;
}

/** The gap between `usd` (a rung above the floor) and the rung below it. */
export function ladderStepUsd(usd: number): number {
  const cents = rungAtOrAbove(Math.max(1, centsUp(usd)));
  return (cents - rungBelow(cents)) / 100;
}

/** True when `usd` is exactly a rung of the ladder. */
export function isOnLadder(usd: number): boolean {
  if (!Number.isFinite(usd) || usd <= 0) return false;
  const cents = Math.round(usd * 100);
  if (Math.abs(cents - usd * 100) > 1e-6) return false;
  return cents >= 1 && rungAtOrAbove(cents) === cents;
}

/** A conversation at its cap: offer twice the cap. */
export function raiseToForConversation(capUsd: number): number {
  return raiseTo(2 * capUsd);
}

/** A tenant at its monthly budget: offer half again. */
export function raiseToForMonthly(budgetUsd: number): number {
  return raiseTo(1.5 * budgetUsd);
}
