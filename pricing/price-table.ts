// The price table (SPEC §7): the operator's override file wins, else the catalogue bundled with
// @pydantic/genai-prices. Lookups are synchronous and offline: we only ever call `calcPrice` on the
// bundled data, never `updatePrices`/`enableAutoUpdate`, so no price changes under a running
// gateway and nothing is fetched at run time.

import { createRequire } from 'node:module';
import { dirname, join } from 'node:path';
import { readFileSync } from 'node:fs';
import { calcPrice, findProvider, type ModelPrice as CatalogueRates, type TieredPrices } from '@pydantic/genai-prices';
import type { ModelPrice, PriceTier } from './model-price.js';
import { readPriceOverrides } from './price-overrides.js';

export interface LookupOptions {
  /** The upstream's catalogue provider id when known (`openrouter`, `openai`…): tried first. */
  providerId?: string;
  /** Prices can change on a date or by time of day (DeepSeek's off-peak rates); default now. */
  at?: Date;
}

/** `genai-prices@<version>`, read from the installed package so the source is never stale. */
function catalogueSource(): string {
  try {
    const require = createRequire(import.meta.url);
    // The package's `exports` hide package.json, so find it beside the resolved entry point.
    const entry = require.resolve('@pydantic/genai-prices');
    const pkg: unknown = JSON.parse(readFileSync(join(dirname(entry), '..', 'package.json'), 'utf8'));
    const version = typeof pkg === 'object' && pkg !== null && 'version' in pkg ? pkg.version : null;
    return `genai-prices@${typeof version === 'string' ? version : 'unknown'}`;
  } catch {
    return 'genai-prices@unknown';
  }
}

type Rate = number | TieredPrices | undefined;

function split(rate: Rate): { base: number; tiers: PriceTier[] } | null {
  if (rate === undefined) return null;
  if (typeof rate === 'number') return { base: rate, tiers: [] };
  return { base: rate.base, tiers: rate.tiers.map((t) => ({ start: t.start, price: t.price })) };
}

/** Turn a catalogue entry into our shape; null when it has no text-token input price (audio, images). */
function fromCatalogue(model: string, provider: string, rates: CatalogueRates, source: string): ModelPrice | null {
  const input = split(rates.input_mtok);
  if (!input) return null;
  const cacheRead = split(rates.cache_read_mtok);
  // No output price in the catalogue means the model bills no output (embedding models).
  const output = split(rates.output_mtok) ?? { base: 0, tiers: [] };
  const price: ModelPrice = {
    model,
    inputMtok: input.base,
    cacheReadMtok: cacheRead ? cacheRead.base : null,
    outputMtok: output.base,
    source,
    date: null,
    provider,
    reference: null,
  };
  if (input.tiers.length || (cacheRead?.tiers.length ?? 0) || output.tiers.length) {
    price.tiers = { input: input.tiers, cacheRead: cacheRead?.tiers ?? [], output: output.tiers };
  }
  // Audio's own rates (gpt-audio: $32 in, $64 out per Mtok against $2.50 and $10 for text).
  const inputAudio = split(rates.input_audio_mtok);
  const outputAudio = split(rates.output_audio_mtok);
  if (inputAudio) price.inputAudioMtok = inputAudio.base;
  if (outputAudio) price.outputAudioMtok = outputAudio.base;
  return price;
}

/** A catalogue model id without its `vendor/` (OpenRouter's `openai/gpt-4o` is `gpt-4o`), as overrides are matched. */
function withoutVendor(id: string): string {
  return id.slice(id.lastIndexOf('/') + 1);
}

const MINUTE_MS = 60_000;
const LOOKUP_CACHE_MAX = 4096;

export class PriceTable {
  private readonly overrides: ReadonlyMap<string, ModelPrice>;
  /**
   * Overrides by the catalogue model their name resolves to, for the names the catalogue takes for
   * that model. An override written under the model's own name (`gpt-4o`, or its `-latest` alias:
   * `mistral-large-latest` for `mistral-large`) prices every such name (`gpt-4o-2024-08-06`). One
   * under a more particular name — a snapshot (`gpt-4o-2024-08-06`), a product the catalogue folds
   * into a model (`gpt-4o-mini-search-preview`) — prices that name and its own snapshots
   * (`gpt-4o-mini-search-preview-2025-03-11`), whatever their case, and not the model.
   */
  private readonly overridesByCatalogueModel = new Map<string, Array<{ name: string; general: boolean; price: ModelPrice }>>();
  private readonly recent = new Map<string, { price: ModelPrice | null; minute: number }>();
  readonly catalogueSource: string;

