import t from 'tap';
import { join } from 'node:path';
import { PriceTable } from '../../pricing/price-table.js';
import { parsePriceOverrides, PriceOverridesError } from '../../pricing/price-overrides.js';
import { ratesAt } from '../../pricing/model-price.js';
import { HOUR_MS, steppableWallClock } from '../helpers/wall-clock.js';

t.test('catalogue: a known OpenAI model has per-Mtok prices, provider and versioned source', async (t) => {
  const table = PriceTable.load();
  const p = table.lookup('gpt-4o');
  t.ok(p);
  t.equal(p!.inputMtok, 2.5);
  t.equal(p!.cacheReadMtok, 1.25);
  t.equal(p!.outputMtok, 10);
  t.equal(p!.provider, 'openai');
  t.match(p!.source, /^genai-prices@\d+\.\d+\.\d+/);
  t.equal(p!.date, null, 'the bundled data carries no date: null, not an invented one');
});

t.test('catalogue: dated snapshot names resolve to their model', async (t) => {
  const p = PriceTable.load().lookup('gpt-4o-2024-08-06');
  t.equal(p?.model, 'gpt-4o');
});

t.test('provider-prefixed names resolve', async (t) => {
  const table = PriceTable.load();
  // 1. The prefix is a catalogue provider: its own entry (with a cache-read price) wins.
  const viaOpenai = table.lookup('openai/gpt-4o');
  t.equal(viaOpenai?.provider, 'openai');
  t.equal(viaOpenai?.inputMtok, 2.5);
  t.equal(viaOpenai?.cacheReadMtok, 1.25);
  // 2. The prefix is no provider (an OpenRouter vendor name): OpenRouter's vendor/model id.
  const llama = table.lookup('meta-llama/llama-3.1-8b-instruct');
  t.equal(llama?.provider, 'openrouter');
  t.ok(llama!.inputMtok > 0);
  // 3. An explicit provider hint is honoured.
  const hinted = table.lookup('openai/gpt-4o', { providerId: 'openrouter' });
  t.equal(hinted?.provider, 'openrouter');
});

t.test('embedding models: input price only, output priced 0', async (t) => {
  const p = PriceTable.load().lookup('text-embedding-3-small');
  t.equal(p?.inputMtok, 0.02);
  t.equal(p?.outputMtok, 0);
});

t.test('unknown models are null, never $0', async (t) => {
  const table = PriceTable.load();
  t.equal(table.lookup('my-local-llama-7b'), null);
  t.equal(table.lookup('nobody/no-such-model-xyz'), null);
});

t.test('long-context tiers are kept and applied by input size', async (t) => {
  const p = PriceTable.load().lookup('gemini-2.5-pro');
  t.ok(p?.tiers?.input?.length, 'tiers carried over from the catalogue');
  t.equal(ratesAt(p!, 1000).input, p!.inputMtok);
  t.ok(ratesAt(p!, 300_000).input > p!.inputMtok, 'a 300k prompt pays the higher tier');
});

t.test('override file wins over the catalogue and names its source and date', async (t) => {
  const dir = t.testdir({
    'prices.json': JSON.stringify({
      models: {
        'gpt-4o': { input_mtok: 3, cache_read_mtok: 1, output_mtok: 12, source: 'contract 2026', date: '2026-01-15' },
        'house-model': { input_mtok: 0.5, output_mtok: 1.5, date: '2026-02-01' },
      },
    }),
  });
  const file = join(dir, 'prices.json');
  const table = PriceTable.load(file);
  const p = table.lookup('gpt-4o');
  t.equal(p?.inputMtok, 3);
  t.equal(p?.source, `override:${file}`);
  t.equal(p?.date, '2026-01-15');
  t.equal(p?.reference, 'contract 2026');
  t.equal(table.lookup('openai/gpt-4o')?.inputMtok, 3, 'a prefixed name finds the bare override');
  const house = table.lookup('house-model');
  t.equal(house?.cacheReadMtok, null, 'no cache-read price: cached input billed as input');
  t.equal(table.lookup('gpt-4o-mini')?.source.startsWith('genai-prices@'), true, 'others still from the catalogue');
});

