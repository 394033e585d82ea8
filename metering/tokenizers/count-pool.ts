// A small pool of worker threads that count large texts off the main thread (SPEC §3: the event
// loop is never stalled for more than a few milliseconds per request; ADR 0009).
//
// - Workers start lazily, on the first job that needs one, up to `size` (1–2).
// - A job of more than LARGE_JOB_CHARS has a worker of its own, started on the first such job, so
//   that one huge prompt (seconds of counting) does not hold up every other request's count: large
//   jobs queue behind each other, not in front of small ones.
// - Each keeps its own tiktoken encoders for its whole life (count-worker.ts).
// - An idle worker is unref'd: the pool never keeps a process alive. While it has jobs in flight it
//   is ref'd, so a script awaiting a count does not exit under it.
// - A worker that dies rejects its jobs (the pipeline then falls back to the labelled byte
//   estimate) and is replaced by the next job.
// - `close()` ends every worker; the app calls it on shutdown.
import { Worker } from 'node:worker_threads';
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import type { PieceCount } from './bounded-encode.js';
import type { CountReply, CountRequest } from './count-protocol.js';

export const MAX_POOL_SIZE = 2;

/** Texts of a job past this many characters (1 Mi) go to the large-job worker. */
export const LARGE_JOB_CHARS = 1 << 20;

export interface CountPoolOptions {
  /** Worker threads at most (1–2, default 1). */
  size?: number;
}

export interface CountPoolStats {
  /** Jobs sent to a worker (each job is one batch of texts). */
  jobs: number;
  /** Workers started, replacements included. */
  started: number;
  /** Workers that exited without being asked to. */
  crashed: number;
  /** Workers alive now (the large-job worker included). */
  live: number;
  /** Jobs waiting for an answer now. */
  inFlight: number;
}

interface Pending {
  resolve: (counts: PieceCount[]) => void;
  reject: (err: Error) => void;
}

interface Slot {
  worker: Worker;
  pending: Map<number, Pending>;
  lastError: Error | null;
}

export class CountPoolError extends Error {
  constructor(message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.name = 'CountPoolError';
  }
}

export class CountPool {
  readonly size: number;
  private readonly slots: Slot[] = [];
  /** The worker for jobs over LARGE_JOB_CHARS, once one came. */
  private large: Slot | null = null;
  private nextId = 1;
  private closed = false;
  private jobs = 0;
  private started = 0;
  private crashed = 0;

  constructor(opts: CountPoolOptions = {}) {
    const size = opts.size ?? 1;
    if (!Number.isInteger(size) || size < 1 || size > MAX_POOL_SIZE) {
      throw new RangeError(`count pool size must be an integer from 1 to ${MAX_POOL_SIZE}, got ${size}`);
    }
    this.size = size;
  }

  /** `countBounded(encoding, text, exactRunBudget, preTokenBudget)` for each text, computed in a worker thread. */
  count(encoding: TiktokenEncoding, texts: string[], exactRunBudget?: number, preTokenBudget?: number): Promise<PieceCount[]> {
    let chars = 0;
    for (const text of texts) chars += text.length;
    return this.send((id) => ({ kind: 'count', id, encoding, texts, exactRunBudget, preTokenBudget }), chars > LARGE_JOB_CHARS);
  }

  /** Test hook: makes one worker exit as if it had crashed; resolves once its job has failed. */
  async crashOne(): Promise<void> {
    await this.send((id) => ({ kind: 'crash', id })).then(
      () => undefined,
      () => undefined,
    );
  }

  stats(): CountPoolStats {
    const all = this.all();
    let inFlight = 0;
    for (const s of all) inFlight += s.pending.size;
    return { jobs: this.jobs, started: this.started, crashed: this.crashed, live: all.length, inFlight };
  }

  async close(): Promise<void> {
    this.closed = true;
    const slots = this.all();
    this.slots.length = 0;
    this.large = null;
    for (const slot of slots) failAll(slot, new CountPoolError('the count pool was closed'));
    await Promise.all(slots.map((s) => s.worker.terminate()));
  }

