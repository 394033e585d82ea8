// Stage 7 — settle (SPEC §2.7, §4, §7): what was really generated, the refund of the rest, the
// turn's cost, the conversation's new head, the metrics and one log line.

import type { Gateway } from '../gateway.js';
import { monthOf, type Plan } from './plan.js';
import type { ConversationHead, MonthAfterSettle, Settlement, UpstreamFigures } from '../../metering/ledger.js';
import { settleTokens } from '../../metering/charge.js';
import { turnCost } from '../../pricing/turn-cost.js';
import { pricierNotice, budgetNearReached, BUDGET_NEAR_NOTICE } from '../../pricing/notices.js';
import { isLedgerUnavailable } from '../ledger-guard.js';

type Json = Record<string, unknown>;

export interface Outcome {
  status: number;
  /** Output counted by the gateway itself (stream meter or tokenizer). */
  countedOutput: number;
  /**
   * Of `countedOutput`, the first choice's (index 0: row 0's first for a prompt array), which a
   * llama.cpp server's own figure for a prompt array or n > 1 covers alone. Unknown: the whole count
   * stands against that figure.
   */
  countedFirstChoice?: number;
  /** Tool calls the answer wrote: by the first choice, and by the others together. */
  toolCalls?: { first: number; others: number };
  countedMethod: string;
  usage: Json | null;
  timings: Json | null;
  fallback: boolean;
  /** Nothing was generated (an upstream error before any output): refund everything. */
  refundAll: boolean;
  /**
   * The model spoke (audio in the answer, relay-json.ts / relay-stream.ts): output the gateway's
   * count leaves out. Without the provider's figure the whole allowance is charged.
   */
  uncountedAudio?: boolean;
  /**
   * The upstream wrote choices past those the request asked for, which were not passed on: its
   * completion figure covers them too, so the gateway's own count of what was passed on is taken.
   */
  unaskedChoices?: boolean;
}

export interface Settled {
  generated: number;
  /** How `generated` was known (the ledger's `output_method`). */
  outputMethod: string;
  chargeTokens: number;
  refundTokens: number;
  costUsd: number | null;
  savedUsd: number | null;
  notices: string[];
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);
/** A token count an upstream reports: a whole number, not negative; anything else is no count. */
const tokenFigure = (v: unknown): number | null => (typeof v === 'number' && Number.isSafeInteger(v) && v >= 0 ? v : null);

function figures(usage: Json | null, timings: Json | null): UpstreamFigures {
  const details = usage?.prompt_tokens_details as Json | undefined;
  return {
    promptTokens: tokenFigure(usage?.prompt_tokens),
    completionTokens: tokenFigure(usage?.completion_tokens),
    // DeepSeek reports its cache hits under a name of its own.
    cachedTokens: tokenFigure(details?.cached_tokens) ?? tokenFigure(usage?.prompt_cache_hit_tokens),
    promptN: tokenFigure(timings?.prompt_n),
    cacheN: tokenFigure(timings?.cache_n),
  };
}

/**
 * The provider's completion count is used only where it can be trusted: llama.cpp reports row 0
 * and choice 0 only for prompt arrays and n > 1 (fixtures/llamacpp: v1-completions-prompt-array,
 * p2-chat-n2), so there the gateway's own count stands.
 */
function trustedCompletionTokens(plan: Plan, usage: Json | null): number | null {
  const completion = tokenFigure(usage?.completion_tokens);
  if (completion === null) return null;
  if (usageUnderReported(plan)) return null;
  // Reasoning tokens are output tokens (SPEC §7). OpenAI counts them inside `completion_tokens`;
  // a provider that counts them beside it (xAI) shows it in its total: prompt + completion +
  // reasoning. Then they are added.
  const reasoning = tokenFigure((usage?.completion_tokens_details as Json | undefined)?.reasoning_tokens);
  const prompt = tokenFigure(usage?.prompt_tokens);
  if (reasoning !== null && reasoning > 0 && prompt !== null && tokenFigure(usage?.total_tokens) === prompt + completion + reasoning) return completion + reasoning;
  return completion;
}

/**
 * A llama.cpp server's usage for a prompt array or n > 1: row 0's and choice 0's alone. (Its
 * embeddings usage sums every input: fixtures/llamacpp emb-v1-embeddings.)
 */
