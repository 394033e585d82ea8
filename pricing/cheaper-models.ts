// `choices.cheaper_models` of a money refusal (SPEC §6, ADR 0006): models configured here that cost
// less. Local first, then plan (neither spends money), then — at a conversation's own cap only — a
// metered one at a third of the price or less, with a little room of its own.

import { blendedMtok, type Billing, type ModelPrice } from './model-price.js';

export interface ModelCandidate {
  model: string;
  upstream: string;
  billing: Billing;
  tools: boolean;
  price: ModelPrice | null;
}

/** Which limit refused: a conversation's own cap, the parent's cap it shares, or the month. */
export type LimitScope = 'conversation' | 'parent' | 'monthly';

export interface CheaperModel {
  model: string;
  billing: Billing;
  upstream: string;
  tools: boolean;
  /** Metered only: the room offered with it, a quarter of the cap, at least $0.50. */
  allowance_usd?: number;
}

export interface CheaperModelsInput {
  model: string;
  price: ModelPrice | null;
  candidates: readonly ModelCandidate[];
  /** The request offers tools: tool-capable models are listed first in each group. */
  offersTools: boolean;
  scope: LimitScope;
  /** The limit that refused (the cap, or the monthly budget), USD. */
  limitUsd: number;
  /** The refused request is for embeddings: only embedding models are offered (else none are). */
  embeddings?: boolean;
  /** The refused request may be answered in audio: models compare at their audio output rates. */
  audioOutput: boolean;
}

/** A metered model is offered only at a third of the current model's blended price or less. */
export const METERED_PRICE_RATIO = 1 / 3;
export const MIN_ALLOWANCE_USD = 0.5;

const GROUP: Record<Billing, number> = { local: 0, plan: 1, metered: 2 };

/**
 * An embedding model, by its name (`text-embedding-3-small`, `nomic-embed-text`): nothing here
 * says what a configured model serves, and an embedding model offered for a chat request (or a chat
 * model for an embeddings request) is no choice — the cheapest names of all are embedding models.
 */
export function isEmbeddingModel(model: string): boolean {
  return /embed/i.test(model);
}

/** Exact model names only: a pattern like `gpt-*` is not a model a client can pick. */
export function isPattern(model: string): boolean {
  return /[*?[\]]/.test(model);
}

/** The room offered with a metered choice: a quarter of the cap, at least $0.50, whole cents up. */
export function meteredAllowanceUsd(limitUsd: number): number {
  const quarter = Math.ceil(Math.round((limitUsd / 4) * 1e6) / 1e4) / 100;
  return Math.max(MIN_ALLOWANCE_USD, quarter);
}

/**
 * The dearest blended price a metered model may have to be offered at a cap refusing `price`: a
 * third of it. Null where no metered model can be offered (an unknown price).
 */
export function meteredCeilingMtok(price: ModelPrice | null, audioOutput: boolean): number | null {
  return price ? blendedMtok(price, audioOutput) * METERED_PRICE_RATIO : null;
}

/**
 * The room a request gets past its conversation's own cap for being on a cheaper model: the
 * `allowance_usd` a 402 at that cap offered with it, to models at a third or less of the refused
 * model's price (`ceilingMtok`, recorded by the refusal). 0 for anything else — and before any
 * refusal has offered it: a client takes the room by choosing the model a 402 named, never without
 * being told (SPEC §6). The room is one for the conversation: every turn on such a model shares
 * it, and the dearer model stays at the cap.
 */
export function roomPastCapUsd(input: {
  price: ModelPrice | null;
  capUsd: number | null;
  /** The conversation's recorded offer (`ConversationSpend.roomCeilingMtok`). */
  ceilingMtok: number | null;
  /** The request may be answered in audio: models compare at their audio output rates. */
  audioOutput: boolean;
}): number {
  const { price, capUsd, ceilingMtok, audioOutput } = input;
  if (price === null || capUsd === null || ceilingMtok === null) return 0;
  return blendedMtok(price, audioOutput) <= ceilingMtok + 1e-12 ? meteredAllowanceUsd(capUsd) : 0;
}

export function cheaperModels(input: CheaperModelsInput): CheaperModel[] {
  const { model, price, candidates, offersTools, scope, limitUsd, audioOutput } = input;
  // Metered choices spend money, so they are offered only where a little room can be given:
  // at a conversation's own cap. Not at the month (the money is gone) nor at a parent's cap
  // (a child cannot be given room its parent's cap does not have).
  const meteredCeiling = scope === 'conversation' ? meteredCeilingMtok(price, audioOutput) : null;

  const embeddings = input.embeddings === true;
  const eligible = candidates.filter((c) => {
    if (c.model === model || isPattern(c.model) || isEmbeddingModel(c.model) !== embeddings) return false;
    if (c.billing !== 'metered') return true;
    return meteredCeiling !== null && c.price !== null && blendedMtok(c.price, audioOutput) <= meteredCeiling + 1e-12;
  });

  const ranked = eligible
    .map((c, index) => ({ c, index }))
    .sort((a, b) => {
      const group = GROUP[a.c.billing] - GROUP[b.c.billing];
      if (group !== 0) return group;
      if (offersTools && a.c.tools !== b.c.tools) return a.c.tools ? -1 : 1;
      if (a.c.billing === 'metered') {
        const cheaper = blendedMtok(a.c.price!, audioOutput) - blendedMtok(b.c.price!, audioOutput);
        if (cheaper !== 0) return cheaper;
      }
      return a.index - b.index; // otherwise keep the operator's configuration order
    });

  const seen = new Set<string>();
  const out: CheaperModel[] = [];
  for (const { c } of ranked) {
    if (seen.has(c.model)) continue; // the same name on two upstreams: the better-ranked one
    seen.add(c.model);
    const entry: CheaperModel = { model: c.model, billing: c.billing, upstream: c.upstream, tools: c.tools };
    if (c.billing === 'metered') entry.allowance_usd = meteredAllowanceUsd(limitUsd);
    out.push(entry);
  }
  return out;
}

export interface UpstreamModels {
  name: string;
  models: readonly string[];
  billing: Billing;
  tools: boolean;
}

/**
 * Candidates from the configured upstreams (structurally typed so pricing does not import the
 * server's config): every exact model name, priced through `priceOf`; glob patterns skipped.
 * `routeOf` (the router's answer for a name) drops names another upstream would really serve —
 * e.g. an earlier `"*"` upstream swallowing a later upstream's exact name — so a choice offered is
 * a choice that works. Without it the first upstream listing a name wins.
 */
export function candidatesFromUpstreams(
  upstreams: readonly UpstreamModels[],
  priceOf: (model: string) => ModelPrice | null,
  routeOf?: (model: string) => string | null,
): ModelCandidate[] {
  const out: ModelCandidate[] = [];
  const seen = new Set<string>();
  for (const u of upstreams) {
    for (const m of u.models) {
      if (isPattern(m) || seen.has(m)) continue;
      if (routeOf && routeOf(m) !== u.name) continue;
      seen.add(m);
      out.push({ model: m, upstream: u.name, billing: u.billing, tools: u.tools, price: priceOf(m) });
    }
  }
  return out;
}
