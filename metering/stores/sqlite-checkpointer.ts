// Checkpoints the SQLite ledger's write-ahead log from a worker thread (ADR 0012).
//
// In WAL mode every commit appends pages to the `-wal` file, and a checkpoint copies them back into
// the database file — with an fsync of each file under synchronous=NORMAL or FULL. Left to SQLite,
// the connection that commits past 1,000 WAL pages runs that checkpoint itself, on the event loop:
// about a third of the ledger's wall time per request (ADR 0012), paid as a stall of several
// milliseconds every few thousand requests. A second connection in a worker thread does the
// copying and the syncing on the other core instead; the gateway's connection keeps a far larger
// auto-checkpoint threshold only as a safety net, should the worker fall behind or fail.
//
// The worker starts only once the WAL has grown past START_BYTES, so a short-lived ledger (a test, a
// CLI) never pays for a thread. The checkpoint is PASSIVE: it never blocks the writer.

import { Worker } from 'node:worker_threads';
import { createRequire } from 'node:module';
import { statSync } from 'node:fs';

/** The WAL size at which the worker is started (about 256 pages). */
export const START_BYTES = 1024 * 1024;
/** At most one checkpoint per this many ms while writes go on. */
export const INTERVAL_MS = 100;
/** The gateway connection's own threshold while the worker runs (pages; ~40 MB): a safety net. */
export const FALLBACK_AUTOCHECKPOINT_PAGES = 10_000;
/** SQLite's default, restored if the worker fails. */
export const DEFAULT_AUTOCHECKPOINT_PAGES = 1_000;
/** Commits between two looks at the WAL's size before the worker runs. */
const COMMITS_PER_LOOK = 32;
/** After a checkpoint that failed (a full disk, say), the next one waits this long (ms). */
export const RETRY_CHECKPOINT_MS = 1_000;
/** After the worker itself failed, a new one is started no sooner than this (ms). */
export const RESTART_WORKER_MS = 30_000;

// Plain CommonJS, evaluated by the worker: no TypeScript loader needed, so it starts in ~70 ms.
const SCRIPT = `
const { parentPort, workerData } = require('node:worker_threads');
const Database = require(workerData.module);
const db = new Database(workerData.path);
db.pragma('busy_timeout = 5000');
// A checkpoint syncs the files as this connection's synchronous setting says: the ledger's own.
db.pragma('synchronous = ' + workerData.synchronous);
parentPort.on('message', (m) => {
  if (m === 'stop') {
    db.close();
    parentPort.close();
    return;
  }
  try {
    const r = db.pragma('wal_checkpoint(PASSIVE)')[0];
    parentPort.postMessage({ ok: true, busy: r.busy, log: r.log, checkpointed: r.checkpointed });
  } catch (e) {
    parentPort.postMessage({ ok: false, error: String((e && (e.message || e.code)) || e) });
  }
});
`;

export interface CheckpointerStats {
  /** Checkpoints the worker has completed. */
  checkpoints: number;
  /**
   * Sum of the frames each checkpoint reported as copied: a frame still in the WAL at the next
   * checkpoint is counted again, so this measures work seen, not distinct pages.
   */
  framesCheckpointed: number;
  running: boolean;
  /** The last error from the worker, if it failed (the gateway's connection then checkpoints until it is restarted). */
  failed: string | null;
  /** The last checkpoint's error, while checkpoints fail (the worker lives on and tries again). */
  lastError: string | null;
  /** Workers started again after one failed. */
  restarts: number;
}

/** A change in the checkpointer's health, said once when it happens (the gateway logs it). */
export type CheckpointEvent =
  | { event: 'checkpoint-failed'; reason: string }
  | { event: 'checkpoint-recovered' }
  | { event: 'worker-failed'; reason: string; retryInMs: number };

export type CheckpointReply = { ok: true; busy: number; log: number; checkpointed: number } | { ok: false; error: string };

export class WalCheckpointer {
  private readonly walPath: string;
  private worker: Worker | null = null;
  private inFlight = false;
  /** When the last checkpoint was asked for (ms, monotonic). */
  private lastStart = -Infinity;
  private commits = 0;
  private closed = false;
  private readonly s: CheckpointerStats = { checkpoints: 0, framesCheckpointed: 0, running: false, failed: null, lastError: null, restarts: 0 };
  /**
   * No checkpoint (or, once failed, no new worker) before this time (ms, monotonic: on the wall
   * clock, a step back of an hour stopped checkpoints for that hour while the -wal file grew).
   */
  private notBefore = 0;

