// Request bodies: counted exactly in bytes as they arrive, refused past `limits.maxBodyBytes` with
// the exact total (SPEC §6: "request body has 33554433 bytes, the limit is 33554432") before any
// JSON parsing. The excess is read and discarded so the client sees the 413 instead of a reset
// connection; past DRAIN_FACTOR × limit we stop reading and report a lower bound.

import type { FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError } from './errors.js';

const DRAIN_FACTOR = 4;

/** Nesting allowed in a request body: far deeper than any message list or tool schema needs. */
export const MAX_JSON_DEPTH = 128;

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

export function registerJsonBodyParser(app: FastifyInstance, limit: number): void {
  app.removeAllContentTypeParsers();
  // Every content type is read as JSON: SDKs send application/json, curl users often forget it.
  app.addContentTypeParser('*', (request: FastifyRequest, payload, done) => {
    const wrapped = request.routeOptions.url === '/v1/admission';
    const maxBodyBytes = wrapped ? limit + ADMISSION_WRAPPER_BYTES : limit;
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
    payload.on('data', (chunk: Buffer) => {
      total += chunk.length;
      if (total > maxBodyBytes) {
        over = true;
        chunks.length = 0;
        if (total > maxBodyBytes * DRAIN_FACTOR) {
          payload.destroy();
          finish(tooLarge(Number.isFinite(declared) && declared > total ? declared : total, Number.isFinite(declared) && declared >= total));
        }
        return;
      }
      chunks.push(chunk);
    });
    payload.on('error', (err) => finish(err));
    payload.on('end', () => {
      if (over) return finish(tooLarge(total, true));
      const text = Buffer.concat(chunks, total).toString('utf8');
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
      if (typeof body === 'object' && body !== null && nestedDeeperThan(body, MAX_JSON_DEPTH)) {
        return finish(new GatewayError('invalid_json', `request body nests objects and arrays deeper than ${MAX_JSON_DEPTH} levels`, { max_depth: MAX_JSON_DEPTH }));
      }
      finish(null, body);
    });
  });
}
