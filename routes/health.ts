// GET /healthz (the process answers) and GET /readyz (the store answers; upstreams reported).

import type { FastifyPluginAsync } from 'fastify';
import { RECENT_FAILURE_MS, storeCode, storeError } from '../server/ledger-guard.js';

const PING_TIMEOUT_MS = 2_000;

/** `work`, or after `ms` an error whose code (shown by /readyz) is `timeout`. */
function withTimeout<T>(work: Promise<T>, ms: number, message: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(Object.assign(new Error(message), { code: 'timeout' })), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

/** A failed probe's code: the socket's (`ECONNREFUSED`, `ENOTFOUND`), undici's (`UND_ERR_…`), or `timeout`. */
export function upstreamCode(err: unknown): string {
  const e = err as { name?: unknown; code?: unknown; cause?: { code?: unknown } } | null;
  if (e?.name === 'TimeoutError' || e?.name === 'AbortError') return 'timeout';
  for (const code of [e?.code, e?.cause?.code]) if (typeof code === 'string' && /^[A-Z0-9_]{1,64}$/.test(code)) return code;
  return 'error';
}

const route: FastifyPluginAsync = async (app) => {
  app.get('/healthz', async () => ({ status: 'ok' }));

  app.get('/readyz', async (request, reply) => {
    const gw = app.gateway;
    // The store answers within 2 s, and takes what it is given: settlements it refused (a full
    // disk, a server away) are tried again every few seconds, so this turns ready by itself once
    // they are written (server/pipeline/settle-retry.ts); a request it failed lately keeps it
    // unready until the same kind of call goes through or 10 s pass (server/ledger-guard.ts).
    let store: { ok: boolean; kind: string; error?: string; settlements_waiting?: number };
    try {
      await withTimeout(gw.ledger.ping(), PING_TIMEOUT_MS, `the ledger did not answer in ${PING_TIMEOUT_MS} ms`);
      const waiting = gw.settleRetry.size;
      // A read answering says nothing of writes: a request the ledger failed lately counts too.
      const failed = gw.storeFailures.recent();
      if (waiting > 0) store = { ok: false, kind: gw.ledger.kind, error: `the ledger refuses writes (${gw.settleRetry.lastCode ?? 'error'})`, settlements_waiting: waiting };
      else if (failed !== null) store = { ok: false, kind: gw.ledger.kind, error: `the ledger failed a request in the last ${RECENT_FAILURE_MS / 1000} s (${failed})` };
      else store = { ok: true, kind: gw.ledger.kind };
    } catch (err) {
      // The store's code, not its words (they can name its host, database or user): this route is public.
      store = { ok: false, kind: gw.ledger.kind, error: `the ledger did not answer (${storeCode(err)})` };
      request.log.warn({ err: storeError(err) }, 'readiness: the ledger did not answer');
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
          // Its code, not undici's words: they name the upstream's address, and this route is public.
          // At debug, as the probes are: a load balancer asks every few seconds, and anyone may.
          request.log.debug({ upstream: u.name, err: { message: (err as Error).message, code: upstreamCode(err) } }, 'readiness: an upstream did not answer');
          return { name: u.name, reachable: false, error: `the upstream did not answer (${upstreamCode(err)})` };
        }
      }),
    );
    reply.code(store.ok ? 200 : 503);
    return { status: store.ok ? 'ready' : 'not ready', store, upstreams };
  });
};

export default route;
