// The baseline: a bare pass-through proxy on the same stack as the gateway (fastify + one undici
// Pool), with no metering at all. It forwards POST /v1/chat/completions bodies as bytes, swaps the
// credentials, and pipes the upstream's response back. Whatever the gateway costs beyond this is
// the price of metering (ADR 0008).

import Fastify from 'fastify';
import { Pool } from 'undici';
import type { AddressInfo } from 'node:net';

export interface BareProxy {
  url: string;
  close(): Promise<void>;
}

export async function startBareProxy(upstreamUrl: string): Promise<BareProxy> {
  const origin = new URL(upstreamUrl).origin;
  const pool = new Pool(origin, { connections: 128, keepAliveTimeout: 4_000 });
  const app = Fastify({ logger: false, bodyLimit: 32 * 1024 * 1024 });
  app.removeAllContentTypeParsers();
  app.addContentTypeParser('*', { parseAs: 'buffer' }, (_req, body, done) => done(null, body));
  app.post('/v1/chat/completions', async (request, reply) => {
    const res = await pool.request({
      path: '/v1/chat/completions',
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: 'Bearer sk-upstream' },
      body: request.body as Buffer,
    });
    const type = res.headers['content-type'];
    reply.code(res.statusCode);
    if (typeof type === 'string') reply.header('content-type', type);
    return reply.send(res.body);
  });
  app.addHook('onClose', async () => {
    await pool.close();
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  return { url: `http://127.0.0.1:${port}`, close: () => app.close() };
}
