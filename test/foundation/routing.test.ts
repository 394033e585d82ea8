// Which upstream a model goes to (server/upstreams.ts): configuration only, the most specific
// entry first — SPEC §8's example puts a catch-all `*` llama.cpp upstream before `gpt-*` on OpenAI,
// and `gpt-*` must still reach OpenAI.

import t from 'tap';
import { UpstreamRegistry } from '../../server/upstreams.js';
import { parseConfig } from '../../server/config.js';
import { MockAgent } from 'undici';

function registry(upstreams: Array<{ name: string; models: string[] }>) {
  const config = parseConfig(
    {
      upstreams: upstreams.map((u) => ({ name: u.name, kind: 'openai', baseUrl: `http://127.0.0.1:9/${u.name}`, models: u.models, billing: 'local' })),
    },
    {},
  );
  const agent = new MockAgent();
  const r = new UpstreamRegistry(config, {}, () => agent);
  t.teardown(() => agent.close());
  return (model: string) => r.route(model)?.name ?? null;
}

t.test("SPEC §8's example: a catch-all first does not take gpt-* from the upstream that names it", async (t) => {
  const route = registry([
    { name: 'local', models: ['*'] },
    { name: 'openai', models: ['gpt-*'] },
  ]);
  t.equal(route('gpt-4o-mini'), 'openai');
  t.equal(route('gpt-4o'), 'openai');
  t.equal(route('qwen2.5-7b-instruct'), 'local');
  t.equal(route('gpt'), 'local', '`gpt` does not match `gpt-*`');
});

t.test('exact names first, then the pattern with the most literal characters, then config order', async (t) => {
  const route = registry([
    { name: 'any', models: ['*'] },
    { name: 'broad', models: ['gpt-*'] },
    { name: 'narrow', models: ['gpt-4o*'] },
    { name: 'pinned', models: ['gpt-4o-mini'] },
    { name: 'also-broad', models: ['gpt-?*'] },
  ]);
  t.equal(route('gpt-4o-mini'), 'pinned');
  t.equal(route('gpt-4o-2024-08-06'), 'narrow');
  t.equal(route('gpt-3.5-turbo'), 'broad', 'equal specificity: the earlier entry');
  t.equal(route('llama'), 'any');
});

t.test('no match: null (the route answers 404 model_not_found)', async (t) => {
  const route = registry([{ name: 'openai', models: ['gpt-*'] }]);
  t.equal(route('claude-3'), null);
});
