// Texts for the tokenizer-worker tests, reproducible from a seed: prose, random base64, runs without
// spaces, and multi-byte text (CJK, accents, emoji whose surrogate pairs land on piece cuts).

/** mulberry32: a tiny seeded PRNG, so a failing input can be regenerated. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let x = a;
    x = Math.imul(x ^ (x >>> 15), x | 1);
    x ^= x + Math.imul(x ^ (x >>> 7), x | 61);
    return ((x ^ (x >>> 14)) >>> 0) / 4294967296;
  };
}

const WORDS = (
  'the gateway meters every request by the work it causes and refuses before a model is called ' +
  'budgets conversations tenants tokens prefix cache upstream stream relay settle refund charge ' +
  'however, although; because: (see section 3) "quoted" words — dashes… 1,024 rows 36,864 tokens'
).split(' ');

export function prose(bytes: number, seed = 1): string {
  const r = rng(seed);
  const out: string[] = [];
  let n = 0;
  while (n < bytes) {
    const w = WORDS[Math.floor(r() * WORDS.length)];
    out.push(w);
    n += w.length + 1;
    if (r() < 0.08) out.push('\n');
  }
  return out.join(' ').slice(0, bytes);
}

export function base64(bytes: number, seed = 2): string {
  const r = rng(seed);
  const raw = Buffer.alloc(Math.ceil((bytes * 3) / 4));
  for (let i = 0; i < raw.length; i++) raw[i] = Math.floor(r() * 256);
  return raw.toString('base64').slice(0, bytes);
}

/** One character repeated, and random letters without a space: both one long pre-token. */
export function noSpaceRuns(chars: number, seed = 3): string {
  const r = rng(seed);
  let random = '';
  for (let i = 0; i < chars; i++) random += String.fromCharCode(97 + Math.floor(r() * 26));
  return `intro ${'x'.repeat(chars)} middle ${random} end`;
}

const MULTI = ['日本語の文章', 'Ünïcödé façade', '😀', '👩‍👩‍👧', '𝔘𝔫𝔦', 'Привет мир', 'عربى', '🚀🚀🚀'];

/** Multi-byte text, with spaceless stretches of astral characters so cuts fall beside surrogates. */
export function multiByte(chars: number, seed = 4): string {
  const r = rng(seed);
  let s = '';
  while (s.length < chars) {
    s += MULTI[Math.floor(r() * MULTI.length)];
    if (r() < 0.3) s += ' ';
  }
  return s + ' <|endoftext|> ' + '😀'.repeat(700);
}
