// A wall clock (Date.now) that a test can step, as NTP, an operator or a resumed VM can. Intervals
// measured inside one process must not move with it (they are on performance.now); the times the
// ledger stores do (the gateway's own `clock`, faked apart from this by test/helpers/gateway.ts).

interface Teardown {
  teardown(fn: () => unknown): void;
}

export const HOUR_MS = 3_600_000;

export interface WallClock {
  /** Moves Date.now by `ms` from here on (negative: back). */
  step(ms: number): void;
}

const realNow = Date.now;

/**
 * Put in place before what is tested is made: code that kept a reference to Date.now (a default
 * parameter) reads this one too, as it would read the system's stepped clock. Restored at teardown.
 */
export function steppableWallClock(t: Teardown): WallClock {
  let offset = 0;
  Date.now = () => realNow() + offset;
  t.teardown(() => {
    Date.now = realNow;
  });
  return {
    step(ms) {
      offset += ms;
    },
  };
}

export const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
