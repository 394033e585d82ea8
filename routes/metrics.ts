// GET /metrics — Prometheus text. Open unless `metrics.token` is configured (SPEC §11).

import type { FastifyPluginAsync } from 'fastify';
import { sameSecret } from '../server/auth.js';
import { oneBearer } from '../server/auth-hooks.js';
import { GatewayError } from '../server/errors.js';

const route: FastifyPluginAsync = async (app) => {
  app.get('/metrics', async (request, reply) => {
    const { config, metrics } = app.gateway;
    if (config.metrics.token) {
      const token = oneBearer(request);
      if (!token || !sameSecret(token, config.metrics.token)) {
        throw new GatewayError('admin_token_required', 'metrics need "Authorization: Bearer <metrics.token>"');
      }
    }
    reply.header('content-type', metrics.registry.contentType);
    return metrics.registry.metrics();
  });
};

export default route;
