// preHandler hooks: client keys for /v1 routes, the operator token for /admin routes.

import type { FastifyReply, FastifyRequest } from 'fastify';
import { bearer, sameSecret, type Principal } from './auth.js';
import { GatewayError } from './errors.js';

declare module 'fastify' {
  interface FastifyRequest {
    principal?: Principal;
  }
}

export async function requireClient(request: FastifyRequest, _reply: FastifyReply): Promise<void> {
  request.principal = await request.server.gateway.auth.authenticate(request.raw.headersDistinct?.authorization ?? request.headers.authorization);
}

export async function requireAdmin(request: FastifyRequest, _reply: FastifyReply): Promise<void> {
  const gw = request.server.gateway;
  const token = bearer(request.headers.authorization);
  if (!token) throw new GatewayError('admin_token_required', 'the operator API needs "Authorization: Bearer <TOLLGATE_ADMIN_TOKEN>"');
  if (gw.adminToken && sameSecret(token, gw.adminToken)) return;
  // A client key is a known identity without the right to change limits (SPEC §6): 403.
  const client = await gw.auth.authenticate(request.raw.headersDistinct?.authorization ?? request.headers.authorization).catch(() => null);
  if (client && (client.keyId !== null || !gw.auth.open)) {
    throw new GatewayError('forbidden', 'client keys cannot use the operator API');
  }
  if (!gw.adminToken) throw new GatewayError('admin_token_required', 'the operator API is off: set TOLLGATE_ADMIN_TOKEN to enable it');
  throw new GatewayError('admin_token_required', 'invalid admin token');
}
