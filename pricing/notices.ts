// `x-tollgate-notice` values (SPEC §7): said once, quietly, and only when it matters.

import { ratesAt, roundUsd, tokensUsd, worstOutputMtok, type Billing, type ModelPrice } from './model-price.js';
import { formatUsdFigure } from './usd-format.js';

/** Share of a monthly budget at or past which a settlement says `budget-near` (once a month). */
export const BUDGET_NEAR_SHARE = 0.8;
/** The pricier notice stays quiet below this estimate: a short chat is not worth a word. */
export const PRICIER_MIN_USD = 0.25;
/** …and unless the new model's reply costs at least this many times the last one. */
export const PRICIER_MIN_RATIO = 2;

export const BUDGET_NEAR_NOTICE = 'budget-near';

/**
 * Spend is a sum of doubles: eight $0.10 turns come to 0.7999999999999999, not 0.8. A spend within
 * this much of the 80 % line has reached it — the nano-dollar the admission checks tolerate too
 * (`USD_EPSILON`, metering/stores/admission-check.ts), far below any turn's cost.
 */
export const BUDGET_NEAR_TOLERANCE_USD = 1e-9;

/**
 * True when `spentUsd` is at 80 % of the budget or past it (within the tolerance). Settlement asks
 * it of the month after each paid response; the ledger's `claimBudgetNearNotice` then makes the
 * notice once per tenant per month across replicas.
 */
export function budgetNearReached(spentUsd: number, budgetUsd: number | null): boolean {
  if (budgetUsd === null || !(budgetUsd > 0)) return false;
  return spentUsd + BUDGET_NEAR_TOLERANCE_USD >= budgetUsd * BUDGET_NEAR_SHARE;
}

export interface PricierInput {
  /** What the conversation's last reply cost; null when it could not be priced. */
  lastCostUsd: number | null;
  lastPromptTokens: number;
  lastOutputTokens: number;
  newPrice: ModelPrice | null;
  newBilling: Billing;
  /** The request may be answered in audio: its reply is estimated at the audio output rate, as reserved. */
  audioOutput?: boolean;
}

/**
 * What a reply like the last one would cost on the new model: same prompt and output size, at list
 * price, nothing from the cache — a model the conversation has not used starts cold; its output at
 * the rate admission reserves it at (the audio one, for a request that asks for audio).
 */
export function estimateLikeLastUsd(price: ModelPrice, promptTokens: number, outputTokens: number, audioOutput = false): number {
  const r = ratesAt(price, promptTokens);
  return roundUsd(tokensUsd(Math.max(0, promptTokens), r.input) + tokensUsd(Math.max(0, outputTokens), worstOutputMtok(price, promptTokens, audioOutput)));
}

/**
 * The header value `pricier; estimate_usd=0.84; last_usd=0.21` when switching models makes each
 * reply cost ≥ $0.25 and ≥ 2× the last; else null. Never for a local or plan model (no money), an
 * unpriced one, or when the last reply's cost is unknown (there is nothing honest to compare).
 */
export function pricierNotice(input: PricierInput): string | null {
  const { lastCostUsd, lastPromptTokens, lastOutputTokens, newPrice, newBilling } = input;
  if (newBilling !== 'metered' || !newPrice || lastCostUsd === null) return null;
  const estimate = estimateLikeLastUsd(newPrice, lastPromptTokens, lastOutputTokens, input.audioOutput === true);
  if (estimate < PRICIER_MIN_USD || estimate < PRICIER_MIN_RATIO * lastCostUsd) return null;
  return `pricier; estimate_usd=${formatUsdFigure(estimate)}; last_usd=${formatUsdFigure(lastCostUsd)}`;
}
