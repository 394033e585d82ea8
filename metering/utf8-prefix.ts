// The longest start of a string whose UTF-8 encoding fits a number of bytes, cut between whole
// characters (never inside a surrogate pair): for text that must stop at a byte or token budget.

export function utf8Prefix(text: string, maxBytes: number): string {
  let bytes = 0;
  let i = 0;
  while (i < text.length) {
    const code = text.codePointAt(i)!;
    const size = code < 0x80 ? 1 : code < 0x800 ? 2 : code < 0x10000 ? 3 : 4;
    if (bytes + size > maxBytes) break;
    bytes += size;
    i += code >= 0x10000 ? 2 : 1;
  }
  return text.slice(0, i);
}
