// Canonical JSON and hashing for run recognition. Two clients that send the same message with keys
// in a different order (or one that writes `content: null` and one that omits it) must hash alike,
// or a conversation would look new at every turn and patience could never see a repeat.

import { createHash } from 'node:crypto';

/**
 * JSON with object keys sorted at every depth. Object members whose value is `null` or
 * `undefined` are dropped: SDKs disagree on whether an absent field is sent as `null`
 * (the OpenAI SDKs echo `content: null`, `refusal: null`), and in a chat message the two mean
 * the same. Array elements are kept as they are (`null` in an array is data).
 */
export function canonicalJson(value: unknown): string {
  return JSON.stringify(normalise(value)) ?? 'null';
}

function normalise(value: unknown): unknown {
  if (Array.isArray(value)) return value.map((v) => (v === undefined ? null : normalise(v)));
  if (value !== null && typeof value === 'object') {
    // No prototype: a member named `__proto__` (JSON.parse makes it an own field) is kept as one,
    // not taken for the object's prototype and dropped from the hash.
    const out = Object.create(null) as Record<string, unknown>;
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      if (v === null || v === undefined || typeof v === 'function') continue;
      out[key] = normalise(v);
    }
    return out;
  }
  return value;
}

/** Tool-call arguments compared by meaning: parsed JSON made canonical, else the raw string. */
export function canonicalArguments(raw: string | undefined): string {
  if (raw === undefined) return '';
  try {
    return canonicalJson(JSON.parse(raw));
  } catch {
    // Not JSON (a model that wrote broken arguments): only an exact repeat is identical.
    return `raw:${raw}`;
  }
}

export function sha256Hex(text: string): string {
  return createHash('sha256').update(text, 'utf8').digest('hex');
}
