// The latest time noted for each 32-bit fingerprint of a string, in two typed arrays: ~24 bytes a
// distinct string at most half full, where a Map of the strings themselves costs ~100. For a string
// never noted it can answer a time (another string's, whose fingerprint it shares — the chance is
// about (distinct strings) / 2^32 a look-up); for one noted, it answers a time at least its latest.
// The SQLite ledger notes here where each request's message list ended, with the request's time, so
// that a conversation's look-up asks SQLite only for the chain hash most likely the answer, rather
// than for every hash of a long chain (ADR 0017, 0024).

const EMPTY = 0;

/** FNV-1a over the UTF-16 code units; never 0 (0 marks an empty slot). */
export function fingerprint(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0 || 1;
}

export class FingerprintTimes {
  private keys: Uint32Array;
  private times: Float64Array;
  private bits: number;
  private used = 0;

  constructor(expected = 0) {
    this.bits = 10;
    while (1 << this.bits < expected * 2) this.bits++;
    this.keys = new Uint32Array(1 << this.bits);
    this.times = new Float64Array(1 << this.bits);
  }

  /** Distinct fingerprints held. */
  get size(): number {
    return this.used;
  }

  /** A time at least the latest noted for `s`, or null when none was (then `s` never was). */
  timeOf(s: string): number | null {
    const fp = fingerprint(s);
    const mask = this.keys.length - 1;
    for (let i = this.home(fp); this.keys[i] !== EMPTY; i = (i + 1) & mask) if (this.keys[i] === fp) return this.times[i]!;
    return null;
  }

  /** Notes `time` for `s`: kept if it is later than what its fingerprint holds. */
  note(s: string, time: number): void {
    const fp = fingerprint(s);
    const mask = this.keys.length - 1;
    let i = this.home(fp);
    while (this.keys[i] !== EMPTY) {
      if (this.keys[i] === fp) {
        if (time > this.times[i]!) this.times[i] = time;
        return;
      }
      i = (i + 1) & mask;
    }
    this.keys[i] = fp;
    this.times[i] = time;
    if (++this.used * 2 > this.keys.length) this.grow();
  }

  private home(fp: number): number {
    return Math.imul(fp, 0x9e3779b1) >>> (32 - this.bits);
  }

  private grow(): void {
    const keys = this.keys;
    const times = this.times;
    this.bits++;
    this.keys = new Uint32Array(1 << this.bits);
    this.times = new Float64Array(1 << this.bits);
    const mask = this.keys.length - 1;
    for (let k = 0; k < keys.length; k++) {
      const fp = keys[k]!;
      if (fp === EMPTY) continue;
      let i = this.home(fp);
      while (this.keys[i] !== EMPTY) i = (i + 1) & mask;
      this.keys[i] = fp;
      this.times[i] = times[k]!;
    }
  }
}
