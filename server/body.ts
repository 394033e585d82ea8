// Request bodies: counted exactly in bytes as they arrive, refused past `limits.maxBodyBytes` with
// the exact total (SPEC §6: "request body has 33554433 bytes, the limit is 33554432") before any
// JSON parsing. Nothing of a refused body is kept.
//
// When the 413 goes, and what it says:
// - a body with a Content-Length over the limit is refused at once, before a byte of it is read,
//   with the declared size: HTTP framing makes the body exactly that long;
// - a chunked body has no declared size: it is read on, and counted, up to the drain bound, so that
//   the 413 gives its exact size; past the bound it says "more than <bound> bytes", which is true.
// The client may still be writing when the 413 goes, and closing then would reset the connection
// before it reads the answer (an outside audit: curl saw an empty reply, the OpenAI SDK retried a
// connection error three times). So the answer says `connection: close` (Fastify sets it for a
// body that failed to parse) and the connection is closed in stages (server/staged-close.ts): the
// rest of the body is read and discarded up to the drain bound again, then no longer read; the
// socket is closed when the body ends or the client goes, and after LINGER_MS at the latest.
//
// The drain bound is DRAIN_FACTOR × the limit, and at least MIN_DRAIN_BYTES. It keeps what a
// refused body costs in the order of what an admitted one may (the bytes are read, never kept),
// while a client that writes its whole body before it reads the answer still gets the 413 and a
// clean close when its body is within it. A client that reads while it writes (fetch and so the
// OpenAI SDK, curl) has its answer whatever the size, and goes. The floor is for small configured
// limits: a 4 KB limit would otherwise drain less than a socket buffer holds. LINGER_MS bounds how
// long a refused client holds a connection (nginx, closing the same way, waits 5 s for a client
// that has stopped sending: `lingering_timeout`). ADR 0020 has the costs.

import type { Socket } from 'node:net';
import type { FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError } from './errors.js';
import { closeInStages } from './staged-close.js';
import { clientPrincipal } from './auth-hooks.js';
import { takeSlotOnArrival } from './key-slots.js';
import { endpointForPath } from './pipeline/endpoints.js';

const DRAIN_FACTOR = 4;
const MIN_DRAIN_BYTES = 1024 * 1024;
/** The longest a connection whose request was refused stays open after its answer (ms). */
export const LINGER_MS = 5_000;

declare module 'fastify' {
  interface FastifyRequest {
    /** A /v1/admission call's body as it came (server/json-span.ts reads the request inside from it). */
    admissionBytes?: Buffer;
  }
}

/** How much of a refused body is read, before its answer (to count it) and again after it. */
export function drainBytes(maxBodyBytes: number): number {
  return Math.max(DRAIN_FACTOR * maxBodyBytes, MIN_DRAIN_BYTES);
}

/** Nesting allowed in a request body: far deeper than any message list or tool schema needs. */
export const MAX_JSON_DEPTH = 128;

/** The refusal of a body nested deeper than MAX_JSON_DEPTH. */
export function tooDeep(): GatewayError {
  return new GatewayError('invalid_json', `request body nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels`, { max_depth: MAX_JSON_DEPTH });
}

/** Whether `value` has objects or arrays nested more than `levels` deep (recursion bounded by it). */
export function nestedDeeperThan(value: object, levels: number): boolean {
  if (levels === 0) return true;
  if (Array.isArray(value)) {
    for (let i = 0; i < value.length; i++) {
      const child: unknown = value[i];
      if (typeof child === 'object' && child !== null && nestedDeeperThan(child, levels - 1)) return true;
    }
    return false;
  }
  for (const key in value) {
    const child: unknown = (value as Record<string, unknown>)[key];
    if (typeof child === 'object' && child !== null && nestedDeeperThan(child, levels - 1)) return true;
  }
  return false;
}

/**
 * Room for `POST /v1/admission`'s wrapper (`{"endpoint": …, "request": …}`) around a request of the
 * limit's size: the limit applies to the request inside, whose verdict says `body_too_large` as
 * the real request would get it (routes/admission.ts).
 */
export const ADMISSION_WRAPPER_BYTES = 64 * 1024;

/**
 * What is kept of a client route's body once its key is known not to authenticate: the body is
 * still counted (a 413 goes before a 401, SPEC §2), and a small one still parsed (a 400 too), but
 * a caller without a key cannot make the gateway hold megabytes for as long as it takes to send them.
 */
export const UNAUTHENTICATED_BODY_BYTES = 64 * 1024;

