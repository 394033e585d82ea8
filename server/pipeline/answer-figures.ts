// What the gateway adds to an answer, and the answers it writes itself (SPEC §11): the admission
// and settled figures as headers, a stream's usage chunk and closing comment, a whole completion
// sent as the stream a client asked for, and the labelled evidence excerpt of a run's failed final
// turn (SPEC §5).

import type { FastifyReply } from 'fastify';
import type { Gateway } from '../gateway.js';
import type { Plan } from './plan.js';
import type { JsonOutcome } from './relay-json.js';
import { usageUnderReported, type Settled } from './settle.js';
import { sseData } from './sse.js';
import { completionChunks } from './completion-as-stream.js';
import { evidenceExcerpt, excerptAsRefusal, excerptCompletion, excerptStreamChunks } from '../../metering/runs/evidence-excerpt.js';
import { formatUsdHeader } from '../../pricing/usd-format.js';

/** The figures admission set, as headers: every answer has them, streamed or not. */
export function admissionHeaders(plan: Plan, notices: string[]): Record<string, string | string[]> {
  const h: Record<string, string | string[]> = {
    'x-tollgate-conversation': plan.conversation,
    'x-tollgate-reserved-tokens': String(plan.promptCharge + plan.allowance),
    'x-tollgate-shared-prefix-tokens': String(plan.sharedPrefixTokens),
    'x-tollgate-count-method': plan.rows.countMethod,
  };
  if (notices.length > 0) h['x-tollgate-notice'] = notices;
  return h;
}

export function settledHeaders(s: Settled): Record<string, string> {
  const h: Record<string, string> = {
    'x-tollgate-charge-tokens': String(s.chargeTokens),
    'x-tollgate-refund-tokens': String(s.refundTokens),
  };
  const cost = formatUsdHeader(s.costUsd);
  if (cost !== null) h['x-tollgate-cost-usd'] = cost;
  return h;
}

/** The usage of a turn refunded whole: the upstream failed before any output (SPEC §11). */
export const NOTHING_USED = { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 } as const;

/**
 * The figures of the usage chunk the gateway writes at a stream's end: the upstream's, but the
 * gateway's own where there are none (a stream cut short, a server that sent none) or they are
 * known short (llama.cpp counts one row and one choice). The gateway's own carry their labels, as
 * every count does (SPEC §2): `count_method` for the prompt's, `output_method` for the output's —
 * a byte estimate is never to be taken for the provider's metering.
 */
export function usageChunkFigures(plan: Plan, upstream: Record<string, unknown> | null, settled: Settled): Record<string, unknown> {
  if (upstream && !usageUnderReported(plan)) return upstream;
  return {
    prompt_tokens: plan.rows.sumTokens,
    completion_tokens: settled.generated,
    total_tokens: plan.rows.sumTokens + settled.generated,
    count_method: plan.rows.countMethod,
    output_method: settled.outputMethod,
  };
}

/** A stream's closing comment (SPEC §11): the settled figures, the notices, and whether the excerpt answered. */
export function closingComment(settled: Settled, fallback: boolean): string {
  const trailer: Record<string, unknown> = { charge_tokens: settled.chargeTokens, refund_tokens: settled.refundTokens, cost_usd: settled.costUsd };
  if (settled.notices.length > 0) trailer.notices = settled.notices;
  if (fallback) trailer.fallback = 'evidence-excerpt';
  return `: tollgate ${JSON.stringify(trailer)}\n\n`;
}

/**
 * A whole completion sent to a client that asked for a stream: its chunks, the usage chunk if the
 * client asked for usage, the settled figures in the closing comment, then [DONE], as a stream ends.
 */
export function sendAsStream(plan: Plan, reply: FastifyReply, json: JsonOutcome, headers: Record<string, string | string[]>, settled: Settled): void {
  const chunks = completionChunks(json.body, plan.valid.kind === 'chat');
  let body = chunks.map((c) => sseData(c)).join('');
  if (plan.valid.includeUsage) {
    const usage = usageChunkFigures(plan, json.usage, settled);
    const { choices: _c, ...meta } = chunks[0] ?? {};
    body += sseData({ ...meta, choices: [], usage });
  }
  body += closingComment(settled, json.fallback === 'partial');
  body += 'data: [DONE]\n\n';
  reply.code(200).headers({ ...headers, 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' }).send(body);
}

/** The final turn failed, came back empty or only proposed tools: answer with the labelled excerpt. */
export function sendFallback(gw: Gateway, plan: Plan, reply: FastifyReply, notices: string[], settled: Settled, finishLog: (s: number) => void): void {
  gw.metrics.fallback.inc();
  const text = evidenceExcerpt(plan.valid.messages ?? []);
  const headers = { ...admissionHeaders(plan, [...notices, ...settled.notices]), ...settledHeaders(settled), 'x-tollgate-fallback': 'evidence-excerpt' };
  finishLog(200);
  // Usage: nothing where the turn failed and was refunded whole; what was charged where the model
  // read the prompt and wrote (only tool calls, or nothing visible).
  const usage = settled.chargeTokens === 0 ? NOTHING_USED : usageChunkFigures(plan, null, settled);
  if (!plan.valid.stream) {
    reply.code(200).headers(headers).send({ ...excerptCompletion(plan.model, text, { asRefusal: excerptAsRefusal(plan.valid.body), n: plan.valid.n }), usage });
    return;
  }
  let body = '';
  const chunks = excerptStreamChunks(plan.model, text, false, { asRefusal: excerptAsRefusal(plan.valid.body), n: plan.valid.n });
  for (const chunk of chunks) body += sseData(chunk);
  if (plan.valid.includeUsage) body += sseData({ ...chunks[0], choices: [], usage });
  body += closingComment(settled, true);
  body += 'data: [DONE]\n\n';
  reply.code(200).headers({ ...headers, 'content-type': 'text/event-stream; charset=utf-8', 'cache-control': 'no-cache' }).send(body);
}
