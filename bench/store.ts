// The SQLite ledger alone, as the ledger grows: CPU per request — what one new conversation's
// request asks of the store: the conversation look-up by chain hashes, one admission, one
// settlement with the new head — over successive slices of 10,000 requests, 16 in
// flight, a fresh ledger file per variant. The gateway's ids (time-ordered: ADR 0015) beside the
// random UUIDs it used before, so the effect of key order stays measured.

import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createHash, randomUUID } from 'node:crypto';
import { SqliteLedger } from '../metering/stores/sqlite-store.js';
import { acquireOwnerLock } from '../metering/stores/sqlite-owner-lock.js';
import type { Reservation, Settlement } from '../metering/ledger.js';
import { uuidV7 } from '../metering/ids.js';

export interface StoreBenchRow {
  variant: string;
  /** CPU µs per request in each slice of `slice` requests. */
  cpuMicros: number[];
}

const IN_FLIGHT = 16;
const hash22 = (s: string) => createHash('sha256').update(s).digest('base64url').slice(0, 22);

type Ids = { request: () => string; conversation: () => string; run: (conversation: string) => string };

const ORDERED: Ids = {
  request: () => `req-${uuidV7()}`,
  conversation: () => `conv-${uuidV7()}`,
  run: (c) => `${c}/${createHash('sha256').update(c).digest('hex').slice(0, 32)}`,
};
const RANDOM: Ids = {
  request: () => `req-${randomUUID()}`,
  conversation: () => `conv-${randomUUID()}`,
  run: (c) => createHash('sha256').update(c).digest('hex').slice(0, 32),
};

const VARIANTS: Array<{ name: string; ids: Ids }> = [
  { name: 'time-ordered ids (the gateway now)', ids: ORDERED },
  { name: 'random UUIDs (before ADR 0015)', ids: RANDOM },
];

function reservation(ids: Ids, time: number): Reservation {
  const conversation = ids.conversation();
  return {
    id: ids.request(),
    time,
    tenant: 'bench',
    keyId: 'key-bench',
    conversation,
    parent: null,
    run: ids.run(conversation),
    model: 'gpt-4o-mini',
    upstream: 'openai',
    endpoint: '/v1/chat/completions',
    mode: 'normal',
    finalReason: null,
    rows: 1,
    promptTokens: 240,
    countMethod: 'tiktoken:o200k_base',
    sharedPrefixTokens: 0,
    promptCharge: 240,
    allowance: 256,
    runBudgetTokens: 65_536,
    worstCaseUsd: 0.0002,
    month: '2026-11',
  };
}

function settlement(r: Reservation): Settlement {
  return {
    status: 200,
    generatedTokens: 128,
    outputMethod: 'provider',
    chargeTokens: r.promptCharge + 128,
    refundTokens: r.allowance - 128,
    costUsd: 0.0001,
    savedUsd: null,
    planWorkUsd: null,
    billing: 'metered',
    upstreamFigures: { promptTokens: 240, completionTokens: 128, cachedTokens: 0, promptN: null, cacheN: null },
    fallback: false,
    finishedAt: r.time + 30,
  };
}

async function oneVariant(ids: Ids, slices: number, slice: number): Promise<number[]> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-store-bench-'));
  const path = join(dir, 'ledger.db');
  // Opened as the gateway opens it: the owner of its file (ADR 0016), which lets the ledger skip
  // the look-up of a chain that ends no head (ADR 0017).
  const ledger = new SqliteLedger({ path, synchronous: 'NORMAL', owner: await acquireOwnerLock(path) });
  // The first three messages are every conversation's (a shared system prompt and opening turn).
  const opening = ['system', 'user-1', 'assistant-1'].map(hash22);
  const out: number[] = [];
  try {
    const request = async () => {
      const r = reservation(ids, Date.now());
      const chain = [...opening, hash22(r.id)];
      // A new conversation has no head and no run to read.
      await ledger.findConversationByChain(r.keyId, r.tenant, chain);
      await ledger.admit(r);
      // The upstream's turn: the settlement comes in a later turn of the event loop.
      await new Promise((resolve) => setImmediate(resolve));
      await ledger.settle(r.id, settlement(r), {
        conversation: r.conversation,
        keyId: r.keyId,
        tenant: r.tenant,
        model: r.model,
        toolHash: '',
        serverId: 'bench-server',
        chain,
        prefix: [0, 60, 120, 200, 240],
        prefixDigests: null,
        lastCostUsd: 0.0001,
        lastPromptTokens: 240,
        lastOutputTokens: 128,
        time: r.time,
      });
    };
    for (let s = 0; s < slices; s++) {
      const before = process.cpuUsage();
      await Promise.all(
        Array.from({ length: IN_FLIGHT }, async () => {
          for (let i = 0; i < slice / IN_FLIGHT; i++) await request();
        }),
      );
      const used = process.cpuUsage(before);
      out.push((used.user + used.system) / slice);
    }
  } finally {
    await ledger.close();
    rmSync(dir, { recursive: true, force: true });
  }
  return out;
}

export async function storeBench(slices = 4, slice = 10_000): Promise<StoreBenchRow[]> {
  const rows: StoreBenchRow[] = [];
  for (const v of VARIANTS) rows.push({ variant: v.name, cpuMicros: await oneVariant(v.ids, slices, slice) });
  return rows;
}
