// The operator's price override file wins (SPEC §7, §11), whatever name a request uses for the
// model, and the price /v1/admission shows says where it came from.

import t from 'tap';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream, type TestGateway } from '../helpers/gateway.js';

type Json = Record<string, unknown>;

interface Teardown {
  teardown(fn: () => unknown): void;
  testdir(fixture?: Record<string, string>): string;
}

/** A gateway serving `gpt-*` from a metered double, with these overrides. */
async function world(t: Teardown, models: Json): Promise<{ gw: TestGateway; file: string }> {
  const file = join(t.testdir(), 'prices.json');
  writeFileSync(file, JSON.stringify({ models }));
  const upstream = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], prices: { overrides: file } });
  return { gw, file };
}

async function priceOf(gw: TestGateway, model: string): Promise<Json> {
  const res = await fetch(`${gw.url}/v1/admission`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model, max_tokens: 10, messages: [{ role: 'user', content: 'Hi' }] } }),
  });
  const plan = (await res.json()) as { cost_usd: { price: Json } };
  return plan.cost_usd.price;
}

t.test('an override of gpt-4o prices its dated names too (regression: the catalogue price won)', async (t) => {
  const { gw, file } = await world(t, {
    'gpt-4o': { input_mtok: 100, cache_read_mtok: 10, output_mtok: 400, date: '2026-01-01' },
  });
  // 1. A name the catalogue resolves to gpt-4o gets the override, which keeps its own name.
  for (const name of ['gpt-4o', 'gpt-4o-2024-08-06', 'gpt-4o-2024-11-20']) {
    t.match(await priceOf(gw, name), { model: 'gpt-4o', input_mtok: 100, output_mtok: 400, date: '2026-01-01', source: `override:${file}` }, name);
  }
  // 2. A snapshot the catalogue prices apart (gpt-4o-2024-05-13: $5 / $15) is another model.
  t.match(await priceOf(gw, 'gpt-4o-2024-05-13'), { model: 'gpt-4o-2024-05-13', input_mtok: 5, source: /^genai-prices@/ });
  t.match(await priceOf(gw, 'gpt-4o-mini'), { model: 'gpt-4o-mini', source: /^genai-prices@/ });
});

t.test("the source an override names is the price's source; the file it came from is its origin (regression)", async (t) => {
  const { gw, file } = await world(t, {
    'gpt-4o': { input_mtok: 100, output_mtok: 400, source: 'https://openai.com/api/pricing (contract 2026)', date: '2026-01-01' },
    'gpt-4o-mini': { input_mtok: 1, output_mtok: 2, date: '2026-01-02' },
  });
  // 1. The operator's own `source` text is shown, and where the gateway read it beside it.
  t.match(await priceOf(gw, 'gpt-4o'), {
    model: 'gpt-4o',
    source: 'https://openai.com/api/pricing (contract 2026)',
    origin: `override:${file}`,
    date: '2026-01-01',
  });
  // 2. An override without one: the file is all there is to say.
  t.match(await priceOf(gw, 'gpt-4o-mini'), { source: `override:${file}`, origin: `override:${file}`, date: '2026-01-02' });
  // 3. The catalogue: its version, both ways.
  const bundled = await priceOf(gw, 'gpt-4.1');
  t.match(bundled, { source: /^genai-prices@\d/, origin: /^genai-prices@\d/, date: null });
  t.equal(bundled.source, bundled.origin);
});
