// A small closed-loop load generator on undici: `concurrency` workers, each sending its next request
// as soon as the previous one's body has been read to the end, until `requests` have been sent.
// Bounded by count, never by time, so a run always stops by itself. Latency is measured per
// request from send to the last byte of the body (for streams: the whole stream).

import { performance } from 'node:perf_hooks';
import { Pool } from 'undici';

export interface LoadOptions {
  url: string;
  path: string;
  headers: Record<string, string>;
  body: (i: number) => string;
  concurrency: number;
  requests: number;
  /** Start numbering request bodies here (so bodies stay unique across trials). */
  firstIndex: number;
}

export interface LoadResult {
  latenciesMs: number[];
  wallMs: number;
  rps: number;
}

export async function runLoad(o: LoadOptions): Promise<LoadResult> {
  const pool = new Pool(o.url, { connections: o.concurrency, pipelining: 1, keepAliveTimeout: 30_000 });
  const latencies: number[] = new Array<number>(o.requests);
  let next = 0;
  const worker = async () => {
    for (let i = next++; i < o.requests; i = next++) {
      const payload = o.body(o.firstIndex + i);
      const t = performance.now();
      const res = await pool.request({ path: o.path, method: 'POST', headers: o.headers, body: payload });
      let last = '';
      for await (const chunk of res.body) last = (chunk as Buffer).toString('latin1');
      latencies[i] = performance.now() - t;
      if (res.statusCode !== 200) throw new Error(`${o.url}${o.path} answered ${res.statusCode}: ${last.slice(0, 300)}`);
    }
  };
  const t0 = performance.now();
  try {
    await Promise.all(Array.from({ length: o.concurrency }, worker));
  } finally {
    await pool.close();
  }
  const wallMs = performance.now() - t0;
  return { latenciesMs: latencies, wallMs, rps: (o.requests / wallMs) * 1000 };
}
