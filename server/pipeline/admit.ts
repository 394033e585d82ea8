// Stage 4 — admit (SPEC §2.4, §6): one atomic step in the ledger against every budget that applies
// (run tokens, conversation cap, the caps of its parent and every conversation above, monthly
// budget). A refusal is a 402 in the OpenAI envelope with the exact figures, and nothing reaches
// the upstream.

import { GatewayError } from '../errors.js';
import type { Gateway } from '../gateway.js';
import type { Reservation, AdmitRefusal } from '../../metering/ledger.js';
import { moneyRefusal, modelNotPriced } from '../../pricing/refusal-choices.js';
import { cheaperModels, candidatesFromUpstreams, isPattern, meteredCeilingMtok, type CheaperModel, type LimitScope, type ModelCandidate } from '../../pricing/cheaper-models.js';
import { isToolRound, ownerError, type Plan } from './plan.js';
import { globToRegExp, type Upstream } from '../upstreams.js';
import { capRoomOf, conversationFamily } from './budgets.js';
import { runBudgetFor } from '../../metering/stores/admission-check.js';
import { defaultAllowance } from '../config.js';

export function reservationOf(plan: Plan): Reservation {
  return {
    id: plan.id,
    time: plan.time,
    tenant: plan.principal.tenant,
    keyId: plan.principal.keyId,
    conversation: plan.conversation,
    parent: plan.parent,
    run: plan.run,
    model: plan.model,
    upstream: plan.upstream.name,
    endpoint: plan.valid.kind,
    mode: plan.mode,
    finalReason: plan.finalReason,
    rows: plan.rows.rows,
    promptTokens: plan.rows.sumTokens,
    countMethod: plan.rows.countMethod,
    sharedPrefixTokens: plan.sharedPrefixTokens,
    promptCharge: plan.promptCharge,
    allowance: plan.allowance,
    // The asker's own budget: the store holds the request to the lower of it and the run's.
    runBudgetTokens: plan.bounds.tokenBudget,
    worstCaseUsd: plan.worstCaseUsd,
    billing: plan.upstream.billing,
    costUnknown: plan.upstream.billing === 'metered' && plan.worstCaseUsd === null && !plan.excerptOnly,
    month: plan.month,
    keepTokens: isToolRound(plan) ? (plan.bounds.answerReserveTokens ?? 0) : 0,
  };
}

export function tokenBudgetError(remaining: number, needed: number, limit: number | null, plan: Plan, byDefault: { tokens: number; setting: string }): GatewayError {
  const whole = limit !== null && needed > limit;
  // A prompt count still an upper bound here could not be made exact (ADR 0019), or counts images
  // at the most they can cost (ADR 0022): say so, and why.
  const rows = plan.rows;
  // …or is the byte estimate, where no tokenizer here knows the model (ADR 0010).
  const estimated = rows.countMethod.startsWith('estimate:');
  const upTo = rows.upperBound ? 'up to ' : estimated ? 'about ' : '';
  const causes = [
    ...(rows.textUpperBound ? ['text without spaces too long to count exactly'] : []),
    ...(rows.imageBound ? ['images counted at the most they can cost'] : []),
  ];
  const why = rows.upperBound
    ? ` (the prompt is an upper bound: ${causes.join('; ')})`
    : estimated
      ? ' (the prompt is an estimate, UTF-8 bytes ÷ 4: no tokenizer here knows this model)'
      : '';
  // An allowance the client did not name is the gateway's default (per choice, or per row and
  // choice): said, so that the fix is plain.
  const output = `max output ${plan.allowance}${defaultAllowanceWhy(plan, byDefault)}`;
  const fits = affordableHint(remaining, plan);
  const message = whole
    ? `run token budget: this request needs ${upTo}${needed} tokens (prompt ${upTo}${plan.promptCharge} + ${output}), more than the run's whole budget of ${limit} tokens${why}${fits}`
    : `run token budget exhausted: this request needs ${upTo}${needed} tokens (prompt ${upTo}${plan.promptCharge} + ${output}), ${remaining} of the run's ${limit ?? 'budget'} tokens remain${why}${fits}`;
  return new GatewayError('token_budget_exhausted', message, {
    remaining,
    needed,
    limit,
    prompt_tokens: plan.promptCharge,
    allowance: plan.allowance,
    count_method: plan.rows.countMethod,
  });
}

/**
 * The largest `max_tokens` that would fit what the run has left after this prompt, said in the
 * refusal so that the fix is plain ('' when not one token a choice fits). A final answer's
 * allowance is the gateway's own (already cut to the run's budget), so it gets none.
 */
