// Request bodies: counted exactly in bytes as they arrive, refused past `limits.maxBodyBytes` with
// the exact total (SPEC §6: "request body has 33554433 bytes, the limit is 33554432") before any
// JSON parsing. The excess is read and discarded so the client sees the 413 instead of a reset
// connection; past DRAIN_FACTOR × limit we stop reading and report a lower bound.

import type { FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError } from './errors.js';

const DRAIN_FACTOR = 4;

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
      try {
        finish(null, JSON.parse(text));
      } catch (err) {
        finish(new GatewayError('invalid_json', `request body is not valid JSON: ${(err as Error).message}`));
      }
    });
  });
}
