// The operator's price override file (SPEC §11):
//   {"models": {"<model>": {"input_mtok", "cache_read_mtok", "output_mtok", "source", "date"}}}
// (and, for audio models, "input_audio_mtok" and "output_audio_mtok": audio tokens' own rates)
// USD per million tokens, genai-prices' field names. Read once at start; every bad field is named
// in the error as a path in the file (`prices.overrides p.json: models["x"].input_mtok: must be …`),
// so the operator knows exactly what to fix, and where.

import { readFileSync } from 'node:fs';
import type { ModelPrice } from './model-price.js';

export class PriceOverridesError extends Error {
  override name = 'PriceOverridesError';
}

const ENTRY_FIELDS = ['input_mtok', 'cache_read_mtok', 'output_mtok', 'input_audio_mtok', 'output_audio_mtok', 'source', 'date'];
const DATE = /^\d{4}-\d{2}-\d{2}$/;

function isObj(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

function isPrice(v: unknown): v is number {
  return typeof v === 'number' && Number.isFinite(v) && v >= 0;
}

/**
 * Validate a parsed override document. `file` names the source (`override:<file>`).
 * Required per model: `input_mtok`, `output_mtok`, `date`; `cache_read_mtok` and `source` optional
 * (without a cache-read price, cached input is billed as input — never guessed cheaper).
 */
export function parsePriceOverrides(raw: unknown, file: string): Map<string, ModelPrice> {
  // Named as a path in the file, after the config field that names the file: the config's own
  // `prices` holds no `models` (regression: `prices.models["m"].date` sent operators to the config).
  const fail = (where: string, msg: string): never => {
    throw new PriceOverridesError(`prices.overrides ${file}: ${where === '' ? 'the file' : where.replace(/^\./, '')}: ${msg}`);
  };
  if (!isObj(raw)) fail('', 'must be an object like {"models": {…}}');
  const doc = raw as Record<string, unknown>;
  for (const k of Object.keys(doc)) if (k !== 'models') fail(`.${k}`, 'unknown field (expected models)');
  const models = doc.models ?? {};
  if (!isObj(models)) fail('.models', 'must be an object keyed by model name');

  const out = new Map<string, ModelPrice>();
  for (const [model, entry] of Object.entries(models as Record<string, unknown>)) {
    const at = `.models[${JSON.stringify(model)}]`;
    if (model.trim() === '') fail(at, 'model name must not be empty');
    if (!isObj(entry)) fail(at, 'must be an object with input_mtok, output_mtok and date');
    const e = entry as Record<string, unknown>;
    for (const k of Object.keys(e)) {
      if (!ENTRY_FIELDS.includes(k)) fail(`${at}.${k}`, `unknown field (expected one of ${ENTRY_FIELDS.join(', ')})`);
    }
    for (const k of ['input_mtok', 'output_mtok']) {
      if (!isPrice(e[k])) fail(`${at}.${k}`, 'must be a non-negative number');
    }
    for (const k of ['cache_read_mtok', 'input_audio_mtok', 'output_audio_mtok']) {
      if (e[k] !== undefined && e[k] !== null && !isPrice(e[k])) fail(`${at}.${k}`, 'must be a non-negative number (or omitted)');
    }
    // Admission reserves a prompt at the input price, as if none of it were cached: a cache-read
    // price above it (0.25 typed 25) makes that no bound, and a cap is crossed by a cache hit.
    if (typeof e.cache_read_mtok === 'number' && typeof e.input_mtok === 'number' && e.cache_read_mtok > e.input_mtok) {
      fail(`${at}.cache_read_mtok`, `must not be above input_mtok (${e.cache_read_mtok} > ${e.input_mtok}): a cached token costs no more than an uncached one`);
    }
    if (e.source !== undefined && e.source !== null && typeof e.source !== 'string') {
      fail(`${at}.source`, 'must be a string');
    }
    if (typeof e.date !== 'string' || !DATE.test(e.date) || !isCalendarDate(e.date)) {
      fail(`${at}.date`, 'must be a date written YYYY-MM-DD (when the price was read)');
    }
    out.set(model, {
      model,
      inputMtok: e.input_mtok as number,
      cacheReadMtok: (e.cache_read_mtok as number | null | undefined) ?? null,
      outputMtok: e.output_mtok as number,
      source: `override:${file}`,
      date: e.date as string,
      provider: null,
      reference: (e.source as string | null | undefined) ?? null,
      ...(typeof e.input_audio_mtok === 'number' ? { inputAudioMtok: e.input_audio_mtok } : {}),
      ...(typeof e.output_audio_mtok === 'number' ? { outputAudioMtok: e.output_audio_mtok } : {}),
    });
  }
  return out;
}

/** A YYYY-MM-DD that names a day of the calendar (`Date.parse` takes 2026-02-30 for March 2). */
function isCalendarDate(text: string): boolean {
  const at = new Date(`${text}T00:00:00Z`);
  return !Number.isNaN(at.getTime()) && at.toISOString().slice(0, 10) === text;
}

/** Read and validate the override file at `path`. */
export function readPriceOverrides(path: string): Map<string, ModelPrice> {
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new PriceOverridesError(`prices.overrides: cannot read ${path}: ${why}`);
  }
  let raw: unknown;
  try {
    raw = JSON.parse(text.replace(/^\uFEFF/, ''));
  } catch (err) {
    const why = err instanceof Error ? err.message : String(err);
    throw new PriceOverridesError(`prices.overrides: ${path} is not valid JSON: ${why}`);
  }
  return parsePriceOverrides(raw, path);
}
