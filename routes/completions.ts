// POST /v1/completions — proxied through the shared pipeline (server/pipeline/run-request.ts).

import type { FastifyPluginAsync } from 'fastify';
import { requireClient } from '../server/auth-hooks.js';
import { handleProxy } from '../server/pipeline/run-request.js';

const route: FastifyPluginAsync = async (app) => {
  app.post('/v1/completions', { preHandler: requireClient }, (request, reply) => handleProxy(app.gateway, 'completions', request, reply));
};

export default route;
