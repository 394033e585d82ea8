// What every budget has left for a plan, read without reserving anything (for /v1/admission):
// the same state the store's atomic admission step checks, and the largest max_tokens all of
// them would still admit.

import type { Gateway } from '../gateway.js';
import type { ConversationSpend } from '../../metering/ledger.js';
import { familyOf, runBudgetFor, USD_EPSILON, type AdmissionState, type MoneyScopeState } from '../../metering/stores/admission-check.js';
import { ratesAt, roundUsd, worstOutputMtok } from '../../pricing/model-price.js';
import { worstCaseUsd } from '../../pricing/turn-cost.js';
import { roomPastCapUsd } from '../../pricing/cheaper-models.js';
import { isToolRound, worstPromptTokens, type Plan } from './plan.js';

interface MoneyView {
  limit_usd: number;
  spent_usd: number;
  remaining_usd: number;
}

/**
 * What was spent (settled) and what remains once requests still in flight are reserved too, at
 * the ledger's precision (as the spend views show them).
 */
function moneyView(limit: number | null, spent: number, reserved: number): MoneyView | null {
  if (limit === null) return null;
  return { limit_usd: limit, spent_usd: roundUsd(spent), remaining_usd: roundUsd(Math.max(0, limit - spent - reserved)) };
}

/**
 * The conversation's spend and the spend of every conversation above it, found as the store's
 * admission finds them (metering/stores/admission-check.ts `familyOf`): the parent it already has
 * holds over the one the request names, and the links above are followed as they are now.
 */
export async function conversationFamily(gw: Gateway, plan: Plan) {
  const conv = await gw.ledger.conversationSpend(plan.conversation);
  const read = new Map<string, ConversationSpend | null>();
  const parentOf = (id: string) => {
    const s = read.get(id);
    return s === undefined ? undefined : (s?.parent ?? null);
  };
  for (;;) {
    const family = familyOf(plan, conv?.parent ?? null, parentOf);
    if (!('unread' in family)) return { conv, ancestors: family.ancestors.map((id) => read.get(id) ?? null), tooDeep: family.tooDeep };
    read.set(family.unread, await gw.ledger.conversationSpend(family.unread));
  }
}

/** The room past its conversation's own cap a request on a cheaper model has (`roomPastCapUsd`). */
export function capRoomOf(plan: Plan, spend: ConversationSpend | null): number {
  if (plan.upstream.billing !== 'metered' || plan.worstCaseUsd === null || spend === null) return 0;
  return roomPastCapUsd({ price: plan.price, capUsd: spend.capUsd, ceilingMtok: spend.roomCeilingMtok, audioOutput: plan.audioOutput });
}

export async function budgetsOf(gw: Gateway, plan: Plan) {
  const [{ conv, ancestors, tooDeep }, tenant, month] = await Promise.all([
    conversationFamily(gw, plan),
    gw.ledger.getTenant(plan.principal.tenant),
    gw.ledger.tenantMonth(plan.principal.tenant, plan.month),
  ]);
  const scope = (c: ConversationSpend | null): MoneyScopeState => ({
    id: c?.conversation,
    tenant: c?.tenant || null,
    capUsd: c?.capUsd ?? null,
    spentUsd: c?.spentUsd ?? 0,
    tasksUsd: c?.tasksUsd ?? 0,
    reservedUsd: c?.reservedUsd ?? 0,
  });
  const budgetTokens = runBudgetFor(plan.runState?.budgetTokens, plan.bounds.tokenBudget);
  const state: AdmissionState = {
    budgetTokens,
    usedTokens: plan.runState?.usedTokens ?? 0,
    conversation: scope(conv),
    ancestors: ancestors.map(scope),
    tooDeep,
    monthlyBudgetUsd: tenant?.monthlyBudgetUsd ?? null,
    month,
  };
  // A conversation's spend includes what those below it spent (tasks); their reservations are in
  // `reservedUsd`.
  const scopeView = (s: MoneyScopeState) => moneyView(s.capUsd, s.spentUsd + s.tasksUsd, s.reservedUsd);
  // Of the caps above, the one with the least room left is the one that holds this request.
  const above = state.ancestors.map(scopeView).filter((v): v is MoneyView => v !== null);
  const view = {
    // Always the object SPEC §11 shows: its figures are null where no run budget holds the request
    // (completions, embeddings, or `runs.tokenBudget: null`).
    run: budgetTokens === null ? { limit_tokens: null, remaining_tokens: null } : { limit_tokens: budgetTokens, remaining_tokens: Math.max(0, budgetTokens - state.usedTokens) },
    conversation: scopeView(state.conversation),
    parent: above.reduce<MoneyView | null>((tightest, v) => (tightest === null || v.remaining_usd < tightest.remaining_usd ? v : tightest), null),
    monthly: moneyView(state.monthlyBudgetUsd, month.spentUsd, month.reservedUsd),
  };
  return { state, view, capRoomUsd: capRoomOf(plan, conv) };
}

/**
 * The largest max_tokens (per choice) that the window and every budget would admit now, for the
 * request as planned, and honour as asked. A tool round (normal mode, tools offered) must leave the
 * run's answer reserve (SPEC §11): past that, the request would go as the final answer instead, so
 * the reserve is kept out of its figure. A final answer may use what the run has left, within what
 * the window leaves after its own prompt (a larger max_tokens may be admitted, and cut to that).
 *
 * A round that goes as the final answer only because its max_tokens does not fit (`roundAsSent`)
 * is given the figure of the round it was, when some max_tokens still sends it as one: a smaller
 * max_tokens plans the round, with its own prompt, not the final answer's (the two differ: the
 * answer drops the tools and adds an instruction). When none does, the final answer's figure —
 * provided that max_tokens would not be planned as the round instead.
 */