  private all(): Slot[] {
    return this.large === null ? [...this.slots] : [...this.slots, this.large];
  }

  private send(request: (id: number) => CountRequest, large = false): Promise<PieceCount[]> {
    if (this.closed) return Promise.reject(new CountPoolError('the count pool is closed'));
    let slot: Slot;
    try {
      slot = large ? (this.large ??= this.spawn(true)) : this.pick();
    } catch (err) {
      return Promise.reject(new CountPoolError('could not start a counting worker', { cause: err }));
    }
    const id = this.nextId++;
    this.jobs++;
    return new Promise<PieceCount[]>((resolve, reject) => {
      if (slot.pending.size === 0) slot.worker.ref();
      slot.pending.set(id, { resolve, reject });
      slot.worker.postMessage(request(id));
    });
  }

  /** The least busy worker, starting one when none is idle and the pool has room. */
  private pick(): Slot {
    let best: Slot | undefined;
    for (const s of this.slots) if (best === undefined || s.pending.size < best.pending.size) best = s;
    if (best !== undefined && (best.pending.size === 0 || this.slots.length >= this.size)) return best;
    const slot = this.spawn(false);
    this.slots.push(slot);
    return slot;
  }

  private spawn(large: boolean): Slot {
    const entry = workerEntry();
    const worker = new Worker(entry.script, { eval: entry.eval });
    worker.unref();
    const slot: Slot = { worker, pending: new Map(), lastError: null };
    this.started++;

    worker.on('message', (reply: CountReply) => {
      const job = slot.pending.get(reply.id);
      if (job === undefined) return;
      slot.pending.delete(reply.id);
      if (slot.pending.size === 0) worker.unref();
      if ('error' in reply) job.reject(new CountPoolError(`counting worker failed: ${reply.error}`));
      else job.resolve(reply.counts);
    });
    // Without an 'error' listener a worker's uncaught exception would be rethrown in the main thread.
    worker.on('error', (err: Error) => {
      slot.lastError = err;
    });
    worker.on('exit', (code: number) => {
      if (large) {
        if (this.large !== slot) return; // closed: its jobs were already rejected
        this.large = null;
      } else {
        const i = this.slots.indexOf(slot);
        if (i < 0) return; // closed: its jobs were already rejected
        this.slots.splice(i, 1);
      }
      this.crashed++;
      const why = slot.lastError === null ? '' : `: ${slot.lastError.message}`;
      failAll(slot, new CountPoolError(`counting worker exited with code ${code}${why}`, { cause: slot.lastError ?? undefined }));
    });
    return slot;
  }
}

function failAll(slot: Slot, err: Error): void {
  const jobs = [...slot.pending.values()];
  slot.pending.clear();
  for (const job of jobs) job.reject(err);
}

/**
 * The worker script next to this module. Compiled, it is `count-worker.js`. Run from source under
 * tsx, `import.meta.url` ends in `.ts`, and tsx maps `.js` specifiers to `.ts` files for imports
 * only, not for Worker paths. Node 20 also ignores `--import tsx` in a worker's `execArgv` (the
 * worker fails with ERR_UNKNOWN_FILE_EXTENSION), so from source the worker is a two-line bootstrap
 * that registers tsx's loader in its own thread, then imports `count-worker.ts`.
 */
function workerEntry(): { script: URL | string; eval: boolean } {
  const fromSource = new URL(import.meta.url).pathname.endsWith('.ts');
  if (!fromSource) return { script: new URL('./count-worker.js', import.meta.url), eval: false };
  const tsx = import.meta.resolve('tsx/esm/api');
  const worker = new URL('./count-worker.ts', import.meta.url).href;
  const boot = `import(${JSON.stringify(tsx)}).then((m) => { m.register(); return import(${JSON.stringify(worker)}); });`;
  return { script: boot, eval: true };
}
