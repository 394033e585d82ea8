// What a turn cost, the way its upstream charges (SPEC §7, ADR 0006): the provider's own figure
// when it sends one, else list price, else null — Tollgate never guesses, and an unknown price is
// never $0. Also the worst case admission reserves before a request is sent.

import { ratesAt, roundUsd, tokensUsd, worstOutputMtok, type Billing, type ModelPrice } from './model-price.js';

/**
 * Token usage of one turn, genai-prices / OpenAI convention: `inputTokens` includes the cached
 * ones; `outputTokens` includes reasoning tokens (OpenAI's completion_tokens already counts them —
 * do not add `reasoning_tokens` again).
 */
export interface TurnUsage {
  inputTokens: number;
  cachedTokens?: number | null;
  outputTokens: number;
  /** Of the input and output, the audio tokens (`prompt_tokens_details.audio_tokens`, `completion_tokens_details.audio_tokens`). */
  inputAudioTokens?: number | null;
  outputAudioTokens?: number | null;
}

export type CostSource = 'local' | 'plan' | 'provider' | 'list-price' | 'unpriced';

export interface TurnCost {
  /** Money spent; 0 for local and plan; null when a metered turn cannot be priced. */
  costUsd: number | null;
  /** What cached input saved at list price; null when there is no price or no money involved. */
  savedUsd: number | null;
  /** List-price value of a plan turn's work ("of work"), else null. */
  planWorkUsd: number | null;
  source: CostSource;
  /** The price's own source (`override:…`, `genai-prices@…`) when list price was used. */
  priceSource: string | null;
}

export interface TurnCostInput {
  billing: Billing;
  price: ModelPrice | null;
  usage: TurnUsage;
  /** The provider's own figure (OpenRouter's `usage.cost`), when it sent one. */
  providerCostUsd?: number | null;
}

/**
 * The most a provider's own figure is believed for one turn: far above any real turn, and small
 * enough that sums of them stay ordinary numbers. A larger figure (1e308 has been seen from a
 * broken upstream, and summed to Infinity in the ledger) is no measurement: list price is used.
 */
export const PROVIDER_COST_LIMIT_USD = 1_000_000;

function validCount(n: number | null | undefined): number {
  return typeof n === 'number' && Number.isFinite(n) && n > 0 ? n : 0;
}

/**
 * List-price cost of a usage: uncached input at input price, cached at cache-read, output at
 * output — and audio tokens, within them, at the price's audio rates where it has them.
 */
export function listPriceUsd(price: ModelPrice, usage: TurnUsage): number {
  const input = validCount(usage.inputTokens);
  // A provider can report more cached than input tokens only by mistake; never bill negative input.
  const cached = Math.min(validCount(usage.cachedTokens), input);
  const output = validCount(usage.outputTokens);
  const r = ratesAt(price, input);
  // Audio is counted within input (uncached) and output; a figure past them is no figure.
  const audioIn = price.inputAudioMtok == null ? 0 : Math.min(validCount(usage.inputAudioTokens), input - cached);
  const audioOut = price.outputAudioMtok == null ? 0 : Math.min(validCount(usage.outputAudioTokens), output);
  return roundUsd(
    tokensUsd(input - cached - audioIn, r.input) +
      tokensUsd(cached, r.cacheRead) +
      tokensUsd(output - audioOut, r.output) +
      tokensUsd(audioIn, price.inputAudioMtok ?? 0) +
      tokensUsd(audioOut, price.outputAudioMtok ?? 0),
  );
}

/** What reading `cachedTokens` from the provider's cache saved against paying full input price. */
export function savedByCacheUsd(price: ModelPrice, usage: TurnUsage): number {
  const input = validCount(usage.inputTokens);
  const cached = Math.min(validCount(usage.cachedTokens), input);
  const r = ratesAt(price, input);
  return roundUsd(Math.max(0, tokensUsd(cached, r.input - r.cacheRead)));
}

export function turnCost({ billing, price, usage, providerCostUsd }: TurnCostInput): TurnCost {
  if (billing === 'local') {
    // This machine: free, and nothing to save.
    return { costUsd: 0, savedUsd: null, planWorkUsd: null, source: 'local', priceSource: null };
  }
  if (billing === 'plan') {
    // A subscription spends no money per turn; the list-price figure is shown as "of work" only.
    return {
      costUsd: 0,
      savedUsd: null,
      planWorkUsd: price ? listPriceUsd(price, usage) : null,
      source: 'plan',
      priceSource: price?.source ?? null,
    };
  }
  const saved = price ? savedByCacheUsd(price, usage) : null;
  if (typeof providerCostUsd === 'number' && Number.isFinite(providerCostUsd) && providerCostUsd >= 0 && providerCostUsd <= PROVIDER_COST_LIMIT_USD) {
    return { costUsd: roundUsd(providerCostUsd), savedUsd: saved, planWorkUsd: null, source: 'provider', priceSource: null };
  }
  if (price) {
    return { costUsd: listPriceUsd(price, usage), savedUsd: saved, planWorkUsd: null, source: 'list-price', priceSource: price.source };
  }
  return { costUsd: null, savedUsd: null, planWorkUsd: null, source: 'unpriced', priceSource: null };
}

export interface WorstCaseInput {
  price: ModelPrice | null;
  /** The whole prompt, as if nothing were cached (a cache hit is never promised). */
  promptTokens: number;
  /** The whole output allowance. */
  allowance: number;
  /** The request may be answered in audio (`mayAnswerInAudio`): output at the dearer audio rate. */
  audioOutput: boolean;
}

/**
 * Worst-case USD admission reserves: whole prompt uncached + whole allowance at list price — at the
 * audio output rate where the model has a dearer one and the request asked for audio.
 */
export function worstCaseUsd({ price, promptTokens, allowance, audioOutput }: WorstCaseInput): number | null {
  if (!price) return null;
  const prompt = validCount(promptTokens);
  const r = ratesAt(price, prompt);
  return roundUsd(tokensUsd(prompt, r.input) + tokensUsd(validCount(allowance), worstOutputMtok(price, prompt, audioOutput)));
}
