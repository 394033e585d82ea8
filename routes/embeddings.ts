// POST /v1/embeddings — proxied through the shared pipeline (server/pipeline/run-request.ts).

import type { FastifyPluginAsync } from 'fastify';
import { handleProxy } from '../server/pipeline/run-request.js';

const route: FastifyPluginAsync = async (app) => {
  app.post('/v1/embeddings', (request, reply) => handleProxy(app.gateway, 'embeddings', request, reply));
};

export default route;
