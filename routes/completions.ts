// POST /v1/completions — proxied through the shared pipeline (server/pipeline/run-request.ts).

import type { FastifyPluginAsync } from 'fastify';
import { handleProxy } from '../server/pipeline/run-request.js';

const route: FastifyPluginAsync = async (app) => {
  app.post('/v1/completions', (request, reply) => handleProxy(app.gateway, 'completions', request, reply));
};

export default route;