t.test('an override wins for every name the catalogue resolves to its model (regression)', async (t) => {
  const dir = t.testdir({
    'prices.json': JSON.stringify({
      models: {
        'gpt-4o': { input_mtok: 3, cache_read_mtok: 1, output_mtok: 12, date: '2026-01-15' },
        'gpt-4o-mini-2024-07-18': { input_mtok: 0.2, output_mtok: 0.8, date: '2026-01-15' },
        'gpt-4o-mini-search-preview': { input_mtok: 10, output_mtok: 40, date: '2026-10-01', source: 'search contract' },
        'mistral-large-latest': { input_mtok: 1.5, output_mtok: 5, date: '2026-10-01' },
        'house-model': { input_mtok: 0.5, output_mtok: 1.5, date: '2026-02-01' },
      },
    }),
  });
  const file = join(dir, 'prices.json');
  const table = PriceTable.load(file);
  // 1. Dated names of gpt-4o, bare or prefixed: the override, under its own name.
  for (const name of ['gpt-4o-2024-08-06', 'gpt-4o-2024-11-20', 'openai/gpt-4o-2024-08-06']) {
    const p = table.lookup(name);
    t.match(p, { model: 'gpt-4o', inputMtok: 3, source: `override:${file}`, date: '2026-01-15' }, name);
  }
  // 2. An override written under a more particular name holds that name alone. Regression: it
  // priced the model the catalogue folds it into, and every other name of that model.
  t.match(table.lookup('gpt-4o-mini-2024-07-18'), { model: 'gpt-4o-mini-2024-07-18', inputMtok: 0.2 });
  t.match(table.lookup('gpt-4o-mini-search-preview'), { inputMtok: 10, source: `override:${file}` });
  t.match(table.lookup('gpt-4o-mini'), { inputMtok: 0.15, source: /^genai-prices@/ }, 'not gpt-4o-mini itself: the catalogue price');
  // … but its own snapshots, in any case, are that product.
  t.match(table.lookup('gpt-4o-mini-search-preview-2025-03-11'), { inputMtok: 10 }, "the product's snapshot");
  t.match(table.lookup('GPT-4o-mini-search-preview'), { inputMtok: 10 }, 'the same name in capitals');
  // A `-latest` alias is its model's own name: it prices the model's snapshots.
  t.match(table.lookup('mistral-large-2411'), { inputMtok: 1.5, source: `override:${file}` }, 'mistral-large-latest prices mistral-large-2411');
  // 3. A snapshot the catalogue prices apart is not gpt-4o; a name the catalogue does not know
  // keeps its exact-name override only.
  t.match(table.lookup('gpt-4o-2024-05-13'), { model: 'gpt-4o-2024-05-13', inputMtok: 5, source: /^genai-prices@/ });
  t.equal(table.lookup('house-model')?.inputMtok, 0.5);
  t.equal(table.lookup('house-model-2'), null);
});

t.test('override validation names the field, as a path in the file it is in', async (t) => {
  const bad = (raw: unknown, re: RegExp) => t.throws(() => parsePriceOverrides(raw, 'p.json'), re);
  bad({ models: { x: { input_mtok: -1, output_mtok: 1, date: '2026-01-01' } } }, /^prices\.overrides p\.json: models\["x"\]\.input_mtok: must be a non-negative number/);
  bad({ models: { x: { input_mtok: 1, output_mtok: '2', date: '2026-01-01' } } }, /prices\.overrides p\.json: models\["x"\]\.output_mtok: must be a non-negative number/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2, cache_read_mtok: NaN, date: '2026-01-01' } } }, /prices\.overrides p\.json: models\["x"\]\.cache_read_mtok/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2 } } }, /prices\.overrides p\.json: models\["x"\]\.date: must be a date/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2, date: 'yesterday' } } }, /\.date/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2, date: '2026-02-30' } } }, /prices\.overrides p\.json: models\["x"\]\.date: must be a date/);
  // Admission reserves input at the uncached price: a dearer cache read would make that no bound.
  bad({ models: { x: { input_mtok: 2.5, cache_read_mtok: 25, output_mtok: 10, date: '2026-01-01' } } }, /prices\.overrides p\.json: models\["x"\]\.cache_read_mtok: must not be above input_mtok \(25 > 2\.5\)/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2, date: '2026-01-01', input_mtoks: 1 } } }, /prices\.overrides p\.json: models\["x"\]\.input_mtoks: unknown field/);
  bad({ models: { x: { input_mtok: 1, output_mtok: 2, date: '2026-01-01', source: 7 } } }, /\.source: must be a string/);
  bad({ models: [] }, /^prices\.overrides p\.json: models: must be an object/);
  bad({ model: {} }, /^prices\.overrides p\.json: model: unknown field \(expected models\)$/);
  bad([], /^prices\.overrides p\.json: the file: must be an object/);
  t.throws(() => parsePriceOverrides([], 'p.json'), PriceOverridesError);
});

