// Load generation with autocannon (its programmatic API): `connections` keep-alive connections,
// one request in flight on each (pipelining 1), `amount` requests in all — bounded by count, never
// by time, so a run always stops by itself. Every request body is built by `setupRequest`, so each
// one is unique. autocannon counts a request done when its response message is complete, i.e.
// after the last byte of the body (for SSE: the whole stream, up to `data: [DONE]`).
//
// What autocannon's result is not used for, and why:
// - Latency percentiles: its histogram stores whole milliseconds (latency.p50 of a 0.6 ms request
//   is 0), too coarse for a proxy's added latency. Each response's time, which autocannon measures
//   itself (hrtime, from writing the request to the end of the response), is taken from its
//   'response' event instead, and the percentiles are computed from those samples.
// - Throughput: `requests.average` is requests per sample interval, and the run resolves only at
//   the next sample tick after the last response. Throughput here is amount / (time from the
//   start to the last response).
// Any status other than 200, connection error or timeout fails the run (with the first error body).

import autocannon from 'autocannon';
import { performance } from 'node:perf_hooks';

export interface LoadOptions {
  url: string;
  path: string;
  headers: Record<string, string>;
  /** The next request's body; called once per request. */
  body: () => string;
  connections: number;
  /** Requests in all; at least `connections` (autocannon splits them evenly over the connections). */
  amount: number;
}

export interface LoadResult {
  latenciesMs: number[];
  wallMs: number;
  rps: number;
}

export async function runLoad(o: LoadOptions): Promise<LoadResult> {
  const latencies: number[] = [];
  let badStatus = 0;
  let firstBad = '';
  let firstError = '';
  let lastResponse = 0;
  const started = performance.now();
  // The promise autocannon returns is also its event emitter (the typings give only the promise).
  const instance = autocannon({
    url: o.url,
    method: 'POST',
    headers: o.headers,
    connections: o.connections,
    pipelining: 1,
    amount: o.amount,
    timeout: 30,
    // Stop at the first connection error or timeout instead of reconnecting forever.
    bailout: 1,
    // The result is handed over at the first sample tick after the last response: keep that short.
    sampleInt: 50,
    requests: [
      {
        path: o.path,
        setupRequest: (req) => ({ ...req, body: o.body() }),
        onResponse: (status, body) => {
          if (status !== 200 && !firstBad) firstBad = `${status}: ${body.slice(0, 300)}`;
        },
      },
    ],
  }) as unknown as autocannon.Instance & Promise<autocannon.Result>;
  instance.on('response', (_client, statusCode, _bytes, responseTime) => {
    lastResponse = performance.now();
    if (statusCode !== 200) badStatus++;
    latencies.push(responseTime);
  });
  instance.on('reqError', (err: unknown) => {
    if (!firstError) firstError = err instanceof Error ? err.message : String(err);
  });
  const r = await instance;
  const where = `${o.url}${o.path} (${o.connections} connections, ${o.amount} requests)`;
  if (badStatus > 0 || r.non2xx > 0) {
    throw new Error(`${where}: ${badStatus || r.non2xx} responses were not 200; first: ${firstBad}`);
  }
  if (r.errors > 0 || r.timeouts > 0) throw new Error(`${where}: ${r.errors} errors (${r.timeouts} timeouts); first: ${firstError}`);
  if (latencies.length !== o.amount) throw new Error(`${where}: ${latencies.length} responses, expected ${o.amount}`);
  const wallMs = lastResponse - started;
  return { latenciesMs: latencies, wallMs, rps: (o.amount / wallMs) * 1000 };
}