export function maxAffordableAllowance(plan: Plan, s: AdmissionState, capRoomUsd = 0): number | null {
  // Nested too deep: refused whatever it asks for.
  if (s.tooDeep) return 0;
  if (plan.valid.kind === 'embeddings') return 0;
  const final = plan.mode === 'final-answer';
  const asked = affordable(plan, s, capRoomUsd, {
    promptCharge: plan.promptCharge,
    worstPromptTokens: worstPromptTokens(plan.rows),
    reserve: isToolRound(plan) ? (plan.bounds.answerReserveTokens ?? 0) : 0,
    // The window is checked on the request as sent (past it, a request with no tool results yet is
    // a 413), and a final answer's allowance is then set within what the window leaves after its
    // own prompt (server/pipeline/plan.ts), which may be the longer of the two.
    longestRow: final ? Math.max(plan.sentLongestRow, plan.rows.longestRowLeast) : plan.sentLongestRow,
  });
  const round = plan.roundAsSent;
  if (!final || round === null || asked === null || s.budgetTokens === null) return asked;
  const reserve = plan.bounds.answerReserveTokens ?? 0;
  const asRound = affordable(plan, s, capRoomUsd, { ...round, reserve, longestRow: plan.sentLongestRow }) ?? 0;
  if (asRound >= 1) return asRound;
  // Up to this max_tokens the request is planned as the round (and refused, as asRound says).
  const roundFits = Math.floor((s.budgetTokens - s.usedTokens - round.promptCharge - reserve) / perChoiceUnits(plan));
  return asked > roundFits ? asked : 0;
}

/** How many times a per-choice max_tokens is reserved: per choice, and per row for completions. */
function perChoiceUnits(plan: Plan): number {
  return plan.valid.generations * (plan.valid.kind === 'completions' ? plan.rows.rows : 1);
}

/** The largest max_tokens the window, the run and every money limit admit for one way of sending the request. */
function affordable(
  plan: Plan,
  s: AdmissionState,
  capRoomUsd: number,
  as: { promptCharge: number; worstPromptTokens: number; reserve: number; longestRow: number },
): number | null {
  const per = perChoiceUnits(plan);
  const limits: number[] = [];
  if (plan.contextWindow !== null) limits.push(plan.contextWindow - as.longestRow);
  if (s.budgetTokens !== null) limits.push(Math.floor((s.budgetTokens - s.usedTokens - as.promptCharge - as.reserve) / per));
  // Each money limit as the atomic admission sees it: what it holds already, and its limit.
  const held: Array<{ committed: number; limit: number }> = [];
  const cap = (m: MoneyScopeState | null, extra = 0) => {
    if (m && m.capUsd !== null) held.push({ committed: m.spentUsd + m.tasksUsd + m.reservedUsd, limit: m.capUsd + extra });
  };
  cap(s.conversation, capRoomUsd);
  for (const a of s.ancestors) cap(a);
  if (s.monthlyBudgetUsd !== null) held.push({ committed: s.month.spentUsd + s.month.reservedUsd, limit: s.monthlyBudgetUsd });
  // A request of unknown cost (an unpriced model the operator allows) starts only while every
  // money limit has room; its max_tokens does not change that.
  if (plan.upstream.billing === 'metered' && plan.worstCaseUsd === null && !plan.excerptOnly && held.some((h) => h.limit - h.committed <= USD_EPSILON)) return 0;
  if (plan.price && plan.upstream.billing === 'metered') {
    // The prompt as admission prices it: four times a byte estimate (worstPromptTokens).
    const promptTokens = as.worstPromptTokens;
    const rates = ratesAt(plan.price, promptTokens);
    // Output at its worst rate, as admission reserves it (an audio rate above the text one, for a
    // request that may be answered in audio).
    const outputMtok = worstOutputMtok(plan.price, promptTokens, plan.audioOutput);
    // A prediction's tokens are output the request may be billed for whatever its max_tokens.
    const promptUsd = (promptTokens * rates.input + plan.predictionTokens * outputMtok) / 1e6;
    // What admission would reserve for a given max_tokens, computed as admission computes it.
    const price = plan.price;
    const cost = (n: number) => worstCaseUsd({ price, promptTokens, allowance: n * per + plan.predictionTokens, audioOutput: plan.audioOutput }) ?? 0;
    for (const h of held) {
      if (outputMtok <= 0) {
        limits.push(Number.MAX_SAFE_INTEGER);
        continue;
      }
      // The division gives the figure to within a token; the admission's own test (with its
      // tolerance, on the same rounded cost) settles the last one, so that the figure is exactly
      // the largest max_tokens the request would be admitted with — float sums of the spend
      // (3 × 0.28 is a hair over 0.84) once made it one less.
      const fits = (n: number) => h.committed + cost(n) <= h.limit + USD_EPSILON;
      let n = Math.max(0, Math.floor(((h.limit - h.committed - promptUsd) * 1e6) / outputMtok / per));
      while (n > 0 && !fits(n)) n--;
      for (let more = 0; more < 4 && fits(n + 1); more++) n++;
      limits.push(n);
    }
  }
  return limits.length === 0 ? null : Math.max(0, Math.min(...limits));
}
