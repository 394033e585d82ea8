// Counting benchmarks (SPEC §3): work per request grows with the new content, not the whole
// conversation, and tokenizing pathological input stays linear.
//   1. A 100-turn conversation through a real gateway: plan() timed directly on each turn (with
//      its new messages not yet counted, as a real turn arrives), and, on other conversations,
//      the gateway's own tollgate_gateway_overhead_seconds per request over HTTP.
//   2. 10 KB, 100 KB and 1 MB without spaces (one repeated character, and random characters):
//      plan() time, which must grow linearly; 1 MB within 20 ms.

import { performance } from 'node:perf_hooks';
import { request } from 'undici';
import { startBenchUpstream } from './upstream.js';
import { startBenchGateway, BENCH_KEY, type BenchGateway } from './gateway-target.js';
import { plan } from '../server/pipeline/plan.js';
import { validateRequest } from '../server/pipeline/endpoints.js';
import { median } from './stats.js';

const SYSTEM = 'You are a research assistant. Answer from the sources you are given and name them.';

function userTurn(conv: number, turn: number): string {
  return (
    `Conversation ${conv}, turn ${turn}. Following up on what you said: how does the retry policy interact ` +
    `with idempotency keys when the upstream times out after the request was accepted but before the ` +
    `response arrived? Please compare at-least-once and at-most-once delivery, with an example for turn ${turn}.`
  );
}

function assistantTurn(conv: number, turn: number): string {
  return (
    `In conversation ${conv} at turn ${turn}: a timeout after acceptance is the hard case, because the client cannot ` +
    `tell whether the work happened. With an idempotency key the retry is safe: the server stores the key with the ` +
    `outcome and answers a repeated key with the stored outcome instead of doing the work again. Without one, a retry ` +
    `gives at-least-once delivery (duplicates possible), and not retrying gives at-most-once (losses possible). For ` +
    `payments choose keys and at-least-once; for notifications a rare duplicate is usually acceptable. Sources: the ` +
    `HTTP semantics RFC on idempotent methods, and the provider's own retry documentation.`
  );
}

async function overheadSum(gw: BenchGateway): Promise<number> {
  const metric = gw.registry.getSingleMetric('tollgate_gateway_overhead_seconds');
  if (!metric) return 0;
  const { values } = await metric.get();
  // A histogram's values carry the series name (…_bucket, …_sum, …_count) beside their labels.
  const named = values as Array<{ value: number; metricName?: string }>;
  return named.filter((v) => v.metricName === 'tollgate_gateway_overhead_seconds_sum').reduce((a, v) => a + v.value, 0);
}

export interface ConversationResult {
  /** Median over conversations of plan() ms at each turn (index 0 = turn 1). */
  planMs: number[];
  /** The same for JSON.parse + validation of the body, which comes before plan(). */
  parseMs: number[];
  /** Median over conversations of gateway overhead ms at each turn, over HTTP. */
  overheadMs: number[];
  conversations: number;
}