function affordableHint(remaining: number, plan: Plan): string {
  if (plan.mode === 'final-answer' || plan.perChoiceAllowance <= 0) return '';
  const times = plan.allowance / plan.perChoiceAllowance;
  const most = Math.floor((remaining - plan.promptCharge) / times);
  if (most < 1) return '';
  // Only a chat request is held to a run's budget: its allowance is per choice.
  return `; max_tokens ${most} or less${times > 1 ? ' (per choice)' : ''} would fit what the run has left`;
}

/** Does any money limit apply to this request? (An unpriced metered model is then refused.) */
async function moneyLimitApplies(gw: Gateway, plan: Plan): Promise<boolean> {
  const [{ conv, ancestors }, tenant] = await Promise.all([conversationFamily(gw, plan), gw.ledger.getTenant(plan.principal.tenant)]);
  return conv?.capUsd != null || ancestors.some((a) => a?.capUsd != null) || tenant?.monthlyBudgetUsd != null;
}

/**
 * The name a llama.cpp upstream configured by pattern (`*`) serves its model under, as its /props
 * reports it (read with its context window, no other call): a pattern is no model a client can
 * pick, but this name is. Nothing for OpenAI-kind upstreams, whose lists are not asked for.
 */
async function servedByPattern(gw: Gateway, u: Upstream): Promise<string[]> {
  const patterns = u.config.models.filter(isPattern);
  if (patterns.length === 0) return [];
  const name = await gw.counters.servedModel(u);
  if (name === null || !patterns.some((p) => globToRegExp(p).test(name)) || gw.upstreams.route(name) !== u) return [];
  return [name];
}

/** The models a money refusal may offer: names configured exactly, and the one a llama.cpp server configured by pattern reports serving. */
async function candidatesFor(gw: Gateway, plan: Plan): Promise<ModelCandidate[]> {
  const served = await Promise.all(gw.upstreams.list.map((u) => servedByPattern(gw, u)));
  return candidatesFromUpstreams(
    gw.upstreams.list.map((u, i) => ({ name: u.name, models: [...u.config.models, ...served[i]!], billing: u.billing, tools: u.config.tools })),
    (model) => gw.prices.lookup(model, { at: new Date(plan.time) }),
  );
}

export async function moneyError(gw: Gateway, plan: Plan, r: Extract<AdmitRefusal, { scope: LimitScope }>): Promise<GatewayError> {
  const candidates = await candidatesFor(gw, plan);
  const refusal = moneyRefusal({
    scope: r.scope,
    spentUsd: r.spentUsd,
    reservedUsd: r.reservedUsd,
    limitUsd: r.limitUsd,
    neededUsd: r.neededUsd,
    roomUsd: r.roomUsd,
    cheaperModels: cheaperModels({
      model: plan.model,
      price: plan.price,
      candidates,
      offersTools: plan.valid.tools !== null,
      scope: r.scope,
      limitUsd: r.limitUsd,
      embeddings: plan.valid.kind === 'embeddings',
      audioOutput: plan.audioOutput,
    }),
  });
  return new GatewayError(refusal.code, refusal.message, refusal.details, refusal.param);
}

/** A conversation with more than `limit` conversations above it (ADR 0018): a 400, not a budget. */
export function nestingError(plan: Plan, limit: number): GatewayError {
  return new GatewayError(
    'invalid_request',
    `too many parent conversations: "${plan.conversation}" would have more than ${limit} conversations above it (its parent, the parent's parent, …), the limit is ${limit}`,
    { limit },
    'x-tollgate-parent',
  );
}

/** A tool round that could not keep the answer reserve: only when planning again kept losing it. */
function keepError(r: Extract<AdmitRefusal, { scope: 'keep' }>, plan: Plan): GatewayError {
  return new GatewayError(
    'token_budget_exhausted',
    `run token budget: this tool round needs ${r.neededTokens} tokens and must leave the answer's reserve of ${r.keepTokens}, ${r.remainingTokens} of the run's tokens remain (requests of the same run running at once took them)`,
    { remaining: r.remainingTokens, needed: r.neededTokens + r.keepTokens, limit: runBudgetFor(plan.runState?.budgetTokens, plan.bounds.tokenBudget), prompt_tokens: plan.promptCharge, allowance: plan.allowance, count_method: plan.rows.countMethod },
  );
}

/** Where an allowance the request did not name came from, for a refusal's message ('' when it named one). */
function defaultAllowanceWhy(plan: Plan, byDefault: { tokens: number; setting: string }): string {
  if (plan.valid.maxTokens !== null || plan.valid.kind === 'embeddings' || plan.perChoiceAllowance <= 0) return '';
  const per = plan.perChoiceAllowance;
  const times = plan.allowance / per;
  const cutBy = plan.mode === 'final-answer' ? "the run's budget and the model's window leave" : "the model's window leaves";
  const each = per === byDefault.tokens ? `${byDefault.setting} ${per}` : `${per}, the default cut to what ${cutBy}`;
  return `: ${each}${times > 1 ? ` × ${times}` : ''}, as the request named no max_tokens`;
}

