// preHandler hooks: client keys for /v1 routes, the operator token for /admin routes.

import type { FastifyReply, FastifyRequest } from 'fastify';
import { bearer, sameSecret, type Principal } from './auth.js';
import { GatewayError } from './errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
    /** The client key's authentication, started once (by the body parser, or the first stage that asks). */
    authPending?: Promise<Principal>;
    /** The body was counted but not kept: its key did not authenticate (server/body.ts). */
    bodyUnread?: boolean;
  }
}

/** The request's client principal, authenticated once however many stages ask; rejects with the 401. */
export function clientPrincipal(request: FastifyRequest): Promise<Principal> {
  return (request.authPending ??= request.server.gateway.auth.authenticate(authorizationSent(request)));
}

/** Every Authorization header the request sent (Node keeps only the first in `headers`). */
export function authorizationSent(request: FastifyRequest): string | string[] | undefined {
  return request.raw.headersDistinct?.authorization ?? request.headers.authorization;
}

/** The one bearer token of an operator or metrics request; two Authorization headers are refused, not one picked. */
export function oneBearer(request: FastifyRequest): string | null {
  const sent = authorizationSent(request);
  if (Array.isArray(sent) && sent.length > 1) throw new GatewayError('admin_token_required', `Authorization sent ${sent.length} times: send one token`);
  return bearer(sent);
}

export async function requireClient(request: FastifyRequest, _reply: FastifyReply): Promise<void> {
  request.principal = await clientPrincipal(request);
}

export async function requireAdmin(request: FastifyRequest, _reply: FastifyReply): Promise<void> {
  const gw = request.server.gateway;
  const token = oneBearer(request);
  if (!token) throw new GatewayError('admin_token_required', 'the operator API needs "Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>"');
  if (gw.adminToken && sameSecret(token, gw.adminToken)) return;
  // A client key is a known identity without the right to change limits (SPEC §6): 403.
  const client = await gw.auth.authenticate(authorizationSent(request)).catch(() => null);
  if (client && (client.keyId !== null || !(await gw.auth.open()))) {
    throw new GatewayError('forbidden', 'client keys cannot use the operator API');
  }
  if (!gw.adminToken) throw new GatewayError('admin_token_required', 'the operator API is off: set TOLLGATE_ADMIN_TOKEN to enable it');
  throw new GatewayError('admin_token_required', 'invalid admin token');
}
