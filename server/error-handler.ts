// Every error leaves in the OpenAI envelope, so every SDK surfaces it the same way (SPEC §6).
// Refusals carry `x-should-retry: false`: the OpenAI SDKs would otherwise retry some statuses.
// A request that ends here without having been settled still gets its one log line and is counted.

import type { FastifyError, FastifyInstance, FastifyRequest } from 'fastify';
import { GatewayError, NO_RETRY_HEADERS, envelope } from './errors.js';
import { requireAdmin } from './auth-hooks.js';
import { endpointForPath } from './pipeline/endpoints.js';

declare module 'fastify' {
  interface FastifyRequest {
    /** Set once the pipeline wrote the request's "request settled" line. */
    settledLogged?: boolean;
    /** A proxied request's model, once its body is valid (its upstream is looked up only on refusal). */
    routedModel?: string;
    /** When the pipeline took a proxied request, its body read (performance.now()): its overhead starts there. */
    pipelineStart?: number;
    /** Time an earlier attempt of the request spent at its upstream (a research round refused for its context), ms. */
    upstreamMsBefore?: number;
  }
}

/** Bounded route label: the endpoint kind for proxied routes, else the route pattern. */
function routeLabel(request: FastifyRequest): string {
  const pattern = request.routeOptions.url ?? 'unmatched';
  return endpointForPath(pattern) ?? pattern;
}

/** A request to a proxied endpoint (chat, completions, embeddings). */
function proxied(request: FastifyRequest): boolean {
  return endpointForPath(request.routeOptions.url ?? '') !== null;
}

function clientGone(request: FastifyRequest, response: { destroyed: boolean }): boolean {
  return response.destroyed || request.raw.socket?.destroyed === true;
}

/** Routes whose every call is logged at debug only: probes and scrapes, every few seconds. */
const QUIET_ROUTES = new Set(['/healthz', '/readyz', '/metrics']);

