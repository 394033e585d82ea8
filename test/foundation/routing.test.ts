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

t.test('the server behind an upstream: its kind and base URL as requests use it, never its name (ADR 0004)', async (t) => {
  const serverOf = (u: { name: string; kind: string; baseUrl: string }) => {
    const agent = new MockAgent();
    t.teardown(() => agent.close());
    const config = parseConfig({ upstreams: [{ ...u, models: ['*'], billing: 'local' }] }, {});
    return new UpstreamRegistry(config, {}, () => agent).list[0]!.serverId;
  };
  const base = serverOf({ name: 'local', kind: 'llamacpp', baseUrl: 'http://10.0.0.5:8080' });
  t.match(base, /^[A-Za-z0-9_-]{16}$/, 'a short digest');
  t.equal(serverOf({ name: 'renamed', kind: 'llamacpp', baseUrl: 'http://10.0.0.5:8080' }), base, 'renamed: the same server');
  t.equal(serverOf({ name: 'local', kind: 'llamacpp', baseUrl: 'http://10.0.0.5:8080/' }), base, 'a trailing slash: the same URL');
  t.equal(serverOf({ name: 'local', kind: 'openai', baseUrl: 'HTTP://example.COM:80/v1' }), serverOf({ name: 'x', kind: 'openai', baseUrl: 'http://example.com/v1' }), 'scheme and host case, default port');
  t.not(serverOf({ name: 'local', kind: 'llamacpp', baseUrl: 'http://10.0.0.6:8080' }), base, 'another host');
  t.not(serverOf({ name: 'local', kind: 'llamacpp', baseUrl: 'http://10.0.0.5:8081' }), base, 'another port');
  t.not(serverOf({ name: 'local', kind: 'openai', baseUrl: 'http://10.0.0.5:8080' }), base, 'another kind');
  t.not(serverOf({ name: 'local', kind: 'openai', baseUrl: 'http://10.0.0.5:8080/v1' }), serverOf({ name: 'local', kind: 'openai', baseUrl: 'http://10.0.0.5:8080/v2' }), 'another path');
});
