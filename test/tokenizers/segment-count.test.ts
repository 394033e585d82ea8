// countOrdinary (metering/tokenizers/segment-count.ts) must equal tiktoken's own
// `encode_ordinary(text).length` exactly, for any text: it cuts text before spaces that follow a
// non-whitespace character and sums memoised segment counts. Checked here against tiktoken itself
// on prose, code, JSON, many scripts, odd whitespace and random text, cold and with a warm memo.
import t from 'tap';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { get_encoding } from '@dqbd/tiktoken';
import { countOrdinary, segmentMemoSize, MAX_MEMO_SEGMENT, NEW_SEGMENTS_PER_TEXT } from '../../metering/tokenizers/segment-count.js';
import { getEncoder } from '../../metering/tokenizers/bounded-encode.js';

// A seeded generator: the same texts every run, so a failure can be reproduced.
function rng(seed: number) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    return (x >>> 0) / 0x100000000;
  };
}

const PROSE = [
  "It's a timeout after acceptance: the client can't tell whether the work happened. We'll retry — don't worry!",
  'THE SERVER SAID: "I\'LL BE BACK" and I\'M sure they\'RE right; you\'VE seen it, he\'D say.',
  'Version 3.14.159 shipped on 2026-11-29 at 23:59:59 UTC with 1,234,567 requests (99.95% ok).',
  '  Leading spaces, trailing spaces   \n\n\tTabs\tand\r\nCRLF lines  \n',
  'The proxy times out at 60 s and our server keep-alive is 5 s. Could that explain 502s?',
  'path/to/file.ts:42:7 — see https://example.com/a/b?c=d&e=f#g and ./relative/../path',
];
const CODE = [
  'function add(a, b) {\n    return a + b; // sum\n}\n\nconst x = add(1, 2);\nif (x !== 3) throw new Error(`bad ${x}`);',
  'def f(xs: list[int]) -> int:\n    """Doc string."""\n    return sum(x * 2 for x in xs if x % 3 == 0)\n',
  '{"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 256, "stream": true}',
  'SELECT id, name FROM users WHERE age >= 18 AND name LIKE \'%son\' ORDER BY id DESC LIMIT 10;',
  '<div class="a b" id=x>Text &amp; more</div>\n<!-- comment -->  <br/>',
];
const SCRIPTS = [
  '这是一个没有空格的中文句子，包含标点符号。还有第二句！',
  'これは日本語の文です。カタカナとひらがな、漢字が混ざっています。',
  'Это предложение на русском языке, с запятыми и точкой.',
  'هذه جملة باللغة العربية مع علامات الترقيم.',
  'यह हिंदी में एक वाक्य है, जिसमें मात्राएँ हैं।',
  'Emoji 👩‍💻 and flags 🇫🇷 🇯🇵, skin tones 👍🏽, and math 𝔸𝔹ℂ 𝟘𝟙 in text.',
  'Accents: café naïve coöperate e\u0301 a\u0308 — combining marks after letters.',
  'Ελληνικά κείμενα με τόνους, και עברית עם ניקוד.',
];
// Characters that stress the cut rule: every kind of whitespace (and two look-alikes that are not
// Unicode White_Space: U+200B and U+FEFF), apostrophes, slashes, digits, marks, surrogate pairs.
const POOL = [
  ' ', ' ', ' ', '  ', '\n', '\r\n', '\t', '\u00a0', '\u2003', '\u3000', '\u2028', '\u0085', '\u200b', '\ufeff', '\u001f', '\u000b',
  "'", "'s", "'LL", "'re", '/', '//', '\\', '.', ',', '!', '?', '-', '—', '(', ')', '"', '#', '@', '_',
  'a', 'b', 'Z', 'word', 'Words', 'UPPER', 'camelCase', 'x1', '0', '12', '345', '6789', '3.14',
  'é', 'e\u0301', '中', '文字', 'ж', 'ا', 'क्ष', '👍', '👩‍💻', '𝔸', '\ud83d\ude00',
];

