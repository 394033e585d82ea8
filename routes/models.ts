// GET /v1/models — the union of the configured upstreams' models, each with its upstream, billing
// and context window (null when not known). Patterns (`gpt-*`) are listed as they are configured.

import type { FastifyPluginAsync } from 'fastify';
import { requireClient } from '../server/auth-hooks.js';

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
        data.push({
          id,
          object: 'model',
          created: 0,
          owned_by: u.name,
          upstream: u.name,
          billing: u.billing,
          context_window: window,
          pattern: /[*?]/.test(id),
        });
      }
    }
    return { object: 'list', data };
  });
};

export default route;
