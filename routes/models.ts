// GET /v1/models — the union of the configured upstreams' models, each with its upstream, billing
// and context window (null when not known). Patterns (`gpt-*`) are listed as they are configured.
// GET /v1/models/{model} — one model name (slashes and all) as the gateway would route it (the SDKs' `retrieve`):
// any name a pattern takes is served, so a client can check a name before using it.

import type { FastifyPluginAsync } from 'fastify';
import { requireClient } from '../server/auth-hooks.js';
import { GatewayError } from '../server/errors.js';
import type { Upstream } from '../server/upstreams.js';

/** A model as the list and `retrieve` show it: OpenAI's fields, then the gateway's. */
function modelEntry(id: string, u: Upstream, contextWindow: number | null) {
  return { id, object: 'model', created: 0, owned_by: u.name, upstream: u.name, billing: u.billing, context_window: contextWindow };
}

const route: FastifyPluginAsync = async (app) => {
  app.get('/v1/models', { preHandler: requireClient }, async () => {
    const gw = app.gateway;
    const seen = new Set<string>();
    const data = [];
    for (const u of gw.upstreams.list) {
      const window = await gw.counters.contextWindow(u, '');
      for (const id of u.config.models) {
        if (seen.has(id)) continue;
        seen.add(id);
        data.push({ ...modelEntry(id, u, window), pattern: /[*?]/.test(id) });
      }
    }
    return { object: 'list', data };
  });

  // The rest of the path, slashes and all: OpenRouter's `anthropic/claude-3.5-sonnet` is one name
  // (the JS SDK sends it encoded, curl and other clients as it is).
  app.get<{ Params: { '*': string } }>('/v1/models/*', { preHandler: requireClient }, async (request) => {
    const gw = app.gateway;
    const id = request.params['*'];
    const u = gw.upstreams.route(id);
    if (!u) throw new GatewayError('model_not_found', `The model \`${id}\` does not exist or is not served by this gateway`, {}, 'model');
    return modelEntry(id, u, await gw.counters.contextWindow(u, id));
  });
};

export default route;
