// Whether the SQLite ledger's file is still the one this connection opened. An open connection
// keeps writing to its file after the file is deleted or replaced (`rm`, another file moved onto
// the path, a volume mounted again): every write from then on is lost at the next start, which
// finds no file or another one. The gateway checks the path's device and inode against those it
// opened, on each readiness probe and at most once a second on admission, and refuses new work
// once they differ (503 `ledger_unavailable`, code `LEDGER_FILE_REPLACED`): a restart opens what
// the path now names. A file written over in place (`cp` onto the path) keeps its inode and is
// not seen here; SQLite does not survive that either (ADR 0005: restore with the gateway stopped).

import { statSync } from 'node:fs';

/** The code of the error a replaced ledger file gives (server/ledger-guard.ts counts it as the store being away). */
export const LEDGER_FILE_REPLACED = 'LEDGER_FILE_REPLACED';

/** Admissions look at the file at most this often (ms): a stat each, on the request path. */
const CHECK_EVERY_MS = 1_000;

function identityOf(path: string): string | null {
  try {
    const s = statSync(path);
    return `${s.dev}:${s.ino}`;
  } catch {
    return null;
  }
}

export class LedgerFileIdentity {
  private readonly opened: string | null;
  /** When the file was last looked at (ms, monotonic: a wall clock stepped back would stop the looks). */
  private checkedAt = -Infinity;
  private replaced = false;

  constructor(private readonly path: string) {
    this.opened = identityOf(path);
  }

  /** Throws once the file at `path` is gone or another; `always` skips the once-a-second limit. */
  check(always = false): void {
    if (this.opened === null) return;
    if (!this.replaced) {
      const now = performance.now();
      if (!always && now - this.checkedAt < CHECK_EVERY_MS) return;
      this.checkedAt = now;
      this.replaced = identityOf(this.path) !== this.opened;
    }
    if (this.replaced) {
      throw Object.assign(new Error(`the ledger file ${this.path} was deleted or replaced while the gateway ran: what it writes now would be lost; restart the gateway`), {
        code: LEDGER_FILE_REPLACED,
      });
    }
  }
}