export function usageUnderReported(plan: Plan): boolean {
  return plan.upstream.config.kind === 'llamacpp' && plan.valid.kind !== 'embeddings' && (plan.valid.n > 1 || plan.rows.rows > 1);
}

/** Whether settlement will take the provider's completion count (so a llama.cpp server's answer need not be counted). */
export function providerOutputTrusted(plan: Plan, usage: Json | null): boolean {
  return trustedCompletionTokens(plan, usage) !== null;
}

/**
 * The conversation's new head, written in the same commit as the settlement: every admitted chat
 * request is the most recent of its conversation (SPEC §8), whatever its outcome — else the next
 * request, which resends these messages without the conversation's header, would be inferred into
 * a new conversation with a fresh run budget. What the head says the upstream has cached is what
 * it really read: a final answer read its messages without tools (so the prefix is its own, with
 * no tool offer); an upstream that failed before any output read nothing to rely on — but what it
 * held from the request before is still held, so the head shares no more than this request was
 * credited (a retry of it is credited the same, not charged in full); and its cost is no guide for
 * the next model's estimate.
 */
function headAfter(plan: Plan, o: Outcome, costUsd: number | null, generated: number): ConversationHead | undefined {
  if (!plan.chatCount) return undefined;
  const finalAnswer = plan.mode === 'final-answer';
  return {
    conversation: plan.conversation,
    keyId: plan.principal.keyId,
    tenant: plan.principal.tenant,
    model: plan.model,
    toolHash: finalAnswer ? '' : plan.toolHash,
    serverId: plan.upstream.serverId,
    chain: plan.chain,
    prefix: o.refundAll ? plan.chatCount.prefix.map((p) => Math.min(p, plan.sharedPrefixTokens)) : plan.chatCount.prefix,
    prefixDigests: o.refundAll ? null : (plan.chatCount.prefixDigests ?? null),
    lastCostUsd: o.refundAll ? null : costUsd,
    lastPromptTokens: plan.rows.sumTokens,
    lastOutputTokens: generated,
    // What the provider holds was last read by the request before a failed one: the cache's age
    // (`prefixCacheTtlSeconds`) runs from then, not from a failure that read nothing.
    time: o.refundAll && plan.head ? plan.head.time : plan.time,
  };
}

