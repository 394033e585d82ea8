// Where a top-level member's value lies in a JSON text, in bytes: /v1/admission holds the request
// inside its wrapper to `limits.maxBodyBytes` as the client wrote it (escapes, spaces, bytes that
// are not UTF-8 and all), not as the gateway would write it again.

const QUOTE = 0x22;
const BACKSLASH = 0x5c;
const isSpace = (b: number) => b === 0x20 || b === 0x0a || b === 0x0d || b === 0x09;

/** The end (exclusive) of the string starting at `at` (its opening quote). */
function stringEnd(raw: Buffer, at: number): number {
  for (let i = at + 1; i < raw.length; i++) {
    if (raw[i] === BACKSLASH) i++;
    else if (raw[i] === QUOTE) return i + 1;
  }
  return -1;
}

/** The end (exclusive) of the value starting at `at`: a string, an object or array, or a literal. */
function valueEnd(raw: Buffer, at: number): number {
  const first = raw[at];
  if (first === QUOTE) return stringEnd(raw, at);
  if (first === 0x7b || first === 0x5b) {
    let depth = 0;
    for (let i = at; i < raw.length; i++) {
      const b = raw[i]!;
      if (b === QUOTE) {
        i = stringEnd(raw, i) - 1;
        if (i < 0) return -1;
      } else if (b === 0x7b || b === 0x5b) depth++;
      else if (b === 0x7d || b === 0x5d) {
        depth--;
        if (depth === 0) return i + 1;
      }
    }
    return -1;
  }
  let i = at;
  while (i < raw.length && !isSpace(raw[i]!) && raw[i] !== 0x2c && raw[i] !== 0x7d && raw[i] !== 0x5d) i++;
  return i;
}

/**
 * The bytes of the value of `key` in the JSON object `raw` (the last one, as JSON.parse keeps), or
 * null where `raw` is no object holding it. `raw` is taken to be valid JSON (it was parsed).
 */
export function memberValueBytes(raw: Buffer, key: string): number | null {
  let i = 0;
  const skip = () => {
    while (i < raw.length && isSpace(raw[i]!)) i++;
  };
  skip();
  if (raw[i] !== 0x7b) return null;
  i++;
  let found: number | null = null;
  for (;;) {
    skip();
    if (raw[i] !== QUOTE) return found;
    const keyEnd = stringEnd(raw, i);
    if (keyEnd < 0) return found;
    const name = JSON.parse(raw.subarray(i, keyEnd).toString('utf8')) as string;
    i = keyEnd;
    skip();
    if (raw[i] !== 0x3a) return found;
    i++;
    skip();
    const end = valueEnd(raw, i);
    if (end < 0) return found;
    if (name === key) found = end - i;
    i = end;
    skip();
    if (raw[i] !== 0x2c) return found;
    i++;
  }
}
