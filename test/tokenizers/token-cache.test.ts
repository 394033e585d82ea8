import t from 'tap';
import { cacheKey, TokenCache } from '../../metering/token-cache.js';
import { canonicalJson } from '../../metering/canonical-json.js';
import { countMapCalls } from '../helpers/map-spy.js';

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

// Regression (audit: one request froze the process for ~18 s in TokenCache.set). V8's Map keeps a
// deleted entry until it rehashes — in its key's bucket chain and at the head of the iteration
// order — so an LRU built on delete + re-insert (per hit) and a fresh `keys()` iterator (per set)
// made every operation walk the deleted entries before it: quadratic. Timing is not asserted (the
// project forbids timed tests); what is asserted is the structure that makes each operation O(1):
// the Map is only written when a key arrives or is evicted, and it is never iterated.
t.test('a hit or a re-set never deletes from the Map; an eviction deletes once; nothing iterates it', async (t) => {
  const one = cacheKey('enc', 0).length * 2 + 96;
  const capacity = 1000;
  const cache = new TokenCache(one * capacity);
  const keys = Array.from({ length: 3 * capacity }, (_, i) => cacheKey('enc', i));
  for (let i = 0; i < capacity; i++) cache.set(keys[i]!, { tokens: i, upperBound: false });

  // 1. A hot key read and re-set many times, as a system prompt or a repeated message is.
  const hot = countMapCalls(() => {
    for (let i = 0; i < 5 * capacity; i++) {
      cache.get(keys[7]!);
      cache.set(keys[7]!, { tokens: 7, upperBound: false });
    }
  });
  // 2. New keys into the full cache: each evicts exactly one entry.
  const fresh = countMapCalls(() => {
    for (let i = capacity; i < 3 * capacity; i++) cache.set(keys[i]!, { tokens: i, upperBound: false });
  });
  const evictedAtOnce = hot.delete;
  const calls = { delete: hot.delete + fresh.delete, set: hot.set + fresh.set, iterators: hot.iterators + fresh.iterators };
  t.equal(evictedAtOnce, 0, 'hits and re-sets of a cached key delete nothing from the Map');
  t.equal(calls.delete, 2 * capacity, 'one delete per eviction');
  t.equal(calls.set, 2 * capacity, 'one Map write per new key');
  t.equal(calls.iterators, 0, 'eviction never starts an iterator');
  t.equal(cache.stats().entries, capacity);
  t.ok(cache.get(keys[3 * capacity - 1]!), 'the newest key is kept');
  t.equal(cache.get(keys[0]!), undefined, 'the oldest keys were evicted');
});

t.test('recency: a re-set refreshes a key, eviction order follows use', async (t) => {
  const one = cacheKey('enc', 'a').length * 2 + 96;
  const cache = new TokenCache(one * 3);
  const [a, b, c, d, e] = ['a', 'b', 'c', 'd', 'e'].map((v) => cacheKey('enc', v));
  cache.set(a!, { tokens: 1, upperBound: false });
  cache.set(b!, { tokens: 2, upperBound: false });
  cache.set(c!, { tokens: 3, upperBound: false });
  cache.set(a!, { tokens: 10, upperBound: true }); // a is the newest now, with its new value
  cache.set(d!, { tokens: 4, upperBound: false }); // evicts b
  t.equal(cache.get(b!), undefined);
  t.same(cache.get(a!), { tokens: 10, upperBound: true });
  cache.get(c!); // order, oldest first: d, a, c
  cache.set(e!, { tokens: 5, upperBound: false }); // evicts d
  t.equal(cache.get(d!), undefined);
  t.ok(cache.get(a!) && cache.get(c!) && cache.get(e!));
  t.equal(cache.stats().entries, 3);
  t.equal(cache.stats().bytes, 3 * one);
  t.equal(new TokenCache(one - 1).stats().entries, 0);
  const tiny = new TokenCache(one - 1);
  tiny.set(a!, { tokens: 1, upperBound: false });
  t.equal(tiny.stats().entries, 0, 'an entry heavier than the whole bound is not kept');
  cache.clear();
  cache.set(a!, { tokens: 1, upperBound: false });
  t.same(cache.stats(), { hits: 0, misses: 0, entries: 1, bytes: one, maxBytes: 3 * one }, 'clear() leaves a working cache');
});
