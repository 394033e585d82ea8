// Requests in flight per client key (`limits.maxInFlightPerKey`, ADR 0023). Off by default.
//
// An upstream's connection pool is shared by every tenant. A client that opens streams and stops
// reading them holds a connection each until the upstream's timeout; with enough of them nobody
// else is served. A bound per key keeps one client's stalled or runaway work to its own share.
// The count is this process's: replicas each hold their own (a key may have N in flight on each).

import type { FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError } from './errors.js';
import type { Principal } from './auth.js';

declare module 'fastify' {
  interface FastifyRequest {
    /**
     * The slot a model request took once its key passed, while its body still arrived — or the
     * 429 it met then (the body is then not kept past a small size: server/body.ts).
     */
    keySlot?: { giveBack: () => void } | { refused: GatewayError };
  }
}

export class KeySlots {
  private readonly held = new Map<string, number>();

  constructor(private readonly limit: number | null) {}

  /** Whose slots a request takes: its key's, or its tenant's on a key-less gateway. */
  static ownerOf(principal: Principal): string {
    return principal.keyId !== null ? `key:${principal.keyId}` : `tenant:${principal.tenant}`;
  }

  /**
   * Takes a slot for `owner`, or throws the 429 when its requests in flight are at the limit.
   * Returns the function that gives the slot back (call it once, when the request has ended).
   */
  take(owner: string): () => void {
    if (this.limit === null) return noop;
    const n = this.held.get(owner) ?? 0;
    if (n >= this.limit) throw tooManyInFlight(n, this.limit, owner.startsWith('key:') ? 'this key' : `tenant "${owner.slice('tenant:'.length)}" (a gateway without keys)`);
    this.held.set(owner, n + 1);
    let given = false;
    return () => {
      if (given) return;
      given = true;
      const left = (this.held.get(owner) ?? 1) - 1;
      if (left > 0) this.held.set(owner, left);
      else this.held.delete(owner);
    };
  }

  /** Requests in flight for `owner`. */
  inFlight(owner: string): number {
    return this.held.get(owner) ?? 0;
  }
}

function noop(): void {}

/**
 * Takes a model request's slot as soon as its key has passed, while its body still arrives: a
 * client sending bodies slowly holds its slots (and no more than that many bodies in memory) for
 * as long as they take. Returns false when none was free (the body is then not kept).
 */
export function takeSlotOnArrival(request: FastifyRequest, principal: Principal): boolean {
  try {
    request.keySlot = { giveBack: request.server.gateway.keySlots.take(KeySlots.ownerOf(principal)) };
    return true;
  } catch (err) {
    if (!(err instanceof GatewayError)) throw err;
    request.keySlot = { refused: err };
    return false;
  }
}

/**
 * The slot a parsed model request runs in: the one it took on arrival, or one taken now (a slot
 * may have come free while its body arrived); throws the 429 when none is free.
 */
export function slotFor(request: FastifyRequest, principal: Principal): () => void {
  const early = request.keySlot;
  if (early && 'giveBack' in early) return early.giveBack;
  const giveBack = request.server.gateway.keySlots.take(KeySlots.ownerOf(principal));
  request.keySlot = { giveBack };
  return giveBack;
}

/** A slot taken on arrival is given back however the request ends, even before its route runs (a 413, a 400, a client gone). */
export function registerSlotRelease(app: FastifyInstance): void {
  app.addHook('onResponse', (request, _reply, done) => {
    giveBackHeld(request);
    done();
  });
  app.addHook('onRequestAbort', (request, done) => {
    giveBackHeld(request);
    done();
  });
}

function giveBackHeld(request: FastifyRequest): void {
  const slot = request.keySlot;
  if (slot && 'giveBack' in slot) slot.giveBack();
}

function tooManyInFlight(inFlight: number, limit: number, whose: string): GatewayError {
  const err = new GatewayError(
    'concurrency_limit_reached',
    `too many requests in flight for ${whose}: ${inFlight} running, the limit is ${limit}; send it again when one has finished`,
    { in_flight: inFlight, limit },
  );
  // Unlike a refusal, this one passes by itself: the OpenAI SDKs wait `retry-after` and retry
  // (twice by default), which is welcome.
  err.retryAfterSeconds = 1;
  return err;
}
