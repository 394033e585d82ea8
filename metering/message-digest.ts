// One digest per message, computed once per request and shared by everything that needs to know
// whether a message was seen before: the prefix chain (conversation inference, shared prefix) and
// the per-message token-count cache. It is a digest of the message's canonical form (keys sorted,
// null and absent alike — as metering/canonical-json.ts), with a fast path for the common flat
// message ({role, content: string, name}) that hashes its fields directly instead of building a
// normalised copy: per-message work is what turn 100 of a conversation pays 200 times, and what a
// megabyte of content pays per byte (bench/RESULTS.md).

import { createHash, type Hash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';
import { hashOnce } from './hash-once.js';

const digests = new WeakMap<object, string>();

/**
 * Up to this many characters of canonical form, a message is hashed in one call (hash-once.ts);
 * past it the form is streamed into a Hash, so a megabyte of content is never copied into a joined
 * string. Both give SHA-1 the same bytes, hence the same digest — digests feed the chain hashes
 * kept in the ledger, so they must not change.
 */
const ONE_SHOT_CHARS = 4096;

/**
 * The canonical form of a flat message (every value a primitive) — keys sorted, null and absent
 * alike, each value length-prefixed so the encoding is unambiguous — when it is at most `limit`
 * characters; else null. `keys` are the message's keys, sorted.
 */
function flatForm(message: Record<string, unknown>, keys: readonly string[], limit: number): string | null {
  let form = 'f';
  for (const key of keys) {
    const v = message[key];
    if (v === null || v === undefined) continue;
    const text = typeof v === 'string' ? v : String(v);
    if (form.length + key.length + text.length > limit) return null;
    form += `${key.length}:${key}${typeof v}:${text.length}:${text}`;
  }
  return form.length <= limit ? form : null;
}

/** The same form as `flatForm`, fed to `hash` piece by piece: a long value is hashed as it is. */
function hashFlat(hash: Hash, message: Record<string, unknown>, keys: readonly string[]): void {
  hash.update('f');
  for (const key of keys) {
    const v = message[key];
    if (v === null || v === undefined) continue;
    const text = typeof v === 'string' ? v : String(v);
    hash.update(`${key.length}:${key}${typeof v}:${text.length}:`);
    hash.update(text);
  }
}

/** False when a value is an object (tool calls, content parts): the message is hashed as canonical JSON. */
function isFlat(message: Record<string, unknown>, keys: readonly string[]): boolean {
  for (const key of keys) {
    const v = message[key];
    if ((typeof v === 'object' && v !== null) || typeof v === 'function') return false;
  }
  return true;
}

function digestOf(message: Record<string, unknown>): string {
  const keys = Object.keys(message).sort();
  if (isFlat(message, keys)) {
    const form = flatForm(message, keys, ONE_SHOT_CHARS);
    if (form !== null) return hashOnce('sha1', form, 'base64');
    const hash = createHash('sha1');
    hashFlat(hash, message, keys);
    return hash.digest('base64');
  }
  const json = canonicalJson(message);
  if (json.length + 1 <= ONE_SHOT_CHARS) return hashOnce('sha1', `j${json}`, 'base64');
  return createHash('sha1').update('j').update(json).digest('base64');
}

export function messageDigest(message: object): string {
  let d = digests.get(message);
  if (d === undefined) {
    d = digestOf(message as Record<string, unknown>);
    digests.set(message, d);
  }
  return d;
}
