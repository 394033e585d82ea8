// The gateway as the benchmark runs it: built with buildApp from a config parsed by parseConfig,
// a SQLite ledger in a temp folder (synchronous NORMAL or FULL) or PostgreSQL, one metered OpenAI
// upstream, one configured key with a monthly budget — so every request takes the full path:
// auth, tiktoken counting, run and money admission, forward, relay with output counting, settle.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { AddressInfo } from 'node:net';
import type { FastifyInstance } from 'fastify';
import { Registry } from 'prom-client';
import { buildApp } from '../server/app.js';
import { parseConfig } from '../server/config.js';

export type StoreChoice = { kind: 'sqlite'; synchronous: 'NORMAL' | 'FULL' } | { kind: 'postgres'; url: string };

export interface BenchGateway {
  url: string;
  app: FastifyInstance;
  registry: Registry;
  close(): Promise<void>;
}

export const BENCH_KEY = 'tg-bench';

export async function startBenchGateway(upstreamUrl: string, store: StoreChoice, extra: Record<string, unknown> = {}): Promise<BenchGateway> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-bench-'));
  const config = parseConfig(
    {
      store: store.kind === 'sqlite' ? { kind: 'sqlite', path: join(dir, 'ledger.db'), synchronous: store.synchronous } : { kind: 'postgres', url: store.url },
      upstreams: [
        { name: 'openai', kind: 'openai', baseUrl: `${upstreamUrl}/v1`, apiKeyEnv: 'BENCH_UPSTREAM_KEY', models: ['gpt-*'], billing: 'metered', contextWindow: 128_000 },
      ],
      auth: { keys: [{ key: BENCH_KEY, tenant: 'bench', monthlyBudgetUsd: 1_000_000 }] },
      logging: { level: 'silent' },
      ...extra,
    },
    {},
  );
  const registry = new Registry();
  const app = await buildApp({ config, registry, env: { BENCH_UPSTREAM_KEY: 'sk-upstream' } });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const { port } = app.server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    app,
    registry,
    close: async () => {
      await app.close();
      rmSync(dir, { recursive: true, force: true });
    },
  };
}
