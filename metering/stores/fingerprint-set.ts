// A counting set of 32-bit fingerprints of strings, in two typed arrays: ~8 bytes a distinct
// string at most half full, where a Set of the strings themselves costs ~100. It can say "maybe"
// for a string never added — the chance is about (distinct strings) / 2^32 a look-up — and never
// says "no" for one added more times than removed. The SQLite ledger keeps the last chain hash of
// every conversation head here, so that a request whose messages end no head's chain skips the
// look-up query (ADR 0017).

const EMPTY = 0;

/** FNV-1a over the UTF-16 code units; never 0 (0 marks an empty slot). */
export function fingerprint(s: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < s.length; i++) h = Math.imul(h ^ s.charCodeAt(i), 0x01000193);
  return h >>> 0 || 1;
}

export class FingerprintSet {
  private keys: Uint32Array;
  private counts: Uint32Array;
  private bits: number;
  private used = 0;

  constructor(expected = 0) {
    this.bits = 10;
    while (1 << this.bits < expected * 2) this.bits++;
    this.keys = new Uint32Array(1 << this.bits);
    this.counts = new Uint32Array(1 << this.bits);
  }

  /** Distinct fingerprints held. */
  get size(): number {
    return this.used;
  }

  has(s: string): boolean {
    return this.slotOf(fingerprint(s)) !== -1;
  }

  add(s: string): void {
    const fp = fingerprint(s);
    const mask = this.keys.length - 1;
    let i = this.home(fp);
    while (this.keys[i] !== EMPTY) {
      if (this.keys[i] === fp) {
        this.counts[i]!++;
        return;
      }
      i = (i + 1) & mask;
    }
    this.keys[i] = fp;
    this.counts[i] = 1;
    if (++this.used * 2 > this.keys.length) this.grow();
  }

  /** Takes one count of `s` away; a string not held is ignored. */
  remove(s: string): void {
    let i = this.slotOf(fingerprint(s));
    if (i === -1) return;
    if (--this.counts[i]! > 0) return;
    // Backward-shift deletion: entries after the hole that would no longer be reached from their
    // home slot move into it, so every probe sequence stays unbroken without tombstones.
    const mask = this.keys.length - 1;
    let j = i;
    for (;;) {
      j = (j + 1) & mask;
      const fp = this.keys[j]!;
      if (fp === EMPTY) break;
      const home = this.home(fp);
      // Can the entry at j move to i? Only if its home is not cyclically within (i, j].
      const between = i <= j ? home > i && home <= j : home > i || home <= j;
      if (between) continue;
      this.keys[i] = fp;
      this.counts[i] = this.counts[j]!;
      i = j;
    }
    this.keys[i] = EMPTY;
    this.counts[i] = 0;
    this.used--;
  }

  private home(fp: number): number {
    return Math.imul(fp, 0x9e3779b1) >>> (32 - this.bits);
  }

  private slotOf(fp: number): number {
    const mask = this.keys.length - 1;
    for (let i = this.home(fp); this.keys[i] !== EMPTY; i = (i + 1) & mask) if (this.keys[i] === fp) return i;
    return -1;
  }

  private grow(): void {
    const keys = this.keys;
    const counts = this.counts;
    this.bits++;
    this.keys = new Uint32Array(1 << this.bits);
    this.counts = new Uint32Array(1 << this.bits);
    const mask = this.keys.length - 1;
    for (let k = 0; k < keys.length; k++) {
      const fp = keys[k]!;
      if (fp === EMPTY) continue;
      let i = this.home(fp);
      while (this.keys[i] !== EMPTY) i = (i + 1) & mask;
      this.keys[i] = fp;
      this.counts[i] = counts[k]!;
    }
  }
}
