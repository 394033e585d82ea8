// POST /v1/admission — the plan a request would get, without running a model or changing any
// budget (SPEC §8, §11). It runs the same planning code as the real request, so its verdict carries
// exactly the envelope the real request would get.

import type { FastifyPluginAsync } from 'fastify';
import { requireClient } from '../server/auth-hooks.js';
import { GatewayError } from '../server/errors.js';
import type { Gateway } from '../server/gateway.js';
import { MAX_JSON_DEPTH, nestedDeeperThan, tooDeep } from '../server/body.js';
import { memberValueBytes } from '../server/json-span.js';
import { endpointForPath, validateRequest } from '../server/pipeline/endpoints.js';
import { planHeaders, rowFigures } from '../server/pipeline/plan.js';
import { planRequest } from '../server/pipeline/plan-exact.js';
import { precheck, refusalError, reservationOf, unpricedUnderLimit } from '../server/pipeline/admit.js';
import { budgetsOf, maxAffordableAllowance } from '../server/pipeline/budgets.js';
import { checkAdmission } from '../metering/stores/admission-check.js';
import { noticeHeader } from '../metering/runs/final-answer.js';
import { pricierFor } from '../server/pipeline/settle.js';
import type { ModelPrice } from '../pricing/model-price.js';

/** The plan's fields a request refused before planning finished has no figures for. */
const NOT_PLANNED = {
  model: null,
  upstream: null,
  rows: null,
  row_tokens: null,
  longest_row: null,
  longest_row_index: null,
  sum_tokens: null,
  count_method: null,
  count_is_upper_bound: null,
  context_window: null,
  conversation: null,
  conversation_source: null,
  shared_prefix_tokens: null,
  charge: null,
  cost_usd: null,
  budgets: null,
  run: null,
  mode: null,
  final_reason: null,
  notices: null,
  max_affordable_allowance: null,
} as const;

/**
 * The price a plan used (SPEC §7: every price carries its source and date). `source` is where the
 * price was read: for an override, the `source` its entry names (SPEC §11), else the file; for the
 * catalogue, `genai-prices@<version>`. `origin` is always where the gateway took it from:
 * `override:<file>` or `genai-prices@<version>`.
 */
function priceView(p: ModelPrice | null) {
  if (!p) return null;
  return {
    model: p.model,
    input_mtok: p.inputMtok,
    cache_read_mtok: p.cacheReadMtok,
    output_mtok: p.outputMtok,
    // Audio's own rates, where the price has them: the worst case reserves output at the dearer.
    ...(p.inputAudioMtok != null ? { input_audio_mtok: p.inputAudioMtok } : {}),
    ...(p.outputAudioMtok != null ? { output_audio_mtok: p.outputAudioMtok } : {}),
    source: p.reference ?? p.source,
    origin: p.source,
    date: p.date,
  };
}

