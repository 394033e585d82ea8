// Text a client or operator names that the ledger keeps (a model's name, a key's name): SQLite and
// PostgreSQL must store it alike. PostgreSQL cannot hold a NUL (a 500 where SQLite said 200), and
// the two write an unpaired UTF-16 surrogate differently (three U+FFFD against one), so the same
// request read back differently by store. Neither belongs in a name: both are refused, with the
// other control characters, before anything is counted or written.

/** A control character (C0 or DEL), or a surrogate without its pair (`u`: a pair is one code point). */
const UNSTORABLE = /[\u0000-\u001f\u007f]|[\ud800-\udfff]/u;

/** Why `text` cannot be kept as given ('' when it can). */
export function unstorableText(text: string): string {
  const m = UNSTORABLE.exec(text);
  if (m === null) return '';
  const code = m[0].codePointAt(0)!;
  const at = `U+${code.toString(16).toUpperCase().padStart(4, '0')} at character ${m.index}`;
  return code >= 0xd800 ? `must be well-formed text: it holds an unpaired surrogate (${at})` : `must not contain control characters (${at})`;
}
