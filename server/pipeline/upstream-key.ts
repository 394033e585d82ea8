// The upstream's own API key never reaches a client. An upstream (a proxy, a misconfigured
// provider) may echo the request's headers back — in an error body, in an error inside a stream,
// in a header the gateway passes on — and the key the gateway sent is among them. Every such
// text is searched for the key before it leaves, decoded where it is JSON: an echo that spells the
// key with JSON escapes (`\u0073k-…`) is the key to the client's parser all the same.

/** What stands where the key was. */
export const REDACTED = '[redacted]';

/** A key shorter than this is not looked for: it would match ordinary text, and is no real key. */
const MIN_KEY_CHARS = 8;

function searched(key: string | null | undefined): key is string {
  return typeof key === 'string' && key.length >= MIN_KEY_CHARS;
}

/** Whether `text` holds the key as it is (its JSON-escaped spellings are found by parsing: redactDeep). */
export function holdsKey(text: string, key: string | null | undefined): boolean {
  return searched(key) && text.includes(key);
}

/** `text` with every occurrence of `key` replaced. */
export function redactText(text: string, key: string | null | undefined): string {
  return searched(key) && text.includes(key) ? text.split(key).join(REDACTED) : text;
}

/** `value` (parsed JSON) with the key replaced in every string, keys of objects included; the same value when nothing changed. */
export function redactDeep<T>(value: T, key: string | null | undefined): T {
  if (!searched(key)) return value;
  const walk = (v: unknown): unknown => {
    if (typeof v === 'string') return redactText(v, key);
    if (Array.isArray(v)) {
      let changed = false;
      const out = v.map((x) => {
        const y = walk(x);
        if (y !== x) changed = true;
        return y;
      });
      return changed ? out : v;
    }
    if (v !== null && typeof v === 'object') {
      let changed = false;
      const out: Record<string, unknown> = {};
      for (const [k, x] of Object.entries(v as Record<string, unknown>)) {
        const k2 = redactText(k, key);
        const y = walk(x);
        if (y !== x || k2 !== k) changed = true;
        // A member named `__proto__` (JSON.parse makes it an own field) stays a member.
        Object.defineProperty(out, k2, { value: y, enumerable: true, writable: true, configurable: true });
      }
      return changed ? out : v;
    }
    return v;
  };
  return walk(value) as T;
}

/**
 * A body the upstream wrote (an error's, usually JSON) without the key: replaced in the text as it
 * is, and, when the text is JSON with escapes, in its decoded strings (then written out again).
 */
export function redactBodyText(text: string, key: string | null | undefined): string {
  if (!searched(key)) return text;
  const plain = redactText(text, key);
  if (!plain.includes('\\')) return plain;
  let parsed: unknown;
  try {
    parsed = JSON.parse(plain);
  } catch {
    return plain;
  }
  const clean = redactDeep(parsed, key);
  return clean === parsed ? plain : JSON.stringify(clean);
}
