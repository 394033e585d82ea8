// One model's list price, wherever it came from (the embedded genai-prices catalogue or the
// operator's override file), and the arithmetic every money figure in Tollgate shares.

/** How an upstream charges (SPEC §7): this machine is free, a plan spends no money, metered does. */
export type Billing = 'local' | 'plan' | 'metered';

/**
 * A long-context tier: once a request's input tokens exceed `start`, every token of the request is
 * billed at `price` (genai-prices' rule — the provider reprices the whole request, not the excess).
 */
export interface PriceTier {
  start: number;
  price: number;
}

/** USD per million tokens, in genai-prices' usage convention (input includes cached input). */
export interface ModelPrice {
  /** The name the price was found under (catalogue model id, or the override file's key). */
  model: string;
  inputMtok: number;
  /** Null when the model has no separate cache-read price: cached input is billed as input. */
  cacheReadMtok: number | null;
  /** 0 for models that produce no output tokens (embeddings). */
  outputMtok: number;
  /** Where the gateway read it: `override:<file>` or `genai-prices@<version>` (`origin` in /v1/admission). */
  source: string;
  /** The override's date (YYYY-MM-DD); null for the catalogue, whose bundled data carries none. */
  date: string | null;
  /** Catalogue provider id (`openai`, `openrouter`…); null for an override. */
  provider?: string | null;
  /** The override entry's own `source` text (where the operator read the price), if any: shown as the price's `source`. */
  reference?: string | null;
  /** Long-context tiers per rate; absent or empty when the price is flat. */
  tiers?: { input?: PriceTier[]; cacheRead?: PriceTier[]; output?: PriceTier[] };
  /**
   * Audio tokens' own rates (`input_audio_mtok`, `output_audio_mtok`), where the price has them;
   * absent, audio tokens are billed at the text rates (the table knows no other).
   */
  inputAudioMtok?: number | null;
  outputAudioMtok?: number | null;
}

/** The three per-Mtok rates that apply to a request with `inputTokens` of prompt. */
export interface Rates {
  input: number;
  cacheRead: number;
  output: number;
}

function tiered(base: number, tiers: PriceTier[] | undefined, inputTokens: number): number {
  let rate = base;
  // Tiers are sorted by start; the last one the request passes wins.
  for (const t of tiers ?? []) if (inputTokens > t.start) rate = t.price;
  return rate;
}

/** Rates for a request of `inputTokens` prompt tokens (long-context tiers applied). */
export function ratesAt(price: ModelPrice, inputTokens: number): Rates {
  const input = tiered(price.inputMtok, price.tiers?.input, inputTokens);
  const cacheRead =
    price.cacheReadMtok === null ? input : tiered(price.cacheReadMtok, price.tiers?.cacheRead, inputTokens);
  return { input, cacheRead, output: tiered(price.outputMtok, price.tiers?.output, inputTokens) };
}

/**
 * The most an output token can cost: the output rate, or — for a request that may be answered in
 * audio (`audioOutput`, see `mayAnswerInAudio`) — the audio output rate where the price has one and
 * it is higher. Admission reserves this worst case (SPEC §6); a request that asked for text alone
 * cannot be answered in audio, and is not reserved as if it could.
 */
export function worstOutputMtok(price: ModelPrice, inputTokens: number, audioOutput: boolean): number {
  const text = ratesAt(price, inputTokens).output;
  return audioOutput ? Math.max(text, price.outputAudioMtok ?? 0) : text;
}

/**
 * Blended list price used to compare models: input + output USD per Mtok (ADR 0006), output at the
 * rate admission would reserve it for the request at hand — for one that may be answered in audio,
 * a model whose text is cheap but whose audio is dear is no cheaper choice.
 */
export function blendedMtok(price: ModelPrice, audioOutput: boolean): number {
  return price.inputMtok + worstOutputMtok(price, 0, audioOutput);
}

/**
 * Round a USD amount to 1e-10 so float dust (0.1 + 0.2) never reaches the ledger; a tenth of a
 * nano-dollar is far below any single token's price in the catalogue.
 */
export function roundUsd(usd: number): number {
  return Math.round(usd * 1e10) / 1e10;
}

/** Cost of `tokens` at `mtokRate` USD per million. */
export function tokensUsd(tokens: number, mtokRate: number): number {
  return (tokens * mtokRate) / 1_000_000;
}
