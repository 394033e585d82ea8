// Every error leaves in the OpenAI envelope, so every SDK surfaces it the same way (SPEC §6).
// Refusals carry `x-should-retry: false`: the OpenAI SDKs would otherwise retry some statuses.

import type { FastifyError, FastifyInstance } from 'fastify';
import { GatewayError, NO_RETRY_HEADERS, envelope } from './errors.js';

export function registerErrorHandling(app: FastifyInstance): void {
  app.setErrorHandler((err: FastifyError | GatewayError | Error, request, reply) => {
    if (err instanceof GatewayError) {
      if (err.status === 413 || err.status === 402) app.gateway.metrics.refusals.inc({ reason: err.code });
      if (err.status >= 500) request.log.warn({ code: err.code, err: err.message }, 'upstream or gateway failure');
      return reply.code(err.status).headers(NO_RETRY_HEADERS).send(err.toEnvelope());
    }
    const fe = err as FastifyError;
    if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
      return reply
        .code(fe.statusCode)
        .headers(NO_RETRY_HEADERS)
        .send(envelope(fe.code ?? 'invalid_request', fe.message, 'invalid_request_error'));
    }
    request.log.error({ err }, 'unexpected error');
    return reply.code(500).send(envelope('internal_error', 'internal error in the gateway', 'server_error'));
  });
  app.setNotFoundHandler((request, reply) => {
    reply.code(404).send(envelope('not_found', `no route for ${request.method} ${request.url.split('?')[0]}`, 'not_found_error'));
  });
}
