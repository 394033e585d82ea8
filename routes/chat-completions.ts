// POST /v1/chat/completions — proxied through the shared pipeline (server/pipeline/run-request.ts).

import type { FastifyPluginAsync } from 'fastify';
import { handleProxy } from '../server/pipeline/run-request.js';

const route: FastifyPluginAsync = async (app) => {
  app.post('/v1/chat/completions', (request, reply) => handleProxy(app.gateway, 'chat', request, reply));
};

export default route;