function randomText(r: () => number, parts: number): string {
  let s = '';
  for (let i = 0; i < parts; i++) {
    const k = r();
    if (k < 0.55) s += POOL[Math.floor(r() * POOL.length)];
    else if (k < 0.7) s += ' ';
    else {
      const src = [PROSE, CODE, SCRIPTS][Math.floor(r() * 3)]!;
      const text = src[Math.floor(r() * src.length)]!;
      const a = Math.floor(r() * text.length);
      s += text.slice(a, a + 1 + Math.floor(r() * 40));
    }
  }
  return s;
}

for (const encoding of ['o200k_base', 'cl100k_base'] as const) {
  t.test(`${encoding}: the sum of segment counts is tiktoken's own count`, async (t) => {
    const enc = getEncoder(encoding);
    const reference = get_encoding(encoding);
    t.teardown(() => reference.free());
    const exact = (s: string) => reference.encode_ordinary(s).length;
    let checked = 0;
    let mismatches = 0;
    const check = (s: string) => {
      const want = exact(s);
      // Cold for the new segments, then again with the memo warm.
      const first = countOrdinary(enc, s);
      const second = countOrdinary(enc, s);
      checked++;
      if (first !== want || second !== want) {
        mismatches++;
        if (mismatches <= 5) t.fail(`count differs for ${JSON.stringify(s)}: tiktoken ${want}, segments ${first}/${second}`);
      }
    };
    for (const s of [...PROSE, ...CODE, ...SCRIPTS]) check(s);
    // Whole documents: many segments, repeats, past the per-text allowance of new segments.
    check([...PROSE, ...CODE, ...SCRIPTS].join(' '));
    check([...PROSE, ...CODE, ...SCRIPTS].join('\n\n').repeat(3));
    check(`${'supercalifragilistic'.repeat(5)} ${'x'.repeat(MAX_MEMO_SEGMENT + 1)} tail`);
    check(Array.from({ length: NEW_SEGMENTS_PER_TEXT * 3 }, (_, i) => `novel${i}x${i * 7}`).join(' '));
    const r = rng(encoding === 'o200k_base' ? 1234 : 5678);
    for (let i = 0; i < 4000; i++) check(randomText(r, 1 + Math.floor(r() * 30)));
    t.equal(mismatches, 0, `${checked} texts, every count identical to encode_ordinary`);
    t.ok(segmentMemoSize(enc) > 0, 'segments were memoised');
  });
}

t.test('a familiar sentence costs look-ups, not tiktoken calls', async (t) => {
  const enc = getEncoder('o200k_base');
  let calls = 0;
  const counting = new Proxy(enc, {
    get(target, prop, receiver) {
      if (prop === 'encode_ordinary') {
        return (s: string) => {
          calls++;
          return target.encode_ordinary(s);
        };
      }
      return Reflect.get(target, prop, receiver) as unknown;
    },
  });
  const question = (n: number) => `Request ${n}: the proxy times out at 60 s and our server keep-alive is 5 s. Could that explain intermittent errors?`;
  countOrdinary(counting, question(1));
  calls = 0;
  const got = countOrdinary(counting, question(2));
  t.equal(got, enc.encode_ordinary(question(2)).length);
  t.equal(calls, 1, 'only the new number was encoded');
});

// An outside audit: a memoised word was a view into the text it was cut from (V8 makes a slice of
// 13 characters or more one), so each text that taught the memo one new word stayed in memory whole.
t.test('a memoised word does not keep the text it came from alive', async (t) => {
  setFlagsFromString('--expose-gc');
  const gc = runInNewContext('gc') as () => void;
  const enc = get_encoding('o200k_base');
  t.teardown(() => enc.free());
  gc();
  const before = process.memoryUsage().heapUsed;
  for (let i = 0; i < 200; i++) {
    // 256 KB of text a call, with one word not seen before (20 characters) among words it knows.
    const text = 'lorem ipsum '.repeat(21_845) + `uniquewordnumber${String(i).padStart(4, '0')} dolor`;
    countOrdinary(enc, text);
  }
  // Twice: one full collection can leave large strings it freed for the next to give back.
  gc();
  gc();
  const grown = process.memoryUsage().heapUsed - before;
  t.ok(grown < 10_000_000, `200 texts of 256 KB each taught a word; the heap grew ${(grown / 1e6).toFixed(1)} MB (their texts are 100 MB)`);
});
