// The shared prefix of SPEC §4 (metering/charge.ts): what a request shares with its conversation's
// previous one, and never more.
import t from 'tap';
import { sharedPrefixTokens, promptChargeFor } from '../metering/charge.js';
import { CLOCK_SKEW_TOLERANCE_MS } from '../metering/clock-skew.js';

const upstream = { prefixCache: true, prefixCacheTtlSeconds: 3600, serverId: 'llama-1' };
const head = (prefix: number[], prefixDigests: string[] | null = null) => ({ model: 'm', toolHash: '', serverId: 'llama-1', chain: ['u1', 'a1', 't1'], prefix, prefixDigests, time: 0 });

t.test("a message the server's template renders otherwise in the next request is not shared, nor what follows it", async (t) => {
  // 1. The previous request [u1, a1, t1]: a1 came after the last user message, and a Qwen3-style
  //    template kept its reasoning (a1 renders as 60 tokens).
  const previous = head([5, 30, 90, 120]);
  // 2. This request [u1, a1, t1, a2, u2]: a user message follows a1 now, and it renders without
  //    its reasoning (20 tokens): the server's cache matches only up to a1.
  const current = { chain: ['u1', 'a1', 't1', 'a2', 'u2'], prefix: [5, 30, 50, 80, 90, 100], model: 'm', toolHash: '', now: 1, upstream };
  t.equal(sharedPrefixTokens({ ...current, head: previous, renderedByServer: true }), 30, 'u1 only: the counts part at a1');
  // 3. Counted by the gateway itself (tiktoken), a message counts the same wherever it stands.
  t.equal(sharedPrefixTokens({ ...current, head: previous }), 80, 'all three, the smaller count of each');
  // 4. Counts that agree at every boundary: all three messages.
  t.equal(sharedPrefixTokens({ ...current, head: head([5, 30, 50, 80]), renderedByServer: true }), 80);
  // 5. They part before the first message ends (the system turn itself was rendered otherwise).
  t.equal(sharedPrefixTokens({ ...current, head: head([5, 31, 51, 81]), renderedByServer: true }), 0);
  t.equal(promptChargeFor(100, 30), 86, 'the charge: 100 − (30 − 16)');
});

t.test('a message rendered to other tokens at the same count is not shared, nor what follows it', async (t) => {
  // Llama 3.x's template writes today's date into its system turn: the next day, the previous
  // request's leading messages count the same and render otherwise (the server's cache is missed).
  const current = { chain: ['u1', 'a1', 't1', 'u2'], prefix: [12, 30, 50, 80, 90], model: 'm', toolHash: '', now: 1, upstream };
  const yesterday = head([12, 30, 50, 80], ['d0', 'd1', 'd2', 'd3']);
  t.equal(sharedPrefixTokens({ ...current, prefixDigests: ['D0', 'D1', 'D2', 'D3', 'D4'], head: yesterday }), 0, 'the date sits before the first message: nothing');
  t.equal(sharedPrefixTokens({ ...current, prefixDigests: ['d0', 'd1', 'D2', 'D3', 'D4'], head: yesterday }), 30, 'parted in a1: u1 only');
  t.equal(sharedPrefixTokens({ ...current, prefixDigests: ['d0', 'd1', 'd2', 'd3', 'd4'], head: yesterday }), 80, 'the same tokens throughout: all three');
  // Where the counts differ the digests cover different lengths and say nothing: the counts are
  // judged as before (only with reasoning), and a head or request without digests is not checked.
  const trimmed = { ...current, prefix: [12, 28, 48, 78, 88], prefixDigests: ['d0', 'X1', 'X2', 'X3', 'X4'] };
  t.equal(sharedPrefixTokens({ ...trimmed, head: yesterday }), 78, 'other counts, no reasoning: the chain decides');
  t.equal(sharedPrefixTokens({ ...current, prefixDigests: ['D0', 'D1', 'D2', 'D3', 'D4'], head: head([12, 30, 50, 80]) }), 80, 'an older head has none');
  t.equal(sharedPrefixTokens({ ...current, head: yesterday }), 80, 'a request counted without them has none');
});

