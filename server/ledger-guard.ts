// The ledger as the request path sees it: a store that fails — SQLite's disk full or its file
// locked, PostgreSQL away, a lock or statement timeout — answers the client with a 503
// `ledger_unavailable` (the SDKs retry a 503), not as a bug in the gateway (a 500). The client is
// told the store's code only (`SQLITE_FULL`, a SQLSTATE, `ECONNREFUSED`): the store's own words
// can name its host, database or user, and go to the log. Errors that are not the store's being
// unavailable (a TypeError in the gateway's code, an SQL error in a statement) stay 500s.

import pg from 'pg';
import type { Ledger } from '../metering/ledger.js';
import { GatewayError } from './errors.js';
import { LEDGER_FILE_REPLACED } from '../metering/stores/sqlite-file-identity.js';

/** Node's codes for a connection that could not be made or was lost. */
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'ETIMEDOUT', 'EHOSTUNREACH', 'EPIPE', 'EAI_AGAIN']);

/**
 * PostgreSQL's SQLSTATE classes that say the server cannot serve this gateway now, rather than
 * that a statement is wrong: connection (08), the login refused (28: a rotated password, a dropped
 * role), the database gone (3D), rollback after contention (40), resources (53), a lock not had in
 * time (55P03), operator intervention and timeouts (57), system (58), internal (XX), and a
 * read-only transaction (25006: a standby after a failover).
 */
function pgUnavailable(code: string): boolean {
  return /^(08|28|3D|40|53|57|58|XX)/.test(code) || code === '55P03' || code === '25006';
}

/**
 * SQLite's result codes (extended ones start with the primary) that say the file cannot be used
 * now — full, busy or locked, an I/O error, not openable, read-only, damaged, out of memory —
 * rather than that a statement is wrong (a constraint, a mismatch, a misuse: bugs, still 500s).
 */
function sqliteUnavailable(code: string): boolean {
  return /^SQLITE_(FULL|BUSY|LOCKED|IOERR|CANTOPEN|READONLY|CORRUPT|NOTADB|NOMEM|PROTOCOL)/.test(code);
}

/** The store's short code for what went wrong, if `err` is the store being unavailable; else null. */
export function storeFailureCode(err: unknown): string | null {
  if (!(err instanceof Error) || err instanceof GatewayError) return null;
  const code = (err as { code?: unknown }).code;
  if (err.name === 'SqliteError') return typeof code === 'string' && sqliteUnavailable(code) ? code : null;
  if (err instanceof pg.DatabaseError) return typeof code === 'string' && pgUnavailable(code) ? code : null;
  if (typeof code === 'string' && (NETWORK_CODES.has(code) || code === LEDGER_FILE_REPLACED)) return code;
  if (/^Connection terminated|^Client has encountered a connection error/.test(err.message)) return 'connection lost';
  if (/^timeout exceeded when trying to connect/.test(err.message)) return 'connect timeout';
  return null;
}

export function isStoreFailure(err: unknown): err is Error {
  return storeFailureCode(err) !== null;
}

/** A store failure, as the guard said it (`ledger_unavailable`) or as the store threw it. */
export function isLedgerUnavailable(err: unknown): boolean {
  return (err instanceof GatewayError && err.code === 'ledger_unavailable') || isStoreFailure(err);
}

function unavailable(err: unknown): unknown {
  const code = storeFailureCode(err);
  if (code === null) return err;
  // A file deleted or replaced under the gateway stays so: no retry helps until a restart opens
  // what the path now names (metering/stores/sqlite-file-identity.ts).
  const advice =
    code === LEDGER_FILE_REPLACED
      ? 'its file was deleted or replaced while the gateway ran, and no retry helps until the gateway is restarted'
      : 'try again shortly';
  const e = new GatewayError('ledger_unavailable', `the ledger could not be read or written (${code}); ${advice}`, {}, null, { cause: err });
  e.final = code === LEDGER_FILE_REPLACED;
  // The log line gets what the store said.
  e.logMessage = `the ledger could not be read or written: ${(err as Error).message}`;
  return e;
}

