// Which tiktoken encodings are loaded at start (server/counters.ts `encodingsServed`): those of the
// model families and exact names that route to an OpenAI-kind upstream, and no others — loading
// o200k_base takes about half a second and 50 MB, so it is done once before serving, and only
// when a request could need it.

import t from 'tap';
import { MockAgent } from 'undici';
import { UpstreamRegistry } from '../../server/upstreams.js';
import { parseConfig } from '../../server/config.js';
import { encodingsServed } from '../../server/counters.js';

function served(upstreams: Array<{ kind: 'openai' | 'llamacpp'; models: string[] }>) {
  const config = parseConfig(
    { upstreams: upstreams.map((u, i) => ({ name: `u${i}`, kind: u.kind, baseUrl: `http://127.0.0.1:9/u${i}`, models: u.models })) },
    {},
  );
  const agent = new MockAgent();
  t.teardown(() => agent.close());
  return encodingsServed(new UpstreamRegistry(config, {}, () => agent)).sort();
}

t.test('an OpenAI upstream serving every model needs both encodings', async (t) => {
  t.same(served([{ kind: 'openai', models: ['*'] }]), ['cl100k_base', 'o200k_base']);
});

t.test('a pattern loads only the families it routes', async (t) => {
  t.same(served([{ kind: 'openai', models: ['gpt-4o*'] }]), ['o200k_base']);
  t.same(served([{ kind: 'openai', models: ['text-embedding-*'] }]), ['cl100k_base']);
  t.same(served([{ kind: 'openai', models: ['gpt-5*', 'o3*'] }]), ['o200k_base']);
});

t.test('an exact model name loads its own encoding', async (t) => {
  t.same(served([{ kind: 'openai', models: ['gpt-3.5-turbo'] }]), ['cl100k_base']);
  t.same(served([{ kind: 'openai', models: ['my-fine-tune'] }]), [], 'not an OpenAI family: the byte estimate, no tiktoken');
});

t.test('llama.cpp counts with its own tokenizer: nothing to load, even when it takes gpt-* names', async (t) => {
  t.same(served([{ kind: 'llamacpp', models: ['*'] }]), []);
  // Equal patterns go to the first upstream listed: gpt-4o* is llama.cpp's, so only gpt-3.5 counts with tiktoken.
  t.same(
    served([
      { kind: 'llamacpp', models: ['gpt-4o*'] },
      { kind: 'openai', models: ['gpt-4o*', 'gpt-3.5*'] },
    ]),
    ['cl100k_base'],
  );
});
