// A warning about a state that lasts (a llama.cpp server down, so every request falls back to the
// byte estimate) is written once, then at most once a minute with how many were left out: each
// request has its own line already (SPEC §10), and the state is news only when it starts. Keys name the state and its subject.

export const NOW_AND_THEN_MS = 60_000;

export class NowAndThen {
  private readonly last = new Map<string, { at: number; held: number }>();

  /** `clock`: monotonic (ms), so that a wall clock stepped back does not silence a warning for as long. */
  constructor(private readonly clock: () => number = () => performance.now(), private readonly everyMs = NOW_AND_THEN_MS) {}

  /** Null while `key` was written less than a minute ago; else how many were held back since. */
  due(key: string): { heldBack: number } | null {
    const now = this.clock();
    const seen = this.last.get(key);
    if (seen && now - seen.at < this.everyMs) {
      seen.held++;
      return null;
    }
    this.last.set(key, { at: now, held: 0 });
    return { heldBack: seen?.held ?? 0 };
  }
}
