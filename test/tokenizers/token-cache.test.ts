import t from 'tap';
import { cacheKey, TokenCache } from '../../metering/token-cache.js';
import { canonicalJson } from '../../metering/canonical-json.js';

t.test('hits and misses are counted; recency decides eviction', async (t) => {
  const one = cacheKey('enc', 'a').length * 2 + 96; // the weight of one entry
  const cache = new TokenCache(one * 2);
  const [a, b, c] = ['a', 'b', 'c'].map((v) => cacheKey('enc', v));
  t.equal(cache.get(a), undefined);
  cache.set(a, { tokens: 1, upperBound: false });
  cache.set(b, { tokens: 2, upperBound: false });
  t.same(cache.get(a), { tokens: 1, upperBound: false }); // a is now the most recent
  cache.set(c, { tokens: 3, upperBound: true });
  t.equal(cache.get(b), undefined, 'b, the least recently used, was evicted');
  t.ok(cache.get(a));
  t.ok(cache.get(c));
  const s = cache.stats();
  t.same({ hits: s.hits, misses: s.misses, entries: s.entries }, { hits: 3, misses: 2, entries: 2 });
  t.ok(s.bytes <= s.maxBytes);
  cache.clear();
  t.equal(cache.stats().entries, 0);
});

t.test('the byte bound holds under a flood of distinct keys', async (t) => {
  const cache = new TokenCache(10_000);
  for (let i = 0; i < 5000; i++) cache.set(cacheKey('enc', i), { tokens: i, upperBound: false });
  t.ok(cache.stats().bytes <= 10_000);
  t.ok(cache.stats().entries > 10);
});

t.test('keys are canonical: object key order does not matter, namespaces do', async (t) => {
  t.equal(canonicalJson({ b: 1, a: [{ d: 2, c: 3 }] }), '{"a":[{"c":3,"d":2}],"b":1}');
  t.equal(cacheKey('x', { role: 'user', content: 'hi' }), cacheKey('x', { content: 'hi', role: 'user' }));
  t.not(cacheKey('o200k_base', 'hi'), cacheKey('cl100k_base', 'hi'));
  t.not(cacheKey('x', { content: 'hi' }), cacheKey('x', { content: 'hi ' }));
});
