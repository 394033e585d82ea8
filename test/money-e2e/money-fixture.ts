// A gateway with all three ways of charging (SPEC §7) for the money end-to-end tests: a `metered`
// OpenAI double, and a second double behind a `local` and a `plan` upstream. Prices come from an
// override file written to a temp folder (SPEC §11), so every cost below is exact arithmetic.

import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startOpenAiDouble, type OpenAiDouble, type OpenAiDoubleOptions } from '../doubles/openai.js';
import { startGateway, type TestGateway } from '../helpers/gateway.js';

interface Teardown {
  teardown(fn: () => unknown): void;
}

/** USD per million tokens. gpt-4o is made dear and gpt-4o-mini cheap, with round figures. */
export const PRICES = {
  'gpt-4o': { input_mtok: 100, cache_read_mtok: 10, output_mtok: 400, source: 'test', date: '2026-01-01' },
  'gpt-4o-mini': { input_mtok: 1, cache_read_mtok: 0.5, output_mtok: 2, source: 'test', date: '2026-01-01' },
} as const;

/** The list price of a turn, cached input at the cache-read price (genai-prices' convention). */
export function listUsd(model: keyof typeof PRICES, input: number, cached: number, output: number): number {
  const p = PRICES[model];
  return ((input - cached) * p.input_mtok + cached * p.cache_read_mtok + output * p.output_mtok) / 1e6;
}

export const ADMIN = { authorization: 'Bearer admin-secret' };
export const ALICE = 'tg-alice';
export const BOB = 'tg-bob';

export interface MoneyWorld {
  gw: TestGateway;
  /** The metered provider. */
  metered: OpenAiDouble;
  /** Serves both the `local` and the `plan` upstream. */
  other: OpenAiDouble;
}

export interface WorldOptions {
  keys?: Array<Record<string, unknown>>;
  prices?: Record<string, unknown>;
  clock?: boolean;
  metered?: OpenAiDoubleOptions;
  /** The config's `runs` (SPEC §5): the run token budget and bounds. */
  runs?: Record<string, unknown>;
}

export async function moneyWorld(t: Teardown, opts: WorldOptions = {}): Promise<MoneyWorld> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-prices-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const overrides = join(dir, 'prices.json');
  writeFileSync(overrides, JSON.stringify({ models: PRICES }));
  const metered = await startOpenAiDouble(opts.metered ?? {});
  t.teardown(metered.close);
  const other = await startOpenAiDouble({});
  t.teardown(other.close);
  const gw = await startGateway(
    t,
    {
      upstreams: [
        { name: 'provider', kind: 'openai', baseUrl: `${metered.url}/v1`, models: ['gpt-4o', 'gpt-4o-mini', 'gpt-unpriced-x'], billing: 'metered', contextWindow: 128000 },
        { name: 'sub', kind: 'openai', baseUrl: `${other.url}/v1`, models: ['plan-model'], billing: 'plan', contextWindow: 128000 },
        { name: 'box', kind: 'openai', baseUrl: `${other.url}/v1`, models: ['llama-local'], billing: 'local', contextWindow: 128000 },
      ],
      auth: { keys: opts.keys ?? [{ key: ALICE, tenant: 'alice' }, { key: BOB, tenant: 'bob' }] },
      prices: { overrides, ...(opts.prices ?? {}) },
      ...(opts.runs ? { runs: opts.runs } : {}),
    },
    { clock: opts.clock },
  );
  return { gw, metered, other };
}

export interface Reply {
  status: number;
  headers: Headers;
  body: Record<string, unknown>;
}

export interface ErrorBody {
  error: {
    message: string;
    type: string;
    param: string | null;
    code: string;
    spent_usd?: number;
    reserved_usd?: number;
    limit_usd?: number;
    needed_usd?: number;
    scope?: string;
    choices?: {
      raise_to_usd: number;
      cheaper_models: Array<{ model: string; billing: string; upstream: string; allowance_usd?: number }>;
      stop: boolean;
    };
  };
}

export async function call(url: string, method: string, path: string, headers: Record<string, string>, body?: unknown): Promise<Reply> {
  const res = await fetch(`${url}${path}`, {
    method,
    headers: body === undefined ? headers : { 'content-type': 'application/json', ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  const text = await res.text();
  let parsed: Record<string, unknown> = {};
  try {
    parsed = text ? (JSON.parse(text) as Record<string, unknown>) : {};
  } catch {
    parsed = { text };
  }
  return { status: res.status, headers: res.headers, body: parsed };
}

/** POST /v1/chat/completions as `key`, with extra headers (conversation, parent). */
export function chat(gw: TestGateway, key: string, body: Record<string, unknown>, headers: Record<string, string> = {}): Promise<Reply> {
  return call(gw.url, 'POST', '/v1/chat/completions', { authorization: `Bearer ${key}`, ...headers }, body);
}

/** What the gateway would reserve for a request (POST /v1/admission; changes nothing). */
export async function admission(gw: TestGateway, key: string, request: Record<string, unknown>, headers: Record<string, string> = {}) {
  const r = await call(gw.url, 'POST', '/v1/admission', { authorization: `Bearer ${key}`, ...headers }, { endpoint: '/v1/chat/completions', request });
  return r.body as {
    sum_tokens: number;
    max_affordable_allowance: number | null;
    notices: string[] | null;
    cost_usd: { worst_case: number | null; price: Record<string, unknown> | null };
    verdict: { admit: boolean; status: number; error: ErrorBody | null };
  };
}

export const costHeader = (r: Reply): number | null => {
  const v = r.headers.get('x-tollgate-cost-usd');
  return v === null ? null : Number(v);
};

export const close = (a: number, b: number) => Math.abs(a - b) < 1e-9;