t.test('override file: unreadable or invalid JSON are named errors', async (t) => {
  const dir = t.testdir({ 'broken.json': '{ not json' });
  t.throws(() => PriceTable.load(join(dir, 'broken.json')), /prices\.overrides: .*broken\.json is not valid JSON/);
  t.throws(() => PriceTable.load(join(dir, 'missing.json')), /prices\.overrides: cannot read/);
});

t.test('a price is remembered for its minute of the wall clock; a clock stepped is looked up again (regression)', async (t) => {
  const wall = steppableWallClock(t);
  // A second into a minute, so that no minute ends between the lookups below.
  wall.step(60_000 - (Date.now() % 60_000) + 1_000);
  const table = PriceTable.load();
  // What the lookups found anew rather than remembered.
  const inner = table as unknown as { find: (...args: unknown[]) => unknown };
  const find = inner.find.bind(table);
  let found = 0;
  inner.find = (...args) => {
    found++;
    return find(...args);
  };
  table.lookup('gpt-4o');
  table.lookup('gpt-4o');
  t.equal(found, 1, 'the second lookup is remembered');
  // A remembered price is kept only within its minute: a clock stepped back an hour once kept one
  // for an hour; now it is another minute, priced as that minute prices it.
  wall.step(-HOUR_MS);
  table.lookup('gpt-4o');
  t.equal(found, 2, 'looked up again at the time the clock says');
  table.lookup('gpt-4o');
  t.equal(found, 2, 'and remembered for that minute');
});

t.test('overrides: audio rates are read, and checked like the others', async (t) => {
  const prices = parsePriceOverrides({ models: { 'my-audio': { input_mtok: 2.5, output_mtok: 10, input_audio_mtok: 40, output_audio_mtok: 80, date: '2026-11-01' } } }, 'prices.json');
  t.match(prices.get('my-audio'), { inputAudioMtok: 40, outputAudioMtok: 80 });
  t.throws(() => parsePriceOverrides({ models: { m: { input_mtok: 1, output_mtok: 1, input_audio_mtok: -1, date: '2026-11-01' } } }, 'prices.json'), /prices\.json: models\["m"\]\.input_audio_mtok: must be a non-negative number/);
});

// An outside audit: a price was remembered for a minute from whenever it was asked, so DeepSeek's
// turns were billed at the peak rate for up to a minute after its off-peak hours began at 16:30
// UTC (twice the rate), and at the off-peak rate for up to a minute after they ended.
t.test('a time-of-day price changes on its minute, not up to a minute later', async (t) => {
  const table = new PriceTable();
  const realNow = Date.now;
  t.teardown(() => {
    Date.now = realNow;
  });
  const rates = (iso: string) => {
    Date.now = () => Date.parse(iso);
    const p = table.lookup('deepseek-chat')!;
    return [p.inputMtok, p.outputMtok];
  };
  t.same(rates('2026-11-30T16:29:50Z'), [0.27, 1.1], 'peak');
  t.same(rates('2026-11-30T16:29:59.999Z'), [0.27, 1.1], 'still peak');
  t.same(rates('2026-11-30T16:30:00Z'), [0.135, 0.55], 'off-peak from 16:30');
  t.same(rates('2026-12-01T00:29:59Z'), [0.135, 0.55]);
  t.same(rates('2026-12-01T00:30:00Z'), [0.27, 1.1], 'peak again from 00:30');
  t.same(rates('2026-11-30T16:30:10Z'), [0.135, 0.55], 'a clock stepped back is looked up again');
  Date.now = realNow;
  t.equal(table.lookup('deepseek-chat', { at: new Date('2026-11-30T16:29:30Z') })!.inputMtok, 0.27, 'a lookup at a given time: that time');
  t.equal(table.lookup('deepseek-chat', { at: new Date('2026-11-30T16:31:00Z') })!.inputMtok, 0.135);
});
