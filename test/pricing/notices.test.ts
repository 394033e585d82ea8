import t from 'tap';
import type { ModelPrice } from '../../pricing/model-price.js';
import { budgetNearReached, pricierNotice, estimateLikeLastUsd } from '../../pricing/notices.js';
import { formatUsdHeader, formatUsdText } from '../../pricing/usd-format.js';

const opus: ModelPrice = { model: 'opus', inputMtok: 15, cacheReadMtok: 1.5, outputMtok: 75, source: 'override:t', date: '2026-01-01' };

t.test('budget-near: reached at 80 % of the budget or past it', async (t) => {
  t.ok(budgetNearReached(40, 50), 'exactly 80 % has reached it');
  t.ok(budgetNearReached(45, 50), 'past 80 % has reached it');
  t.ok(budgetNearReached(60, 50), 'past the whole budget (an operator lowered it) still has');
  t.notOk(budgetNearReached(39.99, 50), 'still under');
  t.notOk(budgetNearReached(100, null), 'no budget, no notice');
  t.notOk(budgetNearReached(100, 0), 'a zero budget has no 80 % line worth saying');
});

t.test('budget-near: float dust below the line has reached it', async (t) => {
  let spent = 0;
  for (let i = 0; i < 8; i++) spent += 0.1;
  t.not(spent, 0.8, 'eight $0.10 turns do not add up to 0.8 in doubles');
  t.ok(budgetNearReached(spent, 1), '…and still reach 80 % of $1');
  t.notOk(budgetNearReached(0.7999, 1), 'a real shortfall is not dust');
});

t.test('pricier: estimate a reply like the last, uncached, at list price', async (t) => {
  // 40,000 prompt × $15 + 1,200 output × $75, per million = 0.6 + 0.09.
  t.equal(estimateLikeLastUsd(opus, 40_000, 1_200), 0.69);
  t.equal(
    pricierNotice({ lastCostUsd: 0.21, lastPromptTokens: 40_000, lastOutputTokens: 1_200, newPrice: opus, newBilling: 'metered' }),
    'pricier; estimate_usd=0.69; last_usd=0.21',
  );
});

t.test('pricier: thresholds $0.25 and 2×', async (t) => {
  const base = { lastPromptTokens: 40_000, lastOutputTokens: 1_200, newPrice: opus, newBilling: 'metered' as const };
  t.equal(pricierNotice({ ...base, lastCostUsd: 0.345 }) !== null, true, 'exactly 2× the last: said');
  t.equal(pricierNotice({ ...base, lastCostUsd: 0.35 }), null, 'under 2×: quiet');
  // A short chat: 10,000 × $15 + 1,000 × $75 = $0.225 < $0.25, though 20× the last.
  t.equal(pricierNotice({ ...base, lastPromptTokens: 10_000, lastOutputTokens: 1_000, lastCostUsd: 0.01 }), null);
  // 10,000 × $15 + 1,400 × $75 = $0.255 ≥ $0.25.
  t.equal(
    pricierNotice({ ...base, lastPromptTokens: 10_000, lastOutputTokens: 1_400, lastCostUsd: 0.01 }),
    'pricier; estimate_usd=0.26; last_usd=0.01',
  );
  t.equal(pricierNotice({ ...base, lastCostUsd: 0 }), 'pricier; estimate_usd=0.69; last_usd=0', 'from a free model');
});

t.test('pricier: never for local or plan targets, unpriced ones, or an unknown last cost', async (t) => {
  const base = { lastCostUsd: 0.01, lastPromptTokens: 100_000, lastOutputTokens: 4_000, newPrice: opus };
  t.equal(pricierNotice({ ...base, newBilling: 'local' }), null);
  t.equal(pricierNotice({ ...base, newBilling: 'plan' }), null);
  t.equal(pricierNotice({ ...base, newBilling: 'metered', newPrice: null }), null);
  t.equal(pricierNotice({ ...base, newBilling: 'metered', lastCostUsd: null }), null);
});

t.test('x-tollgate-cost-usd formatting', async (t) => {
  t.equal(formatUsdHeader(0), '0', 'free is 0');
  t.equal(formatUsdHeader(null), null, 'unknown: header absent');
  t.equal(formatUsdHeader(0.022), '0.022');
  t.equal(formatUsdHeader(11.875), '11.875');
  t.equal(formatUsdHeader(2), '2');
  t.equal(formatUsdHeader(0.000000123456), '0.0000001235', "no exponent, the ledger's 10 decimals");
  t.equal(formatUsdHeader(0.000008875), '0.000008875', 'a cached-read price needs 9 decimals');
  t.equal(formatUsdHeader(0.1 + 0.2), '0.3', 'float dust trimmed');
  t.equal(formatUsdHeader(2e-10), '0.0000000002');
  t.equal(formatUsdHeader(2e-12), '0.000000000002', 'non-zero never shown as free');
  t.equal(formatUsdText(2), '$2.00');
});

// The sixteenth session's note: the estimate priced a reply at the text rate even for a request
// that asks for audio, which admission reserves at the audio rate (gpt-audio: $10 against $64).
t.test('pricier: a request that asks for audio is estimated at the audio output rate', async (t) => {
  const audio: ModelPrice = { model: 'audio', inputMtok: 2.5, cacheReadMtok: null, outputMtok: 10, outputAudioMtok: 64, source: 'override:t', date: '2026-01-01' };
  // 20,000 prompt × $2.50 + 4,000 output × $10 (text) or × $64 (audio), per million.
  t.equal(estimateLikeLastUsd(audio, 20_000, 4_000), 0.09);
  t.equal(estimateLikeLastUsd(audio, 20_000, 4_000, true), 0.306);
  const ask = { lastCostUsd: 0.02, lastPromptTokens: 20_000, lastOutputTokens: 4_000, newPrice: audio, newBilling: 'metered' as const };
  t.equal(pricierNotice(ask), null, 'in text: $0.09, under the $0.25 a notice needs');
  t.equal(pricierNotice({ ...ask, audioOutput: true }), 'pricier; estimate_usd=0.31; last_usd=0.02', 'in audio: $0.306, said to the cent');
});