t.test("where this request's tokens are at hand, a boundary counts only if its tokens begin this request too", async (t) => {
  // The previous request's digests at its own boundaries; this request begins with the first 30 of
  // its tokens (u1), then parts (a template wrote a message elsewhere), whatever its own counts say.
  const previous = head([12, 30, 50, 80], ['d12', 'd30', 'd50', 'd80']);
  const begins = (upTo: number) => (n: number) => (n <= upTo ? `d${n}` : 'other');
  const current = { chain: ['u1', 'a1', 't1', 'u2'], prefix: [20, 280, 290, 300, 310], model: 'm', toolHash: '', now: 1, upstream };
  t.equal(sharedPrefixTokens({ ...current, head: previous, digestAt: begins(30) }), 30, 'u1 begins both: its 30 tokens, not the 80 the chain would give');
  t.equal(sharedPrefixTokens({ ...current, head: previous, digestAt: begins(80) }), 80, 'all three begin both');
  t.equal(sharedPrefixTokens({ ...current, head: previous, digestAt: begins(11) }), 0, 'parted before the first message ended');
  t.equal(sharedPrefixTokens({ ...current, head: head([12, 30, 50, 80]), digestAt: begins(0) }), 80, 'a head without digests is not checked');
  // Boundaries whose tokens are asked for: a binary search, not one digest each.
  const asked: number[] = [];
  const long = head(Array.from({ length: 1025 }, (_, k) => k * 10), Array.from({ length: 1025 }, (_, k) => `d${k * 10}`));
  const chain = Array.from({ length: 1024 }, (_, k) => `m${k}`);
  const sharedLong = sharedPrefixTokens({
    chain: [...chain, 'next'],
    prefix: Array.from({ length: 1026 }, (_, k) => k * 10),
    model: 'm',
    toolHash: '',
    now: 1,
    upstream,
    head: { ...long, chain },
    digestAt: (n) => (asked.push(n), n <= 5000 ? `d${n}` : 'other'),
  });
  t.equal(sharedLong, 5000);
  t.ok(asked.length <= 11, `${asked.length} digests asked for 1,024 boundaries`);
});

t.test('the check applies to conversations whose assistant turns carry reasoning, which templates render by position', async (t) => {
  const { carriesReasoning } = await import('../server/pipeline/plan.js');
  t.equal(carriesReasoning({ role: 'assistant', content: 'Paris.' }), false, 'a plain reply');
  t.equal(carriesReasoning({ role: 'assistant', content: 'ok', reasoning_content: 'the user wants…' } as never), true, 'reasoning_content sent back');
  t.equal(carriesReasoning({ role: 'assistant', content: 'ok', reasoning: 'the user wants…' } as never), true);
  t.equal(carriesReasoning({ role: 'assistant', content: '<think>the user wants…</think>ok' }), true, 'reasoning inline');
  t.equal(carriesReasoning({ role: 'user', content: '<think>' }), false, 'only assistant turns');
});

t.test('a head written ahead of this clock by more than clocks differ (one stepped back) shares nothing; a replica a little ahead is now', async (t) => {
  const hour = 3_600_000;
  const now = 10 * hour;
  const fiveMinutes = { ...upstream, prefixCacheTtlSeconds: 300 };
  const current = { chain: ['u1', 'a1', 't1', 'u2'], prefix: [12, 30, 50, 80, 90], model: 'm', toolHash: '', now, upstream: fiveMinutes };
  const readAt = (time: number) => ({ ...head([12, 30, 50, 80]), time });
  t.equal(sharedPrefixTokens({ ...current, head: readAt(now - 1_000) }), 80, 'a second ago: shared');
  t.equal(sharedPrefixTokens({ ...current, head: readAt(now + CLOCK_SKEW_TOLERANCE_MS) }), 80, "written by a replica whose clock is a little ahead: as now");
  t.equal(sharedPrefixTokens({ ...current, head: readAt(now - 301_000) }), 0, 'past the lifetime: nothing');
  // The clock stepped back an hour, and ten real minutes passed: the head reads 50 minutes ahead.
  t.equal(sharedPrefixTokens({ ...current, head: readAt(now + hour - 600_000) }), 0, 'an age not known: nothing (it was credited as fresh)');
});
