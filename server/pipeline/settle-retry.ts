// Settlements the ledger could not write when their request ended — a full disk, PostgreSQL away
// or restarting. The upstream had answered, so the client gets its answer; the settlement is kept
// here and written as soon as the ledger takes it, tried again every few seconds. Its reservation
// stays in `inFlight` meanwhile, so a replica's sweep does not take it for one a crash left (which
// would charge it in full). A process that stops with some still unwritten tries once more, and
// leaves what is left to the recovery at the next start: charged in full, flagged (ADR 0005).

import type { FastifyBaseLogger } from 'fastify';
import type { ConversationHead, Ledger, Settlement } from '../../metering/ledger.js';
import { isLedgerUnavailable, storeCode, storeMessage } from '../ledger-guard.js';

interface Pending {
  settlement: Settlement;
  head?: ConversationHead;
  /** When it was kept (ms, monotonic), for the log's `waitedMs`: not a time the ledger stores. */
  since: number;
}

export class SettlementRetry {
  private readonly pending = new Map<string, Pending>();
  private timer: NodeJS.Timeout | null = null;
  private flushing: Promise<void> | null = null;
  /** The last error the ledger gave (kept while any settlement is unwritten). */
  private failure: unknown = null;

  constructor(
    private readonly ledger: Ledger,
    private readonly inFlight: Set<string>,
    private readonly log: FastifyBaseLogger,
    private readonly everyMs = 5_000,
    /** The wall clock the ledger's times are stamped with (the gateway's `clock`). */
    private readonly clock: () => number = Date.now,
  ) {}

  /** How many settlements wait for the ledger. */
  get size(): number {
    return this.pending.size;
  }

  /** What the ledger last said (for logs), while settlements wait. */
  get lastError(): string | null {
    return this.failure === null ? null : storeMessage(this.failure);
  }

  /** Its short code (safe to show anyone), while settlements wait. */
  get lastCode(): string | null {
    return this.failure === null ? null : storeCode(this.failure);
  }

  /** A settlement is done with: written, or left to recovery. */
  private done(id: string): void {
    this.pending.delete(id);
    this.inFlight.delete(id);
  }

  /** Keep a settlement the ledger refused, to write it later; `err` is what the ledger said. */
  add(id: string, settlement: Settlement, head: ConversationHead | undefined, err: unknown): void {
    this.failure = err;
    this.pending.set(id, { settlement, head, since: performance.now() });
    this.log.error({ id, err, waiting: this.pending.size }, 'the ledger could not settle a finished request: kept, and tried again until written');
    this.schedule();
  }

  private schedule(): void {
    if (this.timer !== null || this.pending.size === 0) return;
    this.timer = setTimeout(() => {
      this.timer = null;
      void this.flush();
    }, this.everyMs);
    this.timer.unref();
  }

  /** Try the waiting settlements, oldest first, until the ledger refuses one (the store is away still). */
  flush(): Promise<void> {
    this.flushing ??= this.writeAll().finally(() => {
      this.flushing = null;
      this.schedule();
    });
    return this.flushing;
  }

  private async writeAll(): Promise<void> {
    // Said alive first: on PostgreSQL another replica sweeps reservations not said alive for ten
    // minutes, and this replica could not say so while the store was away.
    try {
      await this.ledger.keepAlive([...this.pending.keys()], this.clock());
    } catch (err) {
      this.failure = err;
      return;
    }
    for (const [id, p] of [...this.pending]) {
      let settledNow: boolean;
      try {
        // Stamped when it is written, as a settlement on time is: an export by settlement time
        // whose window was read while the store was away must not have it land behind it.
        settledNow = (await this.ledger.settle(id, { ...p.settlement, finishedAt: this.clock() }, p.head)) !== null;
      } catch (err) {
        if (!isLedgerUnavailable(err)) {
          // The store answers, and refuses this one: it is left to recovery, not tried for ever.
          this.done(id);
          this.log.error({ err, id }, 'settlement failed once the ledger was back: the reservation is left to recovery');
          continue;
        }
        // Tried last next time: a refusal of one (a busy moment) does not hold the others back.
        this.failure = err;
        this.pending.delete(id);
        this.pending.set(id, p);
        return;
      }
      this.done(id);
      if (settledNow) this.log.info({ id, waitedMs: Math.round(performance.now() - p.since) }, 'settlement written after the ledger came back');
      // Another replica's sweep took it for a crash's first (the store was away past its threshold):
      // it stands as recovered, charged in full; settling is once per row.
      else this.log.warn({ id, waitedMs: Math.round(performance.now() - p.since) }, 'the reservation had been recovered in full meanwhile: its real figures were not applied');
    }
    this.failure = null;
  }

  /** At shutdown: one last try; what is still unwritten is left to the recovery at the next start. */
  async close(): Promise<void> {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.pending.size === 0) return;
    await this.flush();
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.pending.size > 0) {
      this.log.error({ unwritten: [...this.pending.keys()] }, 'stopping with settlements the ledger did not take: the next start settles them in full, flagged recovered');
    }
  }
}