/** The error the store threw, from under the guard's `ledger_unavailable` if it is one. */
export function storeError(err: unknown): unknown {
  return err instanceof GatewayError && err.code === 'ledger_unavailable' && err.cause !== undefined ? err.cause : err;
}

/** What the store said (for a log line, never a client). */
export function storeMessage(err: unknown): string {
  const inner = storeError(err);
  return inner instanceof Error ? inner.message : String(inner);
}

/** The store's short code for `err` (client-safe), or its own `code`, or 'error'. */
export function storeCode(err: unknown): string {
  const inner = storeError(err);
  const own = (inner as { code?: unknown } | null)?.code;
  return storeFailureCode(inner) ?? (typeof own === 'string' ? own : 'error');
}

/** How long a store failure keeps the gateway unready when nothing has shown the store back (ms). */
export const RECENT_FAILURE_MS = 10_000;

/**
 * The store's recent failures on the request path, by ledger method, for `/readyz`. A ping (a
 * read) can succeed while every write fails — SQLite's disk full — so readiness also asks whether
 * a call failed lately: it is cleared when the same method next succeeds (an admission that went
 * through), and forgotten after a while, so that a gateway taken out of its load balancer is let
 * back in to try (a 503 per request meanwhile, which the SDKs retry).
 */
export class StoreFailures {
  private readonly byMethod = new Map<PropertyKey, { at: number; code: string }>();

  /**
   * @param now a monotonic clock (ms): the wall clock stepped back an hour kept a failure "recent",
   *   and the gateway unready, for that hour.
   */
  constructor(private readonly now: () => number = () => performance.now()) {}

  failed(method: PropertyKey, code: string): void {
    this.byMethod.set(method, { at: this.now(), code });
  }

  succeeded(method: PropertyKey): void {
    if (this.byMethod.size > 0) this.byMethod.delete(method);
  }

  /** The code of the latest failure younger than `withinMs` that nothing has cleared, else null. */
  recent(withinMs: number = RECENT_FAILURE_MS): string | null {
    let latest: { at: number; code: string } | null = null;
    const since = this.now() - withinMs;
    for (const f of this.byMethod.values()) if (f.at >= since && (latest === null || f.at > latest.at)) latest = f;
    return latest?.code ?? null;
  }
}

/** A ping reads: its success says nothing of writes, and `/readyz` reports its failures itself. */
const UNTRACKED: ReadonlySet<PropertyKey> = new Set(['ping', 'close']);

/**
 * `ledger` with its store failures said as `ledger_unavailable` (calls go to the store itself,
 * unchanged), and noted in `failures` if given.
 */
export function guardLedger(ledger: Ledger, failures?: StoreFailures): Ledger {
  const track = (prop: PropertyKey) => failures !== undefined && !UNTRACKED.has(prop);
  const fail = (prop: PropertyKey, err: unknown): unknown => {
    const code = storeFailureCode(err);
    if (code !== null && track(prop)) failures!.failed(prop, code);
    return unavailable(err);
  };
  const ok = <T>(prop: PropertyKey, out: T): T => {
    if (track(prop)) failures!.succeeded(prop);
    return out;
  };
  // One wrapper per method (made again if the method is replaced: tests put failing ones in).
  const wrapped = new Map<PropertyKey, { of: unknown; fn: unknown }>();
  return new Proxy(ledger, {
    get(target, prop) {
      const value = Reflect.get(target, prop, target);
      if (typeof value !== 'function') return value;
      let fn = wrapped.get(prop)?.of === value ? wrapped.get(prop)!.fn : undefined;
      if (fn === undefined) {
        fn = (...args: unknown[]) => {
          let out: unknown;
          try {
            out = (value as (...a: unknown[]) => unknown).apply(target, args);
          } catch (err) {
            throw fail(prop, err);
          }
          if (!(out instanceof Promise)) return ok(prop, out);
          return out.then(
            (v: unknown) => ok(prop, v),
            (err: unknown) => Promise.reject(fail(prop, err)),
          );
        };
        wrapped.set(prop, { of: value, fn });
      }
      return fn;
    },
  });
}
