// One ledger test suite, both stores: each factory makes a fresh, empty, migrated ledger and can
// open more handles on the same storage (as a second process or replica would). SQLite always
// runs (a temp file on disk); PostgreSQL runs when TOLLGATE_TEST_PG_URL is set, each ledger in
// its own schema so test files can run in parallel against one database.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import type { ConversationHead, Ledger, Reservation, Settlement } from '../../metering/ledger.js';
import { SqliteLedger } from '../../metering/stores/sqlite-store.js';
import { PostgresLedger } from '../../metering/stores/postgres-store.js';
import { openStore } from '../../metering/stores/open-store.js';

/** The part of a tap test these helpers use. */
export interface TestLike {
  teardown(fn: () => void | Promise<void>): void;
  comment(...args: unknown[]): void;
}

export interface FreshStore {
  ledger: Ledger;
  /** Another handle on the same storage (a second connection, as another process would). */
  reopen(): Promise<Ledger>;
  /** SQLite: the file's path (for tests that spawn processes); postgres: null. */
  sqlitePath: string | null;
  /**
   * Make an open reservation last said alive `agoMs` ago by the clock its store judges staleness
   * on (ADR 0011): `now` on SQLite (through keepAlive), the database's own on PostgreSQL — written
   * in SQL there, as a replica that went away would have left it (keepAlive only says "now").
   */
  saidAlive(id: string, agoMs: number, now: number): Promise<void>;
}

export interface StoreFactory {
  kind: 'sqlite' | 'postgres';
  create(t: TestLike): Promise<FreshStore>;
}

const sqliteFactory: StoreFactory = {
  kind: 'sqlite',
  async create(t) {
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-ledger-'));
    const path = join(dir, 'ledger.db');
    const handles: Ledger[] = [];
    const open = async () => {
      const l = await openStore({ kind: 'sqlite', path });
      handles.push(l);
      return l;
    };
    const ledger = await open();
    t.teardown(async () => {
      for (const h of handles) await h.close();
      rmSync(dir, { recursive: true, force: true });
    });
    const saidAlive = (id: string, agoMs: number, now: number) => ledger.keepAlive([id], now - agoMs);
    return { ledger, reopen: open, sqlitePath: path, saidAlive };
  },
};

function postgresFactory(url: string): StoreFactory {
  return {
    kind: 'postgres',
    async create(t) {
      const schema = `tg_test_${randomUUID().replace(/-/g, '').slice(0, 16)}`;
      const handles: Ledger[] = [];
      const open = async () => {
        const l = await openStore({ kind: 'postgres', url, schema });
        handles.push(l);
        return l;
      };
      const ledger = await open();
      t.teardown(async () => {
        for (const h of handles) await h.close();
        const admin = new pg.Client({ connectionString: url });
        await admin.connect();
        await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
        await admin.end();
      });
      const saidAlive = async (id: string, agoMs: number) => {
        const client = new pg.Client({ connectionString: url });
        await client.connect();
        try {
          await client.query(
            `UPDATE ${schema}.ledger_rows SET alive_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $2::bigint WHERE id = $1`,
            [id, agoMs],
          );
        } finally {
          await client.end();
        }
      };
      return { ledger, reopen: open, sqlitePath: null, saidAlive };
    },
  };
}

/** The stores to run a suite against; says so (a tap comment) when PostgreSQL is left out. */
export function storeFactories(t: TestLike): StoreFactory[] {
  const url = process.env.TOLLGATE_TEST_PG_URL;
  if (!url) {
    t.comment('PostgreSQL variant NOT RUN: TOLLGATE_TEST_PG_URL is not set (eval "$(bash .ci/postgres.sh)")');
    return [sqliteFactory];
  }
  return [sqliteFactory, postgresFactory(url)];
}

export { SqliteLedger, PostgresLedger };

let seq = 0;
/** A reservation with small defaults; tests override what they check. */
export function reservation(over: Partial<Reservation> = {}): Reservation {
  seq++;
  return {
    id: `req-${seq}-${randomUUID().slice(0, 8)}`,
    time: Date.UTC(2025, 5, 10, 12, 0, 0) + seq,
    tenant: 'acme',
    keyId: 'key-1',
    conversation: 'conv-1',
    parent: null,
    run: 'run-1',
    model: 'gpt-4o-mini',
    upstream: 'openai',
    endpoint: '/v1/chat/completions',
    mode: 'normal',
    finalReason: null,
    rows: 1,
    promptTokens: 100,
    countMethod: 'tiktoken:o200k_base',
    sharedPrefixTokens: 0,
    promptCharge: 100,
    allowance: 50,
    runBudgetTokens: 65536,
    worstCaseUsd: null,
    month: '2025-06',
    ...over,
  };
}

/** A settlement of `r` that generated `generated` tokens and cost `costUsd`. */
export function settlement(r: Reservation, generated: number, over: Partial<Settlement> = {}): Settlement {
  return {
    status: 200,
    generatedTokens: generated,
    outputMethod: 'provider',
    chargeTokens: r.promptCharge + generated,
    refundTokens: Math.max(0, r.allowance - generated),
    costUsd: null,
    savedUsd: null,
    planWorkUsd: null,
    billing: 'metered',
    upstreamFigures: { promptTokens: r.promptTokens, completionTokens: generated, cachedTokens: null, promptN: null, cacheN: null },
    fallback: false,
    finishedAt: r.time + 1000,
    ...over,
  };
}

/** A conversation head with small defaults; tests override what they check. */
export function conversationHead(over: Partial<ConversationHead>): ConversationHead {
  return {
    conversation: 'c',
    keyId: 'key-1',
    tenant: 'acme',
    model: 'gpt-4o',
    toolHash: '',
    serverId: 'server-a',
    chain: ['h1'],
    prefix: [0, 10],
    prefixDigests: null,
    lastCostUsd: null,
    lastPromptTokens: 10,
    lastOutputTokens: 5,
    time: 1000,
    ...over,
  };
}

/** Collect an async iterable (export) into an array. */
export async function collect<T>(it: AsyncIterable<T>): Promise<T[]> {
  const out: T[] = [];
  for await (const x of it) out.push(x);
  return out;
}
