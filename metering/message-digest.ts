// One digest per message, computed once per request and shared by everything that needs to know
// whether a message was seen before: the prefix chain (conversation inference, shared prefix) and
// the per-message token-count cache. It is a digest of the message's canonical form (keys sorted,
// null and absent alike — as metering/canonical-json.ts), with a fast path for the common flat
// message ({role, content: string, name}) that hashes its fields directly instead of building a
// normalised copy: per-message work is what turn 100 of a conversation pays 200 times, and what a
// megabyte of content pays per byte (bench/RESULTS.md).

import { createHash, type Hash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';

const digests = new WeakMap<object, string>();

/**
 * Feeds a flat message (every value a primitive) to `hash` canonically — keys sorted, null and
 * absent alike, each value length-prefixed so the encoding is unambiguous — without building its
 * JSON: a megabyte of content is hashed as it is, not copied twice first. False when a value is an
 * object (tool calls, content parts): the caller then hashes canonical JSON.
 */
function hashFlat(hash: Hash, message: Record<string, unknown>): boolean {
  const keys = Object.keys(message).sort();
  for (const key of keys) {
    const v = message[key];
    if (typeof v === 'object' || typeof v === 'function') {
      if (v === null) continue;
      return false;
    }
  }
  hash.update('f');
  for (const key of keys) {
    const v = message[key];
    if (v === null || v === undefined) continue;
    const text = typeof v === 'string' ? v : String(v);
    hash.update(`${key.length}:${key}${typeof v}:${text.length}:`);
    hash.update(text);
  }
  return true;
}

export function messageDigest(message: object): string {
  let d = digests.get(message);
  if (d === undefined) {
    const hash = createHash('sha1');
    if (!hashFlat(hash, message as Record<string, unknown>)) hash.update('j').update(canonicalJson(message));
    d = hash.digest('base64');
    digests.set(message, d);
  }
  return d;
}
