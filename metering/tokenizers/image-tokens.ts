// What one image part of a chat prompt can cost, by model family (ADR 0022). OpenAI bills an image
// as prompt tokens worked out from its pixel size and `detail` (the "Images and vision" guide,
// "Calculating costs"). The gateway never fetches an image, so it does not know the size: an image
// is counted at the most its family's rule can charge for it — an upper bound, labelled so — and
// the least it can cost is kept beside, so that a bound never refuses a request for size alone.
//
// Two kinds of rule:
// - tiles: `detail: "low"` is a flat `base`; otherwise the image is fitted into 2048 × 2048, its
//   shortest side brought down to 768 (never enlarged: a 128 × 64 image is one tile), and each
//   512-pixel tile costs `tile` more: at most 4 × 2 tiles (2048 × 768).
// - patches: the image is covered by 32-pixel patches, scaled down to at most 1,536 of them, and the
//   patches are multiplied by the family's `multiplier`. `detail` is not documented to change this
//   (and measured not to), so `low` is no cheaper.

/** After the resize an image spans at most 2048 × 768 pixels: 4 × 2 tiles of 512. */
export const MAX_TILES = 8;
/** A patch family scales an image down to at most this many 32-pixel patches. */
export const MAX_PATCHES = 1536;

export type ImageRule =
  | { kind: 'tiles'; base: number; tile: number }
  | { kind: 'patches'; multiplier: number }
  /** A family this table does not know: the most any family here charges for one image. */
  | { kind: 'unknown' };

/** What one image part costs: exactly `tokens` when `least === tokens`, else somewhere in between. */
export interface ImageTokens {
  /** The most it can cost: what the count takes. */
  tokens: number;
  /** The least it can cost. */
  least: number;
}

const tiles = (base: number, tile: number): ImageRule => ({ kind: 'tiles', base, tile });
const patches = (multiplier: number): ImageRule => ({ kind: 'patches', multiplier });

/**
 * OpenAI's published figures, by model name: the name itself or the name followed by `-`
 * (`gpt-4o-2024-08-06`), the more specific names first. gpt-4o-mini is billed at about the same
 * money per image as gpt-4o through far larger token figures (its tokens cost 1/16 as much).
 * gpt-5-mini and gpt-5-nano keep the documented multipliers, the larger of what is documented and
 * what users measured (1.2 and 1.5). Names that match nothing (gpt-5.x, gpt-oss, gpt-3.5…) are
 * `unknown`.
 */
const FAMILIES: ReadonlyArray<readonly [string, ImageRule]> = [
  ['gpt-4o-mini', tiles(2833, 5667)],
  ['gpt-4.1-mini', patches(1.62)],
  ['gpt-4.1-nano', patches(2.46)],
  ['gpt-5-mini', patches(1.62)],
  ['gpt-5-nano', patches(2.46)],
  ['o4-mini', patches(1.72)],
  ['gpt-4o', tiles(85, 170)],
  ['chatgpt-4o', tiles(85, 170)],
  ['gpt-4.1', tiles(85, 170)],
  ['gpt-4.5', tiles(85, 170)],
  ['gpt-4-turbo', tiles(85, 170)],
  ['o1', tiles(75, 150)],
  ['o3', tiles(75, 150)],
  ['gpt-5', tiles(70, 140)],
];

/** The image rule of a model name (a `vendor/` prefix is ignored). */
export function imageRuleFor(model: string): ImageRule {
  const name = model.slice(model.lastIndexOf('/') + 1).toLowerCase();
  for (const [family, rule] of FAMILIES) if (name === family || name.startsWith(`${family}-`)) return rule;
  return { kind: 'unknown' };
}

function maxOf(rule: Exclude<ImageRule, { kind: 'unknown' }>): number {
  return rule.kind === 'tiles' ? rule.base + MAX_TILES * rule.tile : Math.ceil(MAX_PATCHES * rule.multiplier);
}

/** The most one image can cost in any family of the table: the bound of a family it does not know. */
export const MAX_IMAGE_TOKENS = Math.max(...FAMILIES.map(([, rule]) => maxOf(rule as Exclude<ImageRule, { kind: 'unknown' }>)));

/** An image part's `detail`: on the part's `image_url` object (Chat Completions) or the part itself (`input_image`). */
function detailOf(part: Record<string, unknown>): unknown {
  const url = part.image_url;
  if (url !== null && typeof url === 'object' && 'detail' in url) return (url as Record<string, unknown>).detail;
  return part.detail;
}

/** Whether a content part is an image the model reads. */
export function isImagePart(part: { type?: unknown }): boolean {
  return part.type === 'image_url' || part.type === 'input_image';
}

/** What one image part can cost under `rule`. */
export function imageTokens(rule: ImageRule, part: Record<string, unknown>): ImageTokens {
  if (rule.kind === 'unknown') return { tokens: MAX_IMAGE_TOKENS, least: 0 };
  if (rule.kind === 'patches') return { tokens: maxOf(rule), least: 1 };
  const detail = detailOf(part);
  if (detail === 'low') return { tokens: rule.base, least: rule.base };
  // `high` is at least one tile; `auto` (or none) lets the model choose, `low` included.
  return { tokens: maxOf(rule), least: detail === 'high' ? rule.base + rule.tile : rule.base };
}
