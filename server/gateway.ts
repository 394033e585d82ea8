// The services one gateway instance is built from. `buildApp` makes them from config, or takes them
// injected (tests pass a store, a clock, a metrics registry).

import type { KeySlots } from './key-slots.js';
import type { FastifyBaseLogger } from 'fastify';
import type { Config } from './config.js';
import type { Ledger } from '../metering/ledger.js';
import type { Metrics } from './metrics.js';
import type { UpstreamRegistry } from './upstreams.js';
import type { Authenticator } from './auth.js';
import type { Counters } from './counters.js';
import type { PriceTable } from '../pricing/price-table.js';
import type { NowAndThen } from './log-now-and-then.js';
import type { PrefixMemo } from '../metering/prefix-memo.js';
import type { SettlementRetry } from './pipeline/settle-retry.js';
import type { StoreFailures } from './ledger-guard.js';

/**
 * The wall clock (ms since the epoch), for times the ledger keeps and compares across restarts and
 * replicas: a row's time, a head's, a run's start, the month. Not for intervals inside one process
 * (a throttle, "for 10 s after"): those are on performance.now, which a step of the wall clock
 * (NTP, an operator, a resumed VM) does not move.
 */
export type Clock = () => number;

export interface Gateway {
  config: Config;
  ledger: Ledger;
  /** The ledger's failures on the request path, lately (for /readyz). */
  storeFailures: StoreFailures;
  metrics: Metrics;
  upstreams: UpstreamRegistry;
  auth: Authenticator;
  counters: Counters;
  prices: PriceTable;
  /** Warnings about a lasting state, written once and then at most once a minute. */
  warnings: NowAndThen;
  /** Earlier turns' message lists, so a turn hashes and counts only what it added. */
  prefixMemo: PrefixMemo;
  /** Ids of this process's reservations admitted and not yet settled (kept alive in the store). */
  inFlight: Set<string>;
  /** Model requests in flight per client key, bounded by `limits.maxInFlightPerKey` (ADR 0023). */
  keySlots: KeySlots;
  /** Settlements the ledger could not write when their request ended, written when it can. */
  settleRetry: SettlementRetry;
  /**
   * Aborted when a stopping gateway can wait no longer for its requests (server/main.ts): each
   * one in flight then stops its upstream call, settles what was generated and ends its response.
   */
  drain: AbortController;
  clock: Clock;
  /** How long an answer waits on a llama.cpp server's /tokenize for its count (count-answer.ts `ANSWER_COUNT_TIMEOUT_MS`). */
  answerCountTimeoutMs: number;
  log: FastifyBaseLogger;
  adminToken: string | null;
}