export async function conversationBench(conversations = 40, turns = 100): Promise<ConversationResult> {
  const upstream = await startBenchUpstream({ completionTokens: 64 });
  const gw = await startBenchGateway(upstream.url, { kind: 'sqlite', synchronous: 'NORMAL' });
  const g = gw.app.gateway;
  const principal = await g.auth.authenticate(`Bearer ${BENCH_KEY}`);
  const planRuns: number[][] = [];
  const parseRuns: number[][] = [];
  const overheadRuns: number[][] = [];
  try {
    // Warm up the tokenizer, JIT and ledger on a throwaway conversation.
    for (let i = 0; i < 20; i++) {
      const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: userTurn(-1, i) }], max_tokens: 64 };
      await plan(g, validateRequest('chat', body), principal, {});
    }
    for (let c = 0; c < conversations; c++) {
      const timePlan = c % 2 === 0;
      const series: number[] = [];
      const parseSeries: number[] = [];
      const messages: Array<{ role: string; content: string }> = [{ role: 'system', content: SYSTEM }];
      for (let turn = 1; turn <= turns; turn++) {
        messages.push({ role: 'user', content: userTurn(c, turn) });
        const body = { model: 'gpt-4o-mini', messages, max_tokens: 64 };
        const text = JSON.stringify(body);
        if (timePlan) {
          // The same work the pipeline does before planning, parse and validate the body, timed
          // apart: it is linear in the body in any proxy that reads JSON.
          const t = performance.now();
          const valid = validateRequest('chat', JSON.parse(text));
          const tPlan = performance.now();
          await plan(g, valid, principal, {});
          series.push(performance.now() - tPlan);
          parseSeries.push(tPlan - t);
        }
        const before = await overheadSum(gw);
        const res = await request(`${gw.url}/v1/chat/completions`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', authorization: `Bearer ${BENCH_KEY}` },
          body: text,
        });
        const answer = await res.body.text();
        if (res.statusCode !== 200) throw new Error(`turn ${turn} answered ${res.statusCode}: ${answer.slice(0, 300)}`);
        if (!timePlan) series.push(((await overheadSum(gw)) - before) * 1000);
        messages.push({ role: 'assistant', content: assistantTurn(c, turn) });
      }
      (timePlan ? planRuns : overheadRuns).push(series);
      if (timePlan) parseRuns.push(parseSeries);
    }
  } finally {
    await gw.close();
    await upstream.close();
  }
  const byTurn = (runs: number[][]) => Array.from({ length: turns }, (_, i) => median(runs.map((r) => r[i])));
  return { planMs: byTurn(planRuns), parseMs: byTurn(parseRuns), overheadMs: byTurn(overheadRuns), conversations };
}

/** Letters, digits and punctuation without whitespace, from a seeded generator (repeatable). */
function noSpaces(bytes: number, seed: number): string {
  const alphabet = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=_-.,;:';
  let x = seed >>> 0 || 1;
  const out = new Uint8Array(bytes);
  for (let i = 0; i < bytes; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = alphabet.charCodeAt((x >>> 0) % alphabet.length);
  }
  // One flat string, as JSON.parse gives the gateway (a string built by `+=` is a rope whose
  // flattening would be timed as if it were counting work).
  return Buffer.from(out).toString('latin1');
}

export interface PathologicalRow {
  shape: 'repeated' | 'random';
  bytes: number;
  planMs: number;
  tokens: number;
  countMethod: string;
}

export async function pathologicalBench(trials = 5): Promise<PathologicalRow[]> {
  const upstream = await startBenchUpstream({ completionTokens: 8 });
  // Limits lifted so that plan() counts the whole input instead of refusing it part-way.
  const gw = await startBenchGateway(
    upstream.url,
    { kind: 'sqlite', synchronous: 'NORMAL' },
    {
      limits: { maxRowTokens: 1 << 26, maxRequestTokens: 1 << 30 },
      upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstream.url}/v1`, models: ['gpt-*'], billing: 'metered', contextWindow: 1 << 26 }],
    },
  );
  const g = gw.app.gateway;
  const principal = await g.auth.authenticate(`Bearer ${BENCH_KEY}`);
  const rows: PathologicalRow[] = [];
  try {
    const once = async (content: string) => {
      const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content }], max_tokens: 16 };
      const t = performance.now();
      const p = await plan(g, validateRequest('chat', body), principal, {});
      return { ms: performance.now() - t, tokens: p.rows.sumTokens, method: p.rows.countMethod };
    };
    await once(noSpaces(50_000, 99)); // warm-up
    let seed = 1;
    for (const bytes of [10_000, 100_000, 1_000_000]) {
      for (const shape of ['repeated', 'random'] as const) {
        const runs: Array<{ ms: number; tokens: number; method: string }> = [];
        for (let i = 0; i < trials; i++) {
          // A fresh content each trial, so the per-message count cache never answers.
          const content = shape === 'repeated' ? String.fromCharCode(97 + ((seed++) % 26)).repeat(bytes - 8) + `#${String(seed).padStart(7, '0')}` : noSpaces(bytes, seed++);
          runs.push(await once(content));
        }
        rows.push({ shape, bytes, planMs: median(runs.map((r) => r.ms)), tokens: runs[0].tokens, countMethod: runs[0].method });
      }
    }
  } finally {
    await gw.close();
    await upstream.close();
  }
  return rows;
}
