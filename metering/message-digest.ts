// One digest per message, computed once per request and shared by everything that needs to know
// whether a message was seen before: the prefix chain (conversation inference, shared prefix) and
// the per-message token-count cache. It is a digest of the message's canonical JSON (keys sorted,
// null and absent alike — metering/canonical-json.ts), with a fast path for the common flat
// message ({role, content: string, name}) that skips building a normalised copy: per-message work
// is what turn 100 of a conversation pays 200 times (bench/RESULTS.md).

import { createHash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';

const digests = new WeakMap<object, string>();

/** Canonical JSON of an object whose values are all primitives, or null when one is not. */
function flatCanonical(message: Record<string, unknown>): string | null {
  const keys = Object.keys(message).sort();
  let out = '{';
  let first = true;
  for (const key of keys) {
    const v = message[key];
    if (v === null || v === undefined) continue;
    if (typeof v === 'object' || typeof v === 'function') return null;
    out += `${first ? '' : ','}${JSON.stringify(key)}:${JSON.stringify(v)}`;
    first = false;
  }
  return `${out}}`;
}

export function messageDigest(message: object): string {
  let d = digests.get(message);
  if (d === undefined) {
    const text = flatCanonical(message as Record<string, unknown>) ?? canonicalJson(message);
    d = createHash('sha1').update(text).digest('base64');
    digests.set(message, d);
  }
  return d;
}
