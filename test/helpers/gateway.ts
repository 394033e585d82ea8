// Starts a real gateway for a test: config parsed like the config file, a SQLite ledger on disk in
// a temp folder, an explicit metrics registry, an injectable clock; listening on 127.0.0.1:0.
// With TOLLGATE_TEST_STORE=postgres (and TOLLGATE_TEST_PG_URL) the ledger is PostgreSQL instead, in
// a fresh schema — `npm run test:postgres` runs the gateway-level suites that way.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { FastifyInstance } from 'fastify';
import { Registry } from 'prom-client';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import type { Ledger } from '../../metering/ledger.js';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { openStore } from '../../metering/stores/open-store.js';

export interface TestGateway {
  app: FastifyInstance;
  url: string;
  ledger: Ledger;
  registry: Registry;
  now: { ms: number };
  dbPath: string;
}

interface Teardown {
  teardown(fn: () => unknown): void;
}

export async function startGateway(
  t: Teardown,
  raw: Record<string, unknown>,
  opts: { env?: NodeJS.ProcessEnv; clock?: boolean; ledger?: Ledger; store?: 'sqlite'; staleReservationMs?: number; sweepIntervalMs?: number; openWithoutKeys?: boolean; settleRetryMs?: number; requestTimeoutMs?: number; propsTimeoutMs?: number; answerCountTimeoutMs?: number; logStream?: NodeJS.WritableStream } = {},
): Promise<TestGateway> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-test-'));
  const dbPath = join(dir, 'ledger.db');
  // A ledger this helper makes for the test (PostgreSQL on request) is closed, and dropped, here.
  let own: { ledger: Ledger; drop: () => Promise<void> } | null = null;
  if (!opts.ledger && opts.store !== 'sqlite' && process.env.TOLLGATE_TEST_STORE === 'postgres') {
    own = await freshPostgres();
  }
  const config = parseConfig({ store: { kind: 'sqlite', path: dbPath }, logging: { level: 'silent' }, ...raw }, {});
  const registry = new Registry();
  const now = { ms: Date.parse('2026-11-15T12:00:00Z') };
  const app = await buildApp({
    config,
    registry,
    env: opts.env ?? { TOLLGATE_ADMIN_TOKEN: 'admin-secret' },
    clock: opts.clock ? () => now.ms : undefined,
    ledger: opts.ledger ?? own?.ledger,
    staleReservationMs: opts.staleReservationMs,
    sweepIntervalMs: opts.sweepIntervalMs,
    openWithoutKeys: opts.openWithoutKeys,
    settleRetryMs: opts.settleRetryMs,
    requestTimeoutMs: opts.requestTimeoutMs,
    propsTimeoutMs: opts.propsTimeoutMs,
    answerCountTimeoutMs: opts.answerCountTimeoutMs,
    // Silent unless the test reads the log (`logStream`: every line at info and above).
    logger: opts.logStream ? { level: 'info', stream: opts.logStream } : undefined,
  });
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  const port = typeof address === 'object' && address ? address.port : 0;
  t.teardown(async () => {
    await app.close();
    if (opts.ledger) await opts.ledger.close();
    if (own) {
      await own.ledger.close();
      await own.drop();
    }
    rmSync(dir, { recursive: true, force: true });
  });
  return { app, url: `http://127.0.0.1:${port}`, ledger: app.gateway.ledger, registry, now, dbPath };
}

async function freshPostgres(): Promise<{ ledger: Ledger; drop: () => Promise<void> }> {
  const url = process.env.TOLLGATE_TEST_PG_URL;
  if (!url) throw new Error('TOLLGATE_TEST_STORE=postgres needs TOLLGATE_TEST_PG_URL');
  const schema = `tg_gw_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
  const ledger = await openStore({ kind: 'postgres', url, schema });
  const drop = async () => {
    const admin = new pg.Client({ connectionString: url });
    await admin.connect();
    await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
    await admin.end();
  };
  return { ledger, drop };
}

/** A plain upstream entry for the OpenAI double. */
export function openaiUpstream(url: string, extra: Record<string, unknown> = {}) {
  return { name: 'openai', kind: 'openai', baseUrl: `${url}/v1`, apiKeyEnv: 'DOUBLE_KEY', models: ['gpt-*'], billing: 'metered', contextWindow: 128000, ...extra };
}

export function llamaUpstream(url: string, extra: Record<string, unknown> = {}) {
  return { name: 'local', kind: 'llamacpp', baseUrl: url, models: ['*'], billing: 'local', ...extra };
}

export async function metricValue(registry: Registry, name: string, labels: Record<string, string> = {}): Promise<number> {
  const metric = (await registry.getMetricsAsJSON()).find((m) => m.name === name);
  if (!metric) return 0;
  let sum = 0;
  for (const v of metric.values as Array<{ value: number; labels: Record<string, string | number>; metricName?: string }>) {
    // Histograms: their `_sum` series (bucket and count series are skipped).
    if (v.metricName && v.metricName !== name && v.metricName !== `${name}_sum`) continue;
    if (Object.entries(labels).every(([k, val]) => String(v.labels[k]) === val)) sum += v.value;
  }
  return sum;
}