export function registerJsonBodyParser(app: FastifyInstance, limit: number): void {
  // A stopping gateway does not wait for a refused client to finish sending.
  const lingering = new Set<Socket>();
  app.addHook('preClose', (done) => {
    for (const socket of lingering) socket.destroy();
    lingering.clear();
    done();
  });
  app.removeAllContentTypeParsers();
  // Every content type is read as JSON: SDKs send application/json, curl users often forget it.
  app.addContentTypeParser('*', (request: FastifyRequest, payload, done) => {
    const wrapped = request.routeOptions.url === '/v1/admission';
    const maxBodyBytes = wrapped ? limit + ADMISSION_WRAPPER_BYTES : limit;
    const drain = drainBytes(maxBodyBytes);
    // NaN for a chunked body.
    const declared = Number(request.headers['content-length']);
    let total = 0;
    let over = false;
    const chunks: Buffer[] = [];
    let finished = false;
    const finish = (err: Error | null, body?: unknown) => {
      if (finished) return;
      finished = true;
      done(err, body);
    };
    const tooLarge = (bytes: number, exact: boolean) =>
      new GatewayError(
        'body_too_large',
        `request body has ${exact ? '' : 'more than '}${bytes} bytes, the limit is ${maxBodyBytes}` +
          (wrapped ? ` (${limit} for the request inside, ${ADMISSION_WRAPPER_BYTES} for the admission wrapper)` : ''),
        { body_bytes: bytes, limit: maxBodyBytes },
      );
    /** Answers before the body ended: the rest is discarded and the connection closed in stages. */
    const refuseEarly = (err: GatewayError) => {
      request.pipelineStart = performance.now();
      over = true;
      chunks.length = 0;
      closeInStages(request.raw, { bytes: drain, ms: LINGER_MS }, lingering);
      finish(err);
    };
    if (declared > maxBodyBytes) refuseEarly(tooLarge(declared, true));

    // A client route's key is checked while its body arrives; once it has failed, the body is
    // counted and not kept past UNAUTHENTICATED_BODY_BYTES. A model request takes one of its key's
    // slots (`limits.maxInFlightPerKey`) once the key passes: one that finds none free is not kept
    // past that size either (its 429 follows), so a key holds at most its slots' worth of bodies.
    let key: 'checking' | 'passed' | 'failed' = 'checking';
    let noSlot = false;
    let unread = false;
    const dropUnauthenticated = () => {
      if ((key === 'failed' || noSlot) && !unread && total > UNAUTHENTICATED_BODY_BYTES) {
        unread = true;
        chunks.length = 0;
      }
    };
    const takesSlot = endpointForPath(request.routeOptions.url) !== null;
    const keyChecked = request.routeOptions.url?.startsWith('/v1/')
      ? clientPrincipal(request).then(
          (principal) => {
            key = 'passed';
            if (takesSlot && !finished && !takeSlotOnArrival(request, principal)) {
              noSlot = true;
              dropUnauthenticated();
            }
          },
          () => {
            key = 'failed';
            dropUnauthenticated();
          },
        )
      : null;
    // Past UNAUTHENTICATED_BODY_BYTES, a body whose key is still being checked (a ledger look-up
    // that takes its time) waits for the answer before more of it is read.
    let waiting = false;
    const waitForKey = () => {
      if (waiting || key !== 'checking' || keyChecked === null || total <= UNAUTHENTICATED_BODY_BYTES) return;
      waiting = true;
      payload.pause();
      void keyChecked.then(() => {
        waiting = false;
        payload.resume();
      });
    };

    payload.on('data', (chunk: Buffer) => {
      if (finished) return;
      total += chunk.length;
      if (total > maxBodyBytes) {
        over = true;
        chunks.length = 0;
        if (total > drain) refuseEarly(tooLarge(drain, false));
        return;
      }
      dropUnauthenticated();
      if (!unread) chunks.push(chunk);
      waitForKey();
    });
    payload.on('error', (err) => finish(err));
    const ended = () => {
      if (unread) {
        // Its 401 follows (the route's key check: server/auth-hooks.ts), or its 429 (server/pipeline/run-request.ts).
        request.bodyUnread = true;
        return finish(null, undefined);
      }
      // A compressed body would be read as JSON and refused with its binary quoted back; one said to
      // be compressed but sent plain would pass. Either way the client is told what to change
      // (after the size: SPEC §11 puts body_too_large first).
      const encoding = request.headers['content-encoding']?.trim();
      if (encoding && encoding.toLowerCase() !== 'identity') {
        return finish(new GatewayError('invalid_request', `content-encoding: "${encoding}" is not supported: send the body uncompressed`, {}, 'content-encoding'));
      }
      const bytes = Buffer.concat(chunks, total);
      // The admission wrapper's bytes: its route holds the request inside to the limit as sent.
      if (wrapped) request.admissionBytes = bytes;
      const text = bytes.toString('utf8');
      // An empty body is no body (a DELETE sent with a JSON content type); routes that need one say so.
      if (text.trim() === '') return finish(null, undefined);
      let body: unknown;
      try {
        body = JSON.parse(text);
      } catch (err) {
        return finish(new GatewayError('invalid_json', `request body is not valid JSON: ${(err as Error).message}`));
      }
      // Counting, hashing and forwarding walk the body recursively: a body nested thousands deep
      // would overflow the stack part way through (a 500, or a 502 after admission) — refuse it here.
      // Admission's wrapper is left to its route, which holds the request inside to the limit and
      // answers a deeper one with the real request's 400 as its verdict, walking nothing else.
      if (!wrapped && typeof body === 'object' && body !== null && nestedDeeperThan(body, MAX_JSON_DEPTH)) {
        return finish(tooDeep());
      }
      finish(null, body);
    };
    payload.on('end', () => {
      // A refusal here (413, a malformed body's 400) is timed in the overhead histogram from now,
      // as one the pipeline makes is from when it takes the body (server/error-handler.ts).
      request.pipelineStart = performance.now();
      if (over) return finish(tooLarge(total, true));
      // A large body is parsed only once its key is known to pass (the check takes microseconds).
      if (keyChecked && total > UNAUTHENTICATED_BODY_BYTES) void keyChecked.then(ended);
      else ended();
    });
  });
}
