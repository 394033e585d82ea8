// Every Prometheus metric, built in one place against an explicit registry (SPEC §10).
// Labels are bounded: route, upstream (from config), status, reason (an error code), kind.

import { Counter, Histogram, Registry, collectDefaultMetrics } from 'prom-client';

export function initMetrics(registry: Registry = new Registry(), opts: { defaults?: boolean } = {}) {
  if (opts.defaults) collectDefaultMetrics({ register: registry, prefix: 'tollgate_' });
  const registers = [registry];
  const m = {
    registry,
    requests: new Counter({
      name: 'tollgate_requests_total',
      help: 'Requests answered, by route, upstream and status',
      labelNames: ['route', 'upstream', 'status'] as const,
      registers,
    }),
    refusals: new Counter({
      name: 'tollgate_refusals_total',
      help: 'Requests refused before reaching a model, by error code',
      labelNames: ['reason'] as const,
      registers,
    }),
    promptTokens: new Counter({
      name: 'tollgate_prompt_tokens_total',
      help: 'Prompt tokens of admitted requests sent to a model: new (charged at admission) or shared (credited as the previous request\'s prefix, less the 16 kept charged), which add up to the prompt',
      labelNames: ['kind'] as const,
      registers,
    }),
    // Apart from tollgate_prompt_tokens_total, whose kinds are SPEC §10's two and add up to the prompt.
    promptTokensRefunded: new Counter({
      name: 'tollgate_prompt_tokens_refunded_total',
      help: 'New prompt tokens given back: those of requests refunded whole, their upstream having failed before any output',
      registers,
    }),
    outputTokens: new Counter({
      name: 'tollgate_output_tokens_total',
      help: 'Output tokens reserved at admission, generated, and refunded at settlement',
      labelNames: ['kind'] as const,
      registers,
    }),
    costUsd: new Counter({ name: 'tollgate_cost_usd_total', help: 'Money spent, USD', registers }),
    savedUsd: new Counter({ name: 'tollgate_saved_usd_total', help: 'Money saved by cached input, USD', registers }),
    overhead: new Histogram({
      name: 'tollgate_gateway_overhead_seconds',
      help: 'Time spent in the gateway itself (planning, admission, settlement), excluding the upstream',
      labelNames: ['route'] as const,
      buckets: [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers,
    }),
    upstreamDuration: new Histogram({
      name: 'tollgate_upstream_duration_seconds',
      help: 'Time from forwarding a request to the end of its response',
      labelNames: ['upstream'] as const,
      buckets: [0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300],
      registers,
    }),
    finalAnswer: new Counter({
      name: 'tollgate_final_answer_total',
      help: 'Requests sent in final-answer mode, by the bound that was reached',
      labelNames: ['reason'] as const,
      registers,
    }),
    fallback: new Counter({
      name: 'tollgate_fallback_total',
      help: 'Final turns answered with the labelled evidence excerpt',
      registers,
    }),
    divergence: new Histogram({
      name: 'tollgate_charge_divergence_tokens',
      help: "Prompt tokens charged minus the prompt tokens the upstream reports it evaluated",
      labelNames: ['upstream'] as const,
      buckets: [-4096, -1024, -256, -64, -16, 0, 16, 64, 256, 1024, 4096, 16384],
      registers,
    }),
  };
  return m;
}

export type Metrics = ReturnType<typeof initMetrics>;
