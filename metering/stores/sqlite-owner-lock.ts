// One gateway process per SQLite ledger file (ADR 0011, ADR 0016).
//
// A gateway on SQLite settles every reservation it finds open at start: with one process per file,
// only a crash can have left one. A second process started on a file another one is serving — a
// rolling restart on a shared volume, `npm start` run twice — would take that process's requests in
// flight for a crash and charge them in full, and their real settlement would then be ignored.
//
// So the process that serves a ledger holds a lock beside it for as long as it runs: a write
// transaction left open on a small SQLite file next to the ledger (`<path>-lock`). SQLite takes it
// with an fcntl lock, which the operating system drops when the process ends however it ends — a
// SIGKILL leaves no stale lock behind — and which other connections in the same process see as
// held too. A process that finds the lock held waits for it (a restart's old process may still be
// draining its requests), then gives up with a message that says what is wrong.

import Database from 'better-sqlite3';

/**
 * How long a starting gateway waits at least for the process that holds the ledger: longer than a
 * stopping one holds it by default (a 25 s drain, then 5 s to exit). server/main.ts waits longer
 * when `TOLLGATE_DRAIN_MS` asks it to.
 */
export const OWNER_LOCK_WAIT_MS = 35_000;
const POLL_MS = 250;

export class LedgerInUseError extends Error {
  constructor(readonly path: string, waitedMs: number) {
    super(
      `the SQLite ledger ${path} is in use by another Tollgate process (its lock ${path}-lock stayed held for ${Math.round(waitedMs / 1000)} s): ` +
        'one process serves one SQLite file — stop the other process, or use a PostgreSQL store for replicas',
    );
    this.name = 'LedgerInUseError';
  }
}

export interface OwnerLock {
  release(): void;
}

function tryLock(path: string): OwnerLock | null {
  const db = new Database(`${path}-lock`);
  try {
    db.pragma('busy_timeout = 0');
    db.exec('BEGIN IMMEDIATE');
  } catch (err) {
    db.close();
    if ((err as { code?: string }).code === 'SQLITE_BUSY') return null;
    throw err;
  }
  return {
    release: () => {
      if (!db.open) return;
      if (db.inTransaction) db.exec('ROLLBACK');
      db.close();
    },
  };
}

export interface OwnerLockOptions {
  waitMs?: number;
  /** Called once, when the lock is found held and the wait begins. */
  onWait?: (path: string) => void;
}

/** Takes the ledger's owner lock, waiting up to `waitMs` for another process to let it go. */
export async function acquireOwnerLock(path: string, opts: OwnerLockOptions = {}): Promise<OwnerLock> {
  const waitMs = opts.waitMs ?? OWNER_LOCK_WAIT_MS;
  // Monotonic: a wall clock stepped back would wait for the lock as long again, one stepped on would give up at once.
  const started = performance.now();
  let told = false;
  for (;;) {
    const lock = tryLock(path);
    if (lock) return lock;
    const waited = performance.now() - started;
    if (waited >= waitMs) throw new LedgerInUseError(path, waited);
    if (!told) {
      told = true;
      opts.onWait?.(path);
    }
    await new Promise((resolve) => setTimeout(resolve, Math.min(POLL_MS, waitMs - waited)));
  }
}