/** The error a refused admission answers with (the real request and /v1/admission alike). */
export async function refusalError(gw: Gateway, plan: Plan, r: AdmitRefusal): Promise<GatewayError> {
  if (r.scope === 'run') return tokenBudgetError(r.remainingTokens, r.neededTokens, r.limitTokens, plan, defaultAllowance(gw.config, plan.upstream.config));
  if (r.scope === 'keep') return keepError(r, plan);
  if (r.scope === 'nesting') return nestingError(plan, r.limitAncestors);
  if (r.scope === 'owner') return ownerError(r.conversation, r.conversation === plan.conversation ? 'x-tollgate-conversation' : 'x-tollgate-parent');
  return moneyError(gw, plan, r);
}

/** A metered model with no price while a money limit applies: refused, whatever it asks (SPEC §7). */
export async function unpricedUnderLimit(gw: Gateway, plan: Plan): Promise<boolean> {
  return plan.upstream.billing === 'metered' && !plan.price && gw.config.prices.unpriced === 'refuse' && (await moneyLimitApplies(gw, plan));
}

/** The refusal this plan would get now, without reserving anything (for /v1/admission too). */
export async function precheck(gw: Gateway, plan: Plan): Promise<GatewayError | null> {
  if (plan.tokenRefusal) {
    return tokenBudgetError(plan.tokenRefusal.remainingTokens, plan.tokenRefusal.neededTokens, runBudgetFor(plan.runState?.budgetTokens, plan.bounds.tokenBudget), plan, defaultAllowance(gw.config, plan.upstream.config));
  }
  if (await unpricedUnderLimit(gw, plan)) {
    // What costs less than a price no one knows: only models that spend no money (local, plan).
    const cheaper = cheaperModels({
      model: plan.model,
      price: null,
      candidates: await candidatesFor(gw, plan),
      offersTools: plan.valid.tools !== null,
      scope: 'monthly',
      limitUsd: 0,
      embeddings: plan.valid.kind === 'embeddings',
      audioOutput: plan.audioOutput,
    });
    const r = modelNotPriced(plan.model, cheaper);
    return new GatewayError(r.code, r.message, r.details, r.param);
  }
  return null;
}

/** Plans made for one request at most, when its tool round keeps losing its reserve to a race. */
const MAX_PLANS = 3;

/**
 * Reserves the plan in one atomic step, and returns the plan admitted. A tool round whose run
 * had its room taken, between planning and this step, by requests of the same run running at once
 * is planned again — from the run as it is now, which sends it as the final answer when the
 * reserve would not be left (SPEC §5, §11) — rather than admitted into the answer's reserve.
 */
export async function admit(gw: Gateway, plan: Plan, planAgain?: () => Promise<Plan>): Promise<Plan> {
  for (let plans = 1; ; plans++) {
    const early = await precheck(gw, plan);
    if (early) throw early;
    const reservation = reservationOf(plan);
    let result = await gw.ledger.admit(reservation);
    if (!result.ok && result.scope === 'conversation') {
      // At its conversation's own cap, a request on a cheaper model has the room its 402 offered.
      const room = capRoomOf(plan, await gw.ledger.conversationSpend(plan.conversation));
      if (room > 0) result = await gw.ledger.admit({ ...reservation, capRoomUsd: room });
    }
    if (result.ok) {
      gw.inFlight.add(plan.id);
      return plan;
    }
    if (result.scope === 'keep' && planAgain && plans < MAX_PLANS) {
      plan = await planAgain();
      continue;
    }
    const refusal = await refusalError(gw, plan, result);
    if (result.scope === 'conversation') await recordRoomOffer(gw, plan, refusal, result.limitUsd);
    throw refusal;
  }
}

/**
 * A 402 at the conversation's own cap that offered metered models with room past it (ADR 0006):
 * the offer is kept with the conversation, so that the client that takes it — sends its next
 * request on one of them — is admitted within that room. (/v1/admission, which changes nothing,
 * offers without recording.) It is recorded only under the cap it was made at (`capUsd`): a cap an
 * operator set while the refusal was built withdraws it. A ledger that cannot take it leaves the
 * offer unrecorded: the refusal stands either way.
 */
async function recordRoomOffer(gw: Gateway, plan: Plan, refusal: GatewayError, capUsd: number): Promise<void> {
  const offered = (refusal.details.choices as { cheaper_models?: CheaperModel[] } | undefined)?.cheaper_models ?? [];
  const ceiling = meteredCeilingMtok(plan.price, plan.audioOutput);
  if (ceiling === null || !offered.some((m) => m.billing === 'metered')) return;
  await gw.ledger.offerCapRoom(plan.conversation, ceiling, capUsd).catch((err: unknown) => {
    gw.log.warn({ err, id: plan.id }, 'the room a cap refusal offered could not be recorded');
  });
}