export async function settle(gw: Gateway, plan: Plan, o: Outcome): Promise<Settled> {
  const f = figures(o.usage, o.timings);
  // What the gateway itself counted exactly with the model's tokenizer, as it relayed a stream or
  // read a whole answer, is a floor: the tokens the client visibly got. A provider that reports
  // fewer (0, or a figure sent early in the stream and never brought up to date) is not taken at
  // its word. The byte estimate is no bound either way (a table's padding or a rule of dashes runs
  // to 40 bytes a token and more): it refuses only a figure of 0 for text that came.
  const ownExact = o.countedMethod.startsWith('tiktoken:') && !o.countedMethod.endsWith(':upper-bound') ? o.countedOutput : 0;
  const floor = o.countedMethod === 'estimate:bytes' ? Math.min(o.countedOutput, 1) : ownExact;
  const provided = o.refundAll || o.unaskedChoices === true ? null : trustedCompletionTokens(plan, o.usage);
  const trusted = provided !== null && provided >= floor ? provided : null;
  // Audio the model spoke, with no figure from the provider (a client that left before the usage
  // chunk, an upstream that sends none): the gateway cannot count it, so the turn is charged its
  // whole allowance — a conservative figure, never one the client can lower by leaving.
  const audioAllowance = !o.refundAll && trusted === null && o.uncountedAudio === true;
  // A llama.cpp server's figure for a prompt array or n > 1 is row 0's and choice 0's alone: no
  // total, but a floor under the gateway's own count of that choice (which sees a streamed tool
  // call's text, not the markup the server's parser held back); the other choices are the gateway's.
  const firstChoice = !o.refundAll && usageUnderReported(plan) ? (tokenFigure(o.usage?.completion_tokens) ?? 0) : 0;
  const raisedFirst = Math.max(0, firstChoice - (o.countedFirstChoice ?? o.countedOutput));
  // The other choices wrote their calls' markup too (a template's `<tool_call>` framing), which the
  // server's parser held back from every choice: what the first choice's figure shows past the
  // gateway's own count of it, a call, is taken for each of theirs (ADR 0004). No first choice's
  // call to measure it by, no share: their calls stay counted as the text they are.
  const calls = o.toolCalls;
  const othersMarkup = raisedFirst > 0 && calls !== undefined && calls.first > 0 ? Math.round((raisedFirst / calls.first) * calls.others) : 0;
  const ownCount = o.countedOutput + raisedFirst + othersMarkup;
  const rawGenerated = o.refundAll ? 0 : (trusted ?? (audioAllowance ? Math.max(plan.allowance, o.countedOutput) : ownCount));
  const outputMethod = o.refundAll ? 'none' : trusted !== null || (!audioAllowance && raisedFirst > 0) ? 'provider' : audioAllowance ? 'allowance:audio' : o.countedMethod;
  // An upstream that failed before any output refunds the whole reservation, prompt included
  // (SPEC §2.7, §11): the model read nothing the run must pay for.
  const tokens = o.refundAll
    ? { generated: 0, chargeTokens: 0, refundTokens: plan.promptCharge + plan.allowance }
    : settleTokens(plan.promptCharge, plan.allowance, rawGenerated);
  if (rawGenerated > plan.allowance) {
    gw.log.warn({ id: plan.id, upstream: plan.upstream.name, generated: rawGenerated, allowance: plan.allowance }, 'upstream generated past the allowance');
  }

  const providerCost = num(o.usage?.cost);
  const price = plan.price ?? (plan.upstream.billing === 'plan' ? gw.prices.lookup(plan.model, { at: new Date(plan.time) }) : null);
  const cost = o.refundAll
    ? { costUsd: 0, savedUsd: null, planWorkUsd: null, source: 'refunded', priceSource: null } // nothing was generated: nothing is owed
    : turnCost({
        billing: plan.upstream.billing,
        price,
        usage: {
          inputTokens: plan.upstream.config.kind === 'llamacpp' && plan.rows.rows > 1 ? plan.rows.sumTokens : (f.promptTokens ?? plan.rows.sumTokens),
          cachedTokens: f.cachedTokens,
          // Audio within them, priced at the audio rates where the price has them.
          inputAudioTokens: tokenFigure((o.usage?.prompt_tokens_details as Json | undefined)?.audio_tokens),
          // The allowance charged for audio no one counted is priced at the audio rate only where
          // the request asked for audio and admission reserved that rate: the gateway's own figure
          // never costs more than it reserved (only a provider's real figure can).
          outputAudioTokens: audioAllowance ? (plan.audioOutput ? rawGenerated : 0) : tokenFigure((o.usage?.completion_tokens_details as Json | undefined)?.audio_tokens),
          // What the provider really generated, even past the allowance (an upstream that ignored
          // max_tokens bills it all); the run's token charge stays within what was reserved.
          outputTokens: rawGenerated,
        },
        providerCostUsd: providerCost,
      });

  // The turn cost more than admission reserved for it: the provider billed past the worst case (an
  // upstream that ignored max_tokens, a provider's own cost above list price, a prompt it counted
  // larger). The cost is recorded as billed — it was spent — and said, with its figures: a money
  // limit can be passed by it, and an operator must be able to find out why.
  if (plan.worstCaseUsd !== null && cost.costUsd !== null && cost.costUsd > plan.worstCaseUsd + 1e-9) {
    gw.log.warn(
      { id: plan.id, upstream: plan.upstream.name, model: plan.model, reserved_usd: plan.worstCaseUsd, cost_usd: cost.costUsd, provider_cost_usd: providerCost, generated: rawGenerated, allowance: plan.allowance },
      'turn cost more than its reservation',
    );
  }

  const settlement: Settlement = {
    status: o.status,
    generatedTokens: tokens.generated,
    outputMethod,
    chargeTokens: tokens.chargeTokens,
    refundTokens: tokens.refundTokens,
    costUsd: cost.costUsd,
    savedUsd: cost.savedUsd,
    planWorkUsd: cost.planWorkUsd,
    costSource: cost.source,
    priceSource: cost.priceSource,
    priceDate: cost.priceSource !== null ? (price?.date ?? null) : null,
    billing: plan.upstream.billing,
    upstreamFigures: f,
    fallback: o.fallback,
    finishedAt: gw.clock(),
  };
  const succeeded = !o.refundAll && o.status < 400;
  const head = headAfter(plan, o, cost.costUsd, tokens.generated);
  // A ledger that cannot take the settlement now (a full disk, PostgreSQL away) gets it later: the
  // request ended, and its client is answered with these figures all the same (settle-retry.ts).
  let month: MonthAfterSettle | null = null;
  try {
    month = await gw.ledger.settle(plan.id, settlement, head);
    gw.inFlight.delete(plan.id);
  } catch (err) {
    if (isLedgerUnavailable(err)) gw.settleRetry.add(plan.id, settlement, head, err);
    else {
      // Not the store being away but something wrong with this settlement: trying again would not
      // help, and would keep the gateway unready. The reservation is left to the recovery (a
      // replica's sweep, or the next start), charged in full.
      gw.inFlight.delete(plan.id);
      gw.log.error({ err, id: plan.id }, 'settlement failed: the reservation is left to recovery');
    }
  }

  const notices: string[] = [];
  const m = gw.metrics;
  m.outputTokens.inc({ kind: 'generated' }, tokens.generated);
  m.outputTokens.inc({ kind: 'refunded' }, plan.allowance - tokens.generated);
  // A whole refund gives back the prompt's charge too.
  if (o.refundAll && !plan.excerptOnly) m.promptTokensRefunded.inc(plan.promptCharge);
  if (cost.costUsd) m.costUsd.inc(cost.costUsd);
  if (cost.savedUsd) m.savedUsd.inc(cost.savedUsd);
  // What the upstream says it evaluated: llama.cpp's prompt_n, or its prompt less what it read from
  // its cache. An embeddings request is never served from a prompt cache, so there the prompt is
  // all of it, cached figure or not (OpenAI reports none for embeddings).
  const cached = f.cachedTokens ?? (plan.valid.kind === 'embeddings' ? 0 : null);
  const evaluated = f.promptN ?? (f.promptTokens !== null && cached !== null ? f.promptTokens - cached : null);
  // llama.cpp's timings of a prompt array are row 0's alone (fixtures/llamacpp: v1-completions-prompt-array).
  const wholePromptTimed = !(plan.upstream.config.kind === 'llamacpp' && plan.rows.rows > 1);
  if (evaluated !== null && !o.refundAll && wholePromptTimed) m.divergence.observe({ upstream: plan.upstream.name }, plan.promptCharge - evaluated);

  // The 80 % notice: the first settlement that leaves the month at or past 80 % of the budget (the
  // figures come from its own transaction) claims it in the store, once per tenant per month, so
  // concurrent requests and replicas agree. The line is met within a nano-dollar of float dust. A
  // turn admitted before midnight UTC and settled after it counts in the month that ended, which a
  // notice would now be about: none is sent (the new month's own crossing says it).
  const monthStillOn = plan.month === monthOf(gw.clock());
  if (succeeded && cost.costUsd && month !== null && monthStillOn && budgetNearReached(month.spentUsd, month.monthlyBudgetUsd ?? null)) {
    // A ledger that fails here has the settlement already: the answer goes out, without the notice.
    const claimed = await gw.ledger.claimBudgetNearNotice(plan.principal.tenant, plan.month).catch((err: unknown) => {
      gw.log.warn({ err, tenant: plan.principal.tenant }, 'the budget-near notice could not be claimed: not sent');
      return false;
    });
    if (claimed) notices.push(BUDGET_NEAR_NOTICE);
  }
  // A plan turn spends no money, priced or not (ADR 0006): the client is told 0, as the ledger says.
  // What a missing list price leaves unknown is its "of work" value, not its cost.
  return { ...tokens, outputMethod, costUsd: cost.costUsd, savedUsd: cost.savedUsd, notices };
}

/** The "pricier" notice is decided at planning time, from the conversation's last reply. */
export function pricierFor(gw: Gateway, plan: Plan): string | null {
  const head = plan.head;
  if (!head || head.model === plan.model) return null;
  return pricierNotice({
    lastCostUsd: head.lastCostUsd,
    lastPromptTokens: head.lastPromptTokens,
    lastOutputTokens: head.lastOutputTokens,
    newPrice: plan.price,
    newBilling: plan.upstream.billing,
    audioOutput: plan.audioOutput,
  });
}
