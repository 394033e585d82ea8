// The ledger as the request path sees it: a store that fails — SQLite's disk full or its file
// locked, PostgreSQL away, a lock or statement timeout — answers the client with a 503
// `ledger_unavailable` naming what the store said (the SDKs retry a 503), not as a bug in the
// gateway (a 500). Errors that are not the store's (a TypeError in the gateway's own code) pass
// on unchanged and stay 500s.

import type { Ledger } from '../metering/ledger.js';
import { GatewayError } from './errors.js';

/** Node's codes for a connection that could not be made or was lost. */
const NETWORK_CODES = new Set(['ECONNREFUSED', 'ECONNRESET', 'ENOTFOUND', 'ETIMEDOUT', 'EHOSTUNREACH', 'EPIPE', 'EAI_AGAIN']);

/** Whether `err` is the store failing: better-sqlite3's SqliteError, PostgreSQL's or its connection's. */
export function isStoreFailure(err: unknown): err is Error {
  if (!(err instanceof Error) || err instanceof GatewayError) return false;
  const code = (err as { code?: unknown }).code;
  if (err.name === 'SqliteError') return true;
  // pg: a server error carries its SQLSTATE (five characters); a lost or refused connection, Node's code or pg's words.
  if (err.name === 'DatabaseError' && typeof code === 'string' && /^[0-9A-Z]{5}$/.test(code)) return true;
  if (typeof code === 'string' && NETWORK_CODES.has(code)) return true;
  return /^Connection terminated|^timeout exceeded when trying to connect|^Client has encountered a connection error/.test(err.message);
}

function unavailable(err: unknown): unknown {
  if (!isStoreFailure(err)) return err;
  return new GatewayError('ledger_unavailable', `the ledger could not be read or written: ${err.message}`, {}, null, { cause: err });
}

/** What the store said, under the gateway's `ledger_unavailable` wording if it has it. */
export function storeMessage(err: unknown): string {
  const inner = err instanceof GatewayError && err.code === 'ledger_unavailable' && err.cause instanceof Error ? err.cause : err;
  return inner instanceof Error ? inner.message : String(inner);
}

/** `ledger` with its store failures said as `ledger_unavailable` (calls go to the store itself, unchanged). */
export function guardLedger(ledger: Ledger): Ledger {
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
            throw unavailable(err);
          }
          return out instanceof Promise ? out.catch((err: unknown) => Promise.reject(unavailable(err))) : out;
        };
        wrapped.set(prop, { of: value, fn });
      }
      return fn;
    },
  });
}