  /**
   * @param setAutocheckpoint sets the gateway connection's own threshold (pages): raised while the
   *   worker runs, restored if it fails.
   */
  constructor(
    private readonly path: string,
    private readonly synchronous: 'NORMAL' | 'FULL',
    private readonly setAutocheckpoint: (pages: number) => void,
    private readonly startBytes: number = START_BYTES,
    private readonly restartAfterMs: number = RESTART_WORKER_MS,
    private readonly onEvent: (e: CheckpointEvent) => void = () => {},
  ) {
    this.walPath = `${path}-wal`;
  }

  /** Called after each commit; cheap: a size look every few commits, a message at most every 100 ms. */
  afterCommit(): void {
    if (this.closed || this.inFlight) return;
    if (this.worker === null) {
      if (++this.commits % COMMITS_PER_LOOK !== 0 || this.walBytes() < this.startBytes) return;
      // A worker that failed is replaced once a while has passed: a cause that has gone (the disk
      // had filled) must not leave checkpoints on the event loop until the next start.
      if (this.s.failed !== null) {
        if (performance.now() < this.notBefore) return;
        this.s.restarts++;
      }
      this.start();
    }
    const now = performance.now();
    if (now - this.lastStart < INTERVAL_MS || now < this.notBefore) return;
    this.lastStart = now;
    this.inFlight = true;
    this.worker!.postMessage('checkpoint');
  }

  /** What the worker said of a checkpoint (public for tests: a real failed checkpoint is hard to make). */
  replied(r: CheckpointReply): void {
    this.inFlight = false;
    if (r.ok) {
      this.s.checkpoints++;
      this.s.framesCheckpointed += r.checkpointed;
      if (this.s.lastError !== null) this.onEvent({ event: 'checkpoint-recovered' });
      this.s.lastError = null;
    } else {
      // The checkpoint failed, not the worker: it tries again a little later (said once, not each time).
      if (this.s.lastError === null) this.onEvent({ event: 'checkpoint-failed', reason: r.error });
      this.s.lastError = r.error;
      this.notBefore = performance.now() + RETRY_CHECKPOINT_MS;
    }
  }

  stats(): CheckpointerStats {
    return { ...this.s };
  }

  async close(): Promise<void> {
    this.closed = true;
    const w = this.worker;
    if (w === null) return;
    this.worker = null;
    const exited = new Promise<void>((resolve) => w.once('exit', () => resolve()));
    // Held until it has closed its connection: a close that is awaited must not end the process first.
    w.ref();
    w.postMessage('stop');
    await exited;
    this.s.running = false;
  }

  private walBytes(): number {
    try {
      return statSync(this.walPath).size;
    } catch {
      return 0;
    }
  }

  private start(): void {
    const module = createRequire(import.meta.url).resolve('better-sqlite3');
    const w = new Worker(SCRIPT, { eval: true, workerData: { module, path: this.path, synchronous: this.synchronous } });
    // It must not keep the process alive on its own, nor outlive a gateway that forgot to close.
    w.unref();
    this.worker = w;
    this.s.running = true;
    this.s.failed = null;
    this.setAutocheckpoint(FALLBACK_AUTOCHECKPOINT_PAGES);
    w.on('message', (r: CheckpointReply) => this.replied(r));
    // An error thrown in the worker can arrive as a plain object ({ code: 'SQLITE_CANTOPEN' }).
    w.on('error', (e: unknown) => {
      const o = e as { message?: unknown; code?: unknown };
      this.fail(String((typeof o?.message === 'string' && o.message) || (typeof o?.code === 'string' && o.code) || e));
    });
    w.on('exit', () => {
      if (!this.closed && this.worker === w) this.fail('checkpoint worker exited');
    });
  }

  private fail(reason: string): void {
    this.s.failed = reason;
    this.notBefore = performance.now() + this.restartAfterMs;
    this.s.running = false;
    this.inFlight = false;
    if (!this.closed) {
      this.setAutocheckpoint(DEFAULT_AUTOCHECKPOINT_PAGES);
      this.onEvent({ event: 'worker-failed', reason, retryInMs: this.restartAfterMs });
    }
    const w = this.worker;
    this.worker = null;
    void w?.terminate();
  }
}
