import t from 'tap';
import { PriceTable } from '../../pricing/price-table.js';
import type { ModelPrice } from '../../pricing/model-price.js';
import { turnCost, worstCaseUsd, listPriceUsd } from '../../pricing/turn-cost.js';

// An override-style price with round numbers so the arithmetic is checkable by hand.
const price: ModelPrice = {
  model: 'm',
  inputMtok: 2,
  cacheReadMtok: 0.5,
  outputMtok: 8,
  source: 'override:prices.json',
  date: '2026-01-01',
};
const near = (a: number | null, b: number) => a !== null && Math.abs(a - b) < 1e-12;

t.test('metered: the provider figure wins over list price', async (t) => {
  const c = turnCost({ billing: 'metered', price, usage: { inputTokens: 1000, cachedTokens: 400, outputTokens: 100 }, providerCostUsd: 0.0123 });
  t.equal(c.costUsd, 0.0123);
  t.equal(c.source, 'provider');
  t.ok(near(c.savedUsd, (400 * (2 - 0.5)) / 1e6), 'saving still at list price');
  t.equal(c.planWorkUsd, null);
});

t.test('metered: list price with cached input (input includes cached)', async (t) => {
  // 1. 10,000 input of which 4,000 cached, 1,000 output (reasoning included).
  const c = turnCost({ billing: 'metered', price, usage: { inputTokens: 10_000, cachedTokens: 4_000, outputTokens: 1_000 } });
  // 2. 6,000 × $2 + 4,000 × $0.50 + 1,000 × $8, per million.
  t.ok(near(c.costUsd, (6000 * 2 + 4000 * 0.5 + 1000 * 8) / 1e6));
  t.equal(c.costUsd, 0.022);
  // 3. Saving: 4,000 × ($2 − $0.50) per million.
  t.equal(c.savedUsd, 0.006);
  t.equal(c.source, 'list-price');
  t.equal(c.priceSource, 'override:prices.json');
});

t.test('metered: catalogue arithmetic for gpt-4o', async (t) => {
  const gpt4o = PriceTable.load().lookup('gpt-4o')!;
  const c = turnCost({ billing: 'metered', price: gpt4o, usage: { inputTokens: 1_000_000, cachedTokens: 500_000, outputTokens: 1_000_000 } });
  // $2.50/M uncached, $1.25/M cached, $10/M output: 1.25 + 0.625 + 10.
  t.equal(c.costUsd, 11.875);
  t.equal(c.savedUsd, 0.625);
});

t.test('metered: no cache-read price bills cached input as input', async (t) => {
  const flat: ModelPrice = { ...price, cacheReadMtok: null };
  const c = turnCost({ billing: 'metered', price: flat, usage: { inputTokens: 1000, cachedTokens: 1000, outputTokens: 0 } });
  t.equal(c.costUsd, 0.002);
  t.equal(c.savedUsd, 0);
});

t.test('metered: cached tokens over input are clamped, never negative input', async (t) => {
  t.equal(listPriceUsd(price, { inputTokens: 100, cachedTokens: 500, outputTokens: 0 }), (100 * 0.5) / 1e6);
});

t.test('metered: unknown price is null, never $0', async (t) => {
  const c = turnCost({ billing: 'metered', price: null, usage: { inputTokens: 1000, outputTokens: 10 } });
  t.equal(c.costUsd, null);
  t.equal(c.savedUsd, null);
  t.equal(c.source, 'unpriced');
  const bad = turnCost({ billing: 'metered', price: null, usage: { inputTokens: 1, outputTokens: 1 }, providerCostUsd: Number.NaN });
  t.equal(bad.costUsd, null, 'a nonsense provider figure is not a figure');
});

t.test('local costs nothing and saves nothing', async (t) => {
  const c = turnCost({ billing: 'local', price, usage: { inputTokens: 5000, cachedTokens: 4000, outputTokens: 500 }, providerCostUsd: 1 });
  t.same(c, { costUsd: 0, savedUsd: null, planWorkUsd: null, source: 'local', priceSource: null });
});

