// GET /healthz (the process answers) and GET /readyz (the store answers; upstreams reported).

import type { FastifyPluginAsync } from 'fastify';

const route: FastifyPluginAsync = async (app) => {
  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/readyz', async (_request, reply) => {
    const gw = app.gateway;
    let store: { ok: boolean; kind: string; error?: string };
    try {
      await gw.ledger.ping();
      store = { ok: true, kind: gw.ledger.kind };
    } catch (err) {
      store = { ok: false, kind: gw.ledger.kind, error: (err as Error).message };
    }
    // Upstreams are reported, not required: one being down must not take the gateway out of a
    // load balancer that also routes to the others.
    const upstreams = await Promise.all(
      gw.upstreams.list.map(async (u) => {
        const path = u.config.kind === 'llamacpp' ? `${u.basePath.replace(/\/v1$/, '')}/health` : `${u.basePath}/models`;
        try {
          const res = await u.dispatcher.request({
            origin: u.origin,
            path,
            method: 'GET',
            headers: u.apiKey ? { authorization: `Bearer ${u.apiKey}` } : {},
            signal: AbortSignal.timeout(2000),
          });
          await res.body.dump();
          return { name: u.name, reachable: true, status: res.statusCode };
        } catch (err) {
          return { name: u.name, reachable: false, error: (err as Error).message };
        }
      }),
    );
    reply.code(store.ok ? 200 : 503);
    return { status: store.ok ? 'ready' : 'not ready', store, upstreams };
  });
};

export default route;
