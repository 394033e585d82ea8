import t from 'tap';
import type { ModelPrice } from '../../pricing/model-price.js';
import { cheaperModels, candidatesFromUpstreams, meteredAllowanceUsd, type ModelCandidate } from '../../pricing/cheaper-models.js';

const p = (inputMtok: number, outputMtok: number): ModelPrice => ({
  model: 'x',
  inputMtok,
  cacheReadMtok: null,
  outputMtok,
  source: 'override:test',
  date: '2026-01-01',
});

const current = { model: 'big', price: p(5, 15) }; // blended $20/Mtok; a third is $6.67
const candidates: ModelCandidate[] = [
  { model: 'mid', upstream: 'openai', billing: 'metered', tools: true, price: p(3, 5) }, // $8: too dear
  { model: 'small-notools', upstream: 'openai', billing: 'metered', tools: false, price: p(0.5, 1.5) },
  { model: 'small', upstream: 'openai', billing: 'metered', tools: true, price: p(1, 4) }, // $5
  { model: 'unpriced', upstream: 'openai', billing: 'metered', tools: true, price: null },
  { model: 'sub', upstream: 'plan', billing: 'plan', tools: true, price: p(5, 15) },
  { model: 'llama-notools', upstream: 'home', billing: 'local', tools: false, price: null },
  { model: 'llama', upstream: 'home', billing: 'local', tools: true, price: null },
  { model: 'gpt-*', upstream: 'openai', billing: 'metered', tools: true, price: null },
  { model: 'big', upstream: 'openai', billing: 'metered', tools: true, price: p(5, 15) },
];

t.test('conversation cap, tools offered: local, plan, then cheap metered; tool-capable first', async (t) => {
  const out = cheaperModels({ ...current, candidates, offersTools: true, scope: 'conversation', limitUsd: 2, audioOutput: false });
  t.same(out.map((c) => c.model), ['llama', 'llama-notools', 'sub', 'small', 'small-notools']);
  t.same(out[0], { model: 'llama', billing: 'local', upstream: 'home', tools: true }, 'no allowance on free choices');
  t.equal(out[3]!.allowance_usd, 0.5, 'a quarter of $2 is under the $0.50 floor');
});

t.test('no tools offered: within a group, configuration order (metered: cheapest first)', async (t) => {
  const out = cheaperModels({ ...current, candidates, offersTools: false, scope: 'conversation', limitUsd: 10, audioOutput: false });
  t.same(out.map((c) => c.model), ['llama-notools', 'llama', 'sub', 'small-notools', 'small']);
  t.equal(out[3]!.allowance_usd, 2.5, 'a quarter of $10');
});

t.test('monthly budget and parent cap: never a metered choice', async (t) => {
  for (const scope of ['monthly', 'parent'] as const) {
    const out = cheaperModels({ ...current, candidates, offersTools: true, scope, limitUsd: 50, audioOutput: false });
    t.same(out.map((c) => c.billing), ['local', 'local', 'plan'], scope);
  }
});

t.test('an unpriced current model: no metered comparison is possible', async (t) => {
  const out = cheaperModels({ model: 'big', price: null, candidates, offersTools: true, scope: 'conversation', limitUsd: 2, audioOutput: false });
  t.notOk(out.some((c) => c.billing === 'metered'));
});

t.test('exactly a third qualifies, a hair more does not', async (t) => {
  const cands: ModelCandidate[] = [
    { model: 'third', upstream: 'u', billing: 'metered', tools: true, price: p(1, 1) }, // 2 = 6/3
    { model: 'over', upstream: 'u', billing: 'metered', tools: true, price: p(1, 1.01) },
  ];
  const out = cheaperModels({ model: 'cur', price: p(3, 3), candidates: cands, offersTools: false, scope: 'conversation', limitUsd: 4, audioOutput: false });
  t.same(out.map((c) => c.model), ['third']);
  t.equal(out[0]!.allowance_usd, 1);
});

t.test('allowance: a quarter of the cap, whole cents, at least $0.50', async (t) => {
  t.equal(meteredAllowanceUsd(1), 0.5);
  t.equal(meteredAllowanceUsd(2.07), 0.52);
  t.equal(meteredAllowanceUsd(100), 25);
});

t.test('candidates from upstreams: exact names, first upstream wins, router has the last word', async (t) => {
  const upstreams = [
    { name: 'home', models: ['llama', 'qwen*'], billing: 'local' as const, tools: false },
    { name: 'openai', models: ['gpt-*', 'gpt-4o-mini', 'llama'], billing: 'metered' as const, tools: true },
  ];
  const priceOf = (m: string) => (m === 'gpt-4o-mini' ? p(0.15, 0.6) : null);
  const all = candidatesFromUpstreams(upstreams, priceOf);
  t.same(all.map((c) => `${c.upstream}:${c.model}`), ['home:llama', 'openai:gpt-4o-mini']);
  t.same(all[1]!.price, p(0.15, 0.6));
  // The router sends gpt-4o-mini elsewhere (say a catch-all listed first): not a working choice here.
  const routed = candidatesFromUpstreams(upstreams, priceOf, (m) => (m === 'llama' ? 'home' : 'somewhere-else'));
  t.same(routed.map((c) => c.model), ['llama']);
});

// An outside audit: an embeddings request past its cap was offered chat models, and a chat request
// may be offered an embedding model (the cheapest names configured): neither can serve the other.
t.test('an embeddings request is offered embedding models alone; a chat request none', async (t) => {
  const cands: ModelCandidate[] = [
    { model: 'text-embedding-3-small', upstream: 'openai', billing: 'metered', tools: false, price: p(0.02, 0) },
    { model: 'nomic-embed-text', upstream: 'home', billing: 'local', tools: false, price: null },
    { model: 'llama', upstream: 'home', billing: 'local', tools: true, price: null },
    { model: 'small', upstream: 'openai', billing: 'metered', tools: true, price: p(0.1, 0.1) },
  ];
  const chat = cheaperModels({ model: 'big', price: p(5, 15), candidates: cands, offersTools: false, scope: 'conversation', limitUsd: 2, audioOutput: false });
  t.same(chat.map((c) => c.model), ['llama', 'small']);
  const embeddings = cheaperModels({ model: 'text-embedding-3-large', price: p(0.13, 0), candidates: cands, offersTools: false, scope: 'conversation', limitUsd: 2, embeddings: true, audioOutput: false });
  t.same(embeddings.map((c) => c.model), ['nomic-embed-text', 'text-embedding-3-small']);
});

// A review: gpt-audio-mini's text is a fifth of gpt-4o's price, its audio output twice gpt-4o's
// output: admission reserves the audio rate, so it was offered as cheaper and then reserved more.
t.test('for a request that asks for audio, a model whose audio output is dear is not offered as cheaper', async (t) => {
  const cands: ModelCandidate[] = [{ model: 'audio-mini', upstream: 'openai', billing: 'metered', tools: true, price: { ...p(0.6, 2.4), outputAudioMtok: 20 } }];
  const ask = { model: 'big', price: p(2.5, 10), offersTools: false, scope: 'conversation' as const, limitUsd: 1 };
  t.same(cheaperModels({ ...ask, candidates: cands, audioOutput: true }), []);
  t.same(cheaperModels({ ...ask, candidates: [{ ...cands[0]!, price: p(0.6, 2.4) }], audioOutput: true }).map((c) => c.model), ['audio-mini'], 'without its audio rate it would be');
  t.same(cheaperModels({ ...ask, candidates: cands, audioOutput: false }).map((c) => c.model), ['audio-mini'], 'for a request in text, it is: admission reserves its text rate');
});