const route: FastifyPluginAsync = async (app) => {
  app.post('/v1/admission', { preHandler: requireClient }, async (request) => {
    const gw = app.gateway;
    const call = request.body as Record<string, unknown> | null;
    if (typeof call !== 'object' || call === null || Array.isArray(call)) {
      throw new GatewayError('invalid_request', 'admission body must be {"endpoint": "/v1/chat/completions", "request": {…}}');
    }
    const kind = endpointForPath(call.endpoint);
    if (!kind) {
      throw new GatewayError('invalid_request', 'endpoint: must be one of /v1/chat/completions, /v1/completions, /v1/embeddings', {}, 'endpoint');
    }
    if (call.request === undefined) throw new GatewayError('invalid_request', 'request: is required', {}, 'request');

    const verdictOf = (err: GatewayError | null) =>
      err ? { admit: false, status: err.status, error: err.toEnvelope() } : { admit: true, status: 200, error: null };

    let plan;
    /** A refusal that only the request's own max_tokens caused: the plan is shown without it. */
    let allowanceRefusal: GatewayError | null = null;
    try {
      // In the real request's order (SPEC §11: the size first). Its body is the request inside as
      // the client wrote it here: its bytes in the wrapper, escapes and spaces and all.
      const bytes = (request.admissionBytes && memberValueBytes(request.admissionBytes, 'request')) ?? Buffer.byteLength(JSON.stringify(call.request), 'utf8');
      const limit = gw.config.limits.maxBodyBytes;
      if (bytes > limit) {
        throw new GatewayError('body_too_large', `request body has ${bytes} bytes, the limit is ${limit}`, { body_bytes: bytes, limit });
      }
      // Nested past the limit, the request inside gets the real request's 400. The wrapper's own
      // depth is not limited (server/body.ts).
      if (typeof call.request === 'object' && call.request !== null && nestedDeeperThan(call.request, MAX_JSON_DEPTH)) throw tooDeep();
      const valid = validateRequest(kind, call.request);
      try {
        plan = await planRequest(gw, valid, request.principal!, planHeaders(request.raw), { dryRun: true });
      } catch (err) {
        // The prompt fits the window but the max_tokens asked for does not: planned again with
        // max_tokens left out (the allowance the window leaves), the figures and budgets say what
        // would pass — max_affordable_allowance above all — and the verdict stays this refusal.
        const asked = call.request as Record<string, unknown>;
        if (!(err instanceof GatewayError) || err.code !== 'context_window_exceeded' || (asked.max_tokens == null && asked.max_completion_tokens == null)) throw err;
        const { max_tokens: _m, max_completion_tokens: _c, ...rest } = asked;
        try {
          plan = await planRequest(gw, validateRequest(kind, rest), request.principal!, planHeaders(request.raw), { dryRun: true });
        } catch {
          throw err;
        }
        allowanceRefusal = err;
      }
    } catch (err) {
      if (!(err instanceof GatewayError)) throw err;
      // The request would be refused before planning finished: report what is known (the rows'
      // figures when they were counted), and the rest of the plan as null — not known, same shape.
      const asked = (call.request as { model?: unknown } | null)?.model;
      return {
        endpoint: call.endpoint,
        ...NOT_PLANNED,
        model: typeof asked === 'string' ? asked : null,
        ...err.context,
        limits: sizeLimits(gw),
        verdict: verdictOf(err),
      };
    }

    const budgets = await budgetsOf(gw, plan);
    const pricier = pricierFor(gw, plan);
    let refusal = allowanceRefusal ?? (await precheck(gw, plan));
    if (!refusal) {
      const r = checkAdmission({ ...reservationOf(plan), capRoomUsd: budgets.capRoomUsd }, budgets.state);
      if (!r.ok) refusal = await refusalError(gw, plan, r);
    }
    return {
      endpoint: call.endpoint,
      ...rowFigures(plan.model, plan.upstream.name, plan.rows, plan.contextWindow),
      limits: sizeLimits(gw),
      conversation: plan.conversation,
      conversation_source: plan.conversationSource,
      shared_prefix_tokens: plan.sharedPrefixTokens,
      charge: { prompt: plan.promptCharge, allowance: plan.allowance },
      // The list price used, with where it comes from and its date (SPEC §7), or null when none.
      // A local or plan turn spends no money: its worst case is $0, as its cost header says, not unknown.
      cost_usd: { worst_case: plan.upstream.billing === 'metered' ? plan.worstCaseUsd : 0, price: priceView(plan.price) },
      budgets: budgets.view,
      run: plan.runInspection
        ? {
            tool_rounds: plan.runInspection.toolRounds,
            identical_batches: plan.runInspection.identicalStreak,
            started_at: plan.runState ? new Date(plan.runState.startedAt).toISOString() : null,
            bounds: plan.bounds,
          }
        : null,
      mode: plan.mode,
      final_reason: plan.finalReason,
      // What the real request's `x-tollgate-notice` would say at its head — `pricier` before the
      // dearer model is called, which the real response can only say once it is (seed 004).
      notices: [...(plan.mode === 'final-answer' && plan.finalReason ? [noticeHeader(plan.finalReason)] : []), ...(pricier ? [pricier] : [])],
      // A model that cannot be priced under a money limit is refused whatever it is allowed to write.
      max_affordable_allowance: (await unpricedUnderLimit(gw, plan)) ? 0 : maxAffordableAllowance(plan, budgets.state, budgets.capRoomUsd),
      verdict: verdictOf(refusal),
    };
  });
};

export default route;

/** The plan's `limits`: the size limits a request is checked against (SPEC §6), not the bound on requests in flight. */
function sizeLimits(gw: Gateway): Record<string, number> {
  const { maxRows, maxRowTokens, maxRequestTokens, maxBodyBytes } = gw.config.limits;
  return { maxRows, maxRowTokens, maxRequestTokens, maxBodyBytes };
}