export function registerErrorHandling(app: FastifyInstance): void {
  // One line for every other request too (SPEC §10): the operator API (an audit trail of keys,
  // budgets and caps), admission, models, spend views. Model requests have theirs already.
  // (A callback hook, not an async one: every model request passes through it, and returns at once.)
  app.addHook('onResponse', (request, reply, done) => {
    if (!request.settledLogged) {
      const route = request.routeOptions.url ?? 'unmatched';
      const line = { route, method: request.method, status: reply.statusCode, ms: Math.round(reply.elapsedTime * 1000) / 1000, tenant: request.principal?.tenant ?? null };
      if (QUIET_ROUTES.has(route)) request.log.debug(line, 'request');
      else request.log.info(line, 'request');
    }
    done();
  });

  app.setErrorHandler((err: FastifyError | GatewayError | Error, request, reply) => {
    const gw = app.gateway;
    // The request's one line (SPEC §10), unless the pipeline wrote it: a refusal the gateway made
    // at info; a failure (5xx) at warn, or at error for a bug, with what went wrong.
    /** The request's one line and its count, unless the pipeline wrote them. */
    const account = (status: number, code: string, failure?: { level: 'warn' | 'error'; err: unknown }, msg = 'request refused') => {
      if (!request.settledLogged) {
        const model = request.routedModel ?? null;
        const upstream = model === null ? null : (gw.upstreams.route(model)?.name ?? null);
        // The proxied endpoints only, as their answers are counted (run-request.ts): a route that
        // counted only its failures would read as failing every time.
        if (proxied(request)) {
          gw.metrics.requests.inc({ route: routeLabel(request), upstream: upstream ?? '', status: String(status) });
          // Every refusal of a model request, under its error code (SPEC §11).
          if (status < 500 && status !== 499) gw.metrics.refusals.inc({ reason: code });
          // A refusal the pipeline made is gateway time through and through (planning, counting,
          // admission), from the moment the body was read, as an admitted request's is: the
          // client's upload is not the gateway's, nor an earlier attempt's time at its upstream.
          if (request.pipelineStart !== undefined) {
            const ms = performance.now() - request.pipelineStart - (request.upstreamMsBefore ?? 0);
            gw.metrics.overhead.observe({ route: routeLabel(request) }, Math.max(0, ms) / 1000);
          }
        }
        const line = { route: routeLabel(request), status, code, tenant: request.principal?.tenant ?? null, model, upstream };
        if (failure) request.log[failure.level]({ ...line, err: failure.err }, 'request failed');
        else request.log.info(line, msg);
        request.settledLogged = true;
      }
    };
    const answer = (status: number, code: string, body: unknown, headers: Record<string, string> = NO_RETRY_HEADERS, failure?: { level: 'warn' | 'error'; err: unknown }) => {
      account(status, code, failure);
      return reply.code(status).headers(headers).send(body);
    };
    if (err instanceof GatewayError) {
      if (err.status < 500) return answer(err.status, err.code, err.toEnvelope(), err.retryAfterSeconds === null ? NO_RETRY_HEADERS : { 'retry-after': String(err.retryAfterSeconds) });
      // An upstream failure (5xx) is not final, so SDKs keep their own retry rules. (A settled
      // model request has logged it on its one line already.)
      return answer(err.status, err.code, err.toEnvelope(), err.final ? NO_RETRY_HEADERS : {}, { level: 'warn', err: gw.config.logging.prompts ? err.message : (err.logMessage ?? err.message) });
    }
    const fe = err as FastifyError;
    if (fe.code === 'FST_ERR_CTP_INVALID_MEDIA_TYPE') {
      // Every media type is read as JSON (server/body.ts): this is a header that is no media type.
      const sent = JSON.stringify(request.headers['content-type'] ?? '');
      return answer(400, 'invalid_request', envelope('invalid_request', `content-type: ${sent} cannot be read as a media type: send content-type: application/json`, 'invalid_request_error', 'content-type'));
    }
    if (typeof fe.statusCode === 'number' && fe.statusCode >= 400 && fe.statusCode < 500) {
      // Fastify's own 4xx (FST_ERR_…): the client's mistake, under the gateway's one code for it.
      const code = fe.code && !fe.code.startsWith('FST_') ? fe.code : 'invalid_request';
      return answer(fe.statusCode, code, envelope(code, fe.message, 'invalid_request_error'));
    }
    if (clientGone(request, reply.raw)) {
      // The client left (its request was aborted upstream and settled): nobody to answer. One that
      // left while its body arrived, or whose body did not arrive in time (Node answered it 408:
      // app.ts), was never planned: it still gets its line and its count.
      request.log.debug({ err: err.message }, 'client went away');
      const timedOut = (request.raw.socket as { tollgateTimedOut?: boolean } | null)?.tollgateTimedOut === true;
      if (timedOut) account(408, 'request_timeout');
      else account(499, 'client_closed_request', undefined, 'request abandoned');
      return reply.code(499).send();
    }
    // A bug. Its stack is wanted even when a settled line (which has only its message) was written.
    if (request.settledLogged) request.log.error({ err }, 'unexpected error');
    return answer(500, 'internal_error', envelope('internal_error', 'internal error in the gateway', 'server_error'), {}, { level: 'error', err });
  });
  // Each route's path and the methods it answers: a path that exists, asked with another method,
  // is a 405 saying which it takes (as OpenAI's API answers), not "no route".
  const paths: Array<{ path: RegExp; methods: Set<string> }> = [];
  app.addHook('onRoute', (route) => {
    const source = route.url.replace(/[.+?^${}()|[\]\\]/g, '\\$&').replace(/:[^/]+/g, '[^/]+').replace(/\*/g, '.*');
    const path = new RegExp(`^${source}$`);
    let entry = paths.find((p) => p.path.source === path.source);
    if (!entry) paths.push((entry = { path, methods: new Set() }));
    for (const m of Array.isArray(route.method) ? route.method : [route.method]) entry.methods.add(m);
  });
  app.setNotFoundHandler(async (request, reply) => {
    const path = request.url.split('?')[0]!;
    const allowed = [...new Set(paths.filter((p) => p.path.test(path)).flatMap((p) => [...p.methods]))].sort();
    if (allowed.length > 0 && !allowed.includes(request.method)) {
      // The operator API tells its methods only to the operator: anyone else gets the 401 or 403
      // its routes answer, as they would with the right method.
      if (path === '/admin' || path.startsWith('/admin/')) await requireAdmin(request, reply);
      const err = new GatewayError('method_not_allowed', `${request.method} is not a method of ${path}: it takes ${allowed.join(', ')}`);
      return reply.code(err.status).headers({ ...NO_RETRY_HEADERS, allow: allowed.join(', ') }).send(err.toEnvelope());
    }
    return reply
      .code(404)
      .headers(NO_RETRY_HEADERS)
      .send(envelope('not_found', `no route for ${request.method} ${path}`, 'not_found_error'));
  });
}