  constructor(overrides: ReadonlyMap<string, ModelPrice> = new Map()) {
    this.overrides = overrides;
    this.catalogueSource = catalogueSource();
    for (const [name, price] of overrides) {
      const found = this.catalogueLookup(name, {});
      if (found === null) continue;
      const model = withoutVendor(found.model).toLowerCase();
      const own = withoutVendor(name).toLowerCase();
      // Filed under its model whatever its name, an override priced the model and every other name
      // of it: a search-preview price on every gpt-4o-mini turn (67× its price).
      const general = own.replace(/-latest$/, '') === model;
      const list = this.overridesByCatalogueModel.get(model) ?? [];
      list.push({ name: own, general, price });
      this.overridesByCatalogueModel.set(model, list);
    }
  }

  /** Catalogue plus, when given, the operator's override file (validated now; throws naming the field). */
  static load(overridesPath?: string | null): PriceTable {
    return new PriceTable(overridesPath ? readPriceOverrides(overridesPath) : new Map());
  }

  /**
   * The list price of `model`, or null when neither the overrides nor the catalogue know it.
   * A provider-prefixed name (`openai/gpt-4o`, OpenRouter style) resolves as well.
   */
  lookup(model: string, opts: LookupOptions = {}): ModelPrice | null {
    // Asked on every request: an answer is remembered for the rest of its minute of UTC time.
    // Catalogue prices change on a date or at a time of day (DeepSeek's off-peak hours begin at
    // 16:30), always on a minute, so a price looked up at the minute's start holds for all of it;
    // one remembered for a minute from whenever it was asked billed turns at the old rate for up to
    // a minute past the change. A clock stepped back or forward is another minute, looked up again.
    const minute = Math.floor((opts.at ? opts.at.getTime() : Date.now()) / MINUTE_MS);
    const key = `${opts.providerId ?? ''}\u0000${model}`;
    const hit = this.recent.get(key);
    if (hit && hit.minute === minute) return hit.price;
    const price = this.find(model, { ...opts, at: new Date(minute * MINUTE_MS) });
    if (this.recent.size >= LOOKUP_CACHE_MAX) this.recent.clear();
    this.recent.set(key, { price, minute });
    return price;
  }

  private find(model: string, opts: LookupOptions): ModelPrice | null {
    const slash = model.indexOf('/');
    const prefix = slash > 0 ? model.slice(0, slash) : null;
    const bare = slash > 0 ? model.slice(slash + 1) : model;

    const own = this.overrides.get(model) ?? (prefix ? this.overrides.get(bare) : undefined);
    if (own) return own;

    // The operator's override wins for every name the catalogue takes for the model it overrides
    // (SPEC §7): a dated `gpt-4o-2024-08-06` is the catalogue's `gpt-4o`, and must not slip past an
    // override of `gpt-4o` to the bundled price. The price shown keeps the override's own name.
    const found = this.catalogueLookup(model, opts);
    if (found === null) return null;
    const carried = this.overridesByCatalogueModel.get(withoutVendor(found.model).toLowerCase());
    if (carried === undefined) return found;
    // The most particular override this name is, or is a snapshot of; else the model's own.
    const asked = withoutVendor(model).toLowerCase();
    let best: { name: string; price: ModelPrice } | null = null;
    for (const o of carried) {
      if ((asked === o.name || asked.startsWith(`${o.name}-`)) && (best === null || o.name.length > best.name.length)) best = o;
    }
    return (best ?? carried.find((o) => o.general))?.price ?? found;
  }

  /** The catalogue's price for `model`, tried the ways its names can be written; null if unknown. */
  private catalogueLookup(model: string, opts: LookupOptions): ModelPrice | null {
    const slash = model.indexOf('/');
    const prefix = slash > 0 ? model.slice(0, slash) : null;
    const bare = slash > 0 ? model.slice(slash + 1) : model;

    // Catalogue, most specific first: the upstream's provider; the prefix as a provider
    // (`openai/gpt-4o` → openai's gpt-4o, which has a cache-read price); OpenRouter's own
    // `vendor/model` ids (`meta-llama/…`); then genai-prices' name matching; then OpenAI's catalogue,
    // whose name matching does not claim every OpenAI model (`text-embedding-3-small`).
    const tries: Array<[string, string | undefined]> = [];
    if (opts.providerId) tries.push([model, opts.providerId], [bare, opts.providerId]);
    if (prefix && findProvider({ providerId: prefix })) tries.push([bare, prefix]);
    if (prefix) tries.push([model, 'openrouter']);
    tries.push([bare, undefined], [bare, 'openai']);
    for (const [name, providerId] of tries) {
      const found = this.catalogue(name, providerId, opts.at);
      if (found) return found;
    }
    return null;
  }

  private catalogue(name: string, providerId: string | undefined, at: Date | undefined): ModelPrice | null {
    let result: ReturnType<typeof calcPrice>;
    try {
      result = calcPrice({ input_tokens: 0, output_tokens: 0 }, name, {
        ...(providerId ? { providerId } : {}),
        ...(at ? { timestamp: at } : {}),
      });
    } catch {
      // A malformed catalogue entry throws inside genai-prices; treat it as "no price", never $0.
      return null;
    }
    if (!result) return null;
    return fromCatalogue(result.model.id, result.provider.id, result.model_price, this.catalogueSource);
  }
}
