// What an image part counts for, by model family (metering/tokenizers/image-tokens.ts, ADR 0022):
// the most OpenAI's published rule can bill for it, and the least, since the gateway never knows
// an image's size.

import t from 'tap';
import { imageRuleFor, imageTokens, MAX_IMAGE_TOKENS } from '../../metering/tokenizers/image-tokens.js';

const part = (detail?: string) => ({ type: 'image_url', image_url: { url: 'https://example.com/a.png', ...(detail ? { detail } : {}) } });
const cost = (model: string, detail?: string) => imageTokens(imageRuleFor(model), part(detail));

t.test('tile families: low is the flat base; high and auto reach base + 8 tiles', async (t) => {
  // gpt-4o: 85 + 170 per 512-pixel tile; at most 2048 × 768 after the resize, 4 × 2 tiles.
  t.same(cost('gpt-4o', 'low'), { tokens: 85, least: 85 });
  t.same(cost('gpt-4o', 'high'), { tokens: 85 + 8 * 170, least: 85 + 170 });
  t.same(cost('gpt-4o'), { tokens: 1445, least: 85 }, 'auto (or no detail) may pick low');
  t.same(cost('gpt-4o', 'auto'), { tokens: 1445, least: 85 });
  // The documented examples stay within the bound: 1024² is 765, 2048 × 4096 is 1,105.
  t.ok(765 <= 1445 && 1105 <= 1445);
  for (const name of ['gpt-4o-2024-08-06', 'openai/gpt-4o', 'chatgpt-4o-latest', 'gpt-4.1', 'gpt-4.1-2025-04-14', 'gpt-4.5-preview', 'gpt-4-turbo']) {
    t.same(cost(name, 'high'), { tokens: 1445, least: 255 }, name);
  }
  // gpt-4o-mini bills images through far larger token figures: 2,833 + 5,667 per tile.
  t.same(cost('gpt-4o-mini', 'low'), { tokens: 2833, least: 2833 });
  t.same(cost('gpt-4o-mini-2024-07-18', 'high'), { tokens: 2833 + 8 * 5667, least: 2833 + 5667 });
  t.same(cost('o1', 'high'), { tokens: 75 + 8 * 150, least: 225 });
  t.same(cost('o3-2025-04-16', 'low'), { tokens: 75, least: 75 });
  t.same(cost('gpt-5', 'high'), { tokens: 70 + 8 * 140, least: 210 });
  t.same(cost('gpt-5-chat-latest', 'low'), { tokens: 70, least: 70 });
});

t.test('patch families: 1,536 patches at most, times the multiplier, whatever the detail', async (t) => {
  t.same(cost('gpt-4.1-mini', 'high'), { tokens: Math.ceil(1536 * 1.62), least: 1 });
  t.same(cost('gpt-4.1-mini', 'low'), { tokens: 2489, least: 1 }, 'low is not documented to cost less');
  t.same(cost('gpt-4.1-nano'), { tokens: Math.ceil(1536 * 2.46), least: 1 });
  t.same(cost('gpt-5-mini-2025-08-07'), { tokens: 2489, least: 1 });
  t.same(cost('gpt-5-nano'), { tokens: 3779, least: 1 });
  t.same(cost('o4-mini'), { tokens: Math.ceil(1536 * 1.72), least: 1 });
});

t.test('a family the table does not know: the most any family here charges', async (t) => {
  t.equal(MAX_IMAGE_TOKENS, 48_169, "gpt-4o-mini's high-detail bound");
  for (const name of ['gpt-5.4', 'gpt-5.1-2025-11-13', 'gpt-oss-120b', 'gpt-3.5-turbo']) {
    t.same(cost(name, 'low'), { tokens: 48_169, least: 0 }, name);
  }
});

t.test('input_image parts carry their detail on the part', async (t) => {
  const rule = imageRuleFor('gpt-4o');
  t.same(imageTokens(rule, { type: 'input_image', image_url: 'https://example.com/a.png', detail: 'low' }), { tokens: 85, least: 85 });
  t.same(imageTokens(rule, { type: 'input_image', image_url: 'https://example.com/a.png' }), { tokens: 1445, least: 85 });
});