t.test('plan: no money, list-price work shown', async (t) => {
  const c = turnCost({ billing: 'plan', price, usage: { inputTokens: 10_000, cachedTokens: 4_000, outputTokens: 1_000 } });
  t.equal(c.costUsd, 0);
  t.equal(c.planWorkUsd, 0.022);
  t.equal(c.source, 'plan');
  const unpriced = turnCost({ billing: 'plan', price: null, usage: { inputTokens: 10, outputTokens: 1 } });
  t.equal(unpriced.costUsd, 0);
  t.equal(unpriced.planWorkUsd, null);
});

t.test('worst case: whole prompt uncached + whole allowance', async (t) => {
  // 10,000 × $2 + 4,096 × $8 per million (cache-read price not used: a hit is never promised).
  t.equal(worstCaseUsd({ price, promptTokens: 10_000, allowance: 4096, audioOutput: false }), (10_000 * 2 + 4096 * 8) / 1e6);
  t.equal(worstCaseUsd({ price: null, promptTokens: 10, allowance: 10, audioOutput: false }), null);
  t.equal(worstCaseUsd({ price, promptTokens: 0, allowance: 0, audioOutput: false }), 0);
});

t.test('worst case: output at the audio rate only for a request that may be answered in audio', async (t) => {
  const audio: ModelPrice = { ...price, outputAudioMtok: 64 };
  t.equal(worstCaseUsd({ price: audio, promptTokens: 1000, allowance: 1000, audioOutput: false }), (1000 * 2 + 1000 * 8) / 1e6, 'text: the text rate');
  t.equal(worstCaseUsd({ price: audio, promptTokens: 1000, allowance: 1000, audioOutput: true }), (1000 * 2 + 1000 * 64) / 1e6, 'audio: the dearer audio rate');
  t.equal(worstCaseUsd({ price: { ...price, outputAudioMtok: 4 }, promptTokens: 1000, allowance: 1000, audioOutput: true }), (1000 * 2 + 1000 * 8) / 1e6, 'an audio rate below the text one: the text rate');
});

t.test('worst case: a long prompt pays the long-context tier', async (t) => {
  const tiered: ModelPrice = { ...price, tiers: { input: [{ start: 200_000, price: 4 }], output: [{ start: 200_000, price: 12 }] } };
  t.equal(worstCaseUsd({ price: tiered, promptTokens: 100_000, allowance: 1000, audioOutput: false }), 0.208);
  t.equal(worstCaseUsd({ price: tiered, promptTokens: 250_000, allowance: 1000, audioOutput: false }), 1.012);
});

// An outside audit: gpt-audio's audio tokens were priced at its text rates, about 7.5× too low,
// though the catalogue has its audio rates ($32 in, $64 out per Mtok).
t.test('audio tokens are priced at the audio rates where the price has them', async (t) => {
  const gptAudio = PriceTable.load().lookup('gpt-audio')!;
  t.equal(gptAudio.inputAudioMtok, 32);
  t.equal(gptAudio.outputAudioMtok, 64);
  // 112 prompt tokens of which 100 audio; 50 output of which 40 audio.
  const usage = { inputTokens: 112, outputTokens: 50, inputAudioTokens: 100, outputAudioTokens: 40 };
  const c = turnCost({ billing: 'metered', price: gptAudio, usage });
  t.ok(near(c.costUsd, (12 * 2.5 + 100 * 32 + 10 * 10 + 40 * 64) / 1e6), `${c.costUsd}`);
  // Without audio rates the table knows no other: text rates.
  t.equal(listPriceUsd(price, usage), (112 * 2 + 50 * 8) / 1e6);
  // Audio past the uncached input or the output is no figure: clamped.
  t.ok(near(listPriceUsd({ ...price, inputAudioMtok: 10, outputAudioMtok: 20 }, { inputTokens: 10, cachedTokens: 4, outputTokens: 5, inputAudioTokens: 50, outputAudioTokens: 50 }), (4 * 0.5 + 6 * 10 + 5 * 20) / 1e6));
});
