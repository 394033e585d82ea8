// How old a time the ledger holds is, by this process's wall clock. Times in the ledger (a head's,
// a run's start) are wall-clock times, written by whichever replica served the request: they must
// be, to mean anything across restarts and replicas. A wall clock can be stepped back (NTP, an
// operator, a VM resumed from a snapshot), and then what was written before the step lies in the
// future: an age below zero passes every "not older than" test for as long as the step.

/**
 * How far in the future a stored time may lie and still be read as now (ms): replicas on
 * PostgreSQL write with their own clocks, which NTP keeps within milliseconds of each other, and
 * seldom more than a second or two apart. Further ahead than this, a clock was stepped.
 */
export const CLOCK_SKEW_TOLERANCE_MS = 5_000;

/**
 * Milliseconds from `then` to `now` (0 for a time just ahead, within the tolerance), or null when
 * `then` lies further in the future: the age is unknown, and each caller decides conservatively.
 */
export function ageMs(now: number, then: number): number | null {
  const age = now - then;
  if (age < -CLOCK_SKEW_TOLERANCE_MS) return null;
  return Math.max(0, age);
}
