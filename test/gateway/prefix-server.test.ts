// A conversation's prefix is credited only on the server that read it (SPEC §4, ADR 0004). A
// gateway restarted with its upstream pointed at another server, with the model moved to another
// upstream, or with the upstream's kind changed charges the next turn in full; a restart that keeps
// the server — renamed or not — keeps the credit, and so does a head an older build wrote (no
// server recorded). Regression: an audit saw 1,523 of 1,562 prompt tokens credited after a
// restart onto a new llama.cpp server whose own timings said cache_n 0. Every store.

import t, { type Test } from 'tap';
import { Registry } from 'prom-client';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import type { Ledger } from '../../metering/ledger.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { llamaUpstream, openaiUpstream } from '../helpers/gateway.js';
import { storeFactories, type StoreFactory } from '../helpers/stores.js';

type Json = Record<string, unknown>;

interface Served {
  url: string;
  close(): Promise<void>;
}

/** A gateway on a ledger that outlives it, as the ledger file outlives the process. */
async function serve(t: Test, ledger: Ledger, upstreams: Json[]): Promise<Served> {
  const config = parseConfig({ logging: { level: 'silent' }, upstreams }, {});
  const app = await buildApp({ config, registry: new Registry(), env: { DOUBLE_KEY: 'sk-double' }, ledger });
  t.teardown(() => app.close());
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  return { url: `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`, close: () => app.close() };
}

const CONVERSATION = 'c-moved';

async function send(gw: Served, body: Json) {
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-tollgate-conversation': CONVERSATION },
    body: JSON.stringify(body),
  });
  await res.text();
  return { status: res.status, shared: Number(res.headers.get('x-tollgate-shared-prefix-tokens')), reserved: Number(res.headers.get('x-tollgate-reserved-tokens')) };
}

/** What /v1/admission predicts for `body`: the shared prefix and the prompt charge. */
async function predict(gw: Served, body: Json) {
  const res = await fetch(`${gw.url}/v1/admission`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-tollgate-conversation': CONVERSATION },
    body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }),
  });
  const plan = (await res.json()) as { shared_prefix_tokens: number; charge: { prompt: number } };
  return { shared: plan.shared_prefix_tokens, prompt: plan.charge.prompt };
}

const system = { role: 'system', content: 'You are a careful research assistant. Cite your sources, and say when you are unsure. '.repeat(8) };
const turns = (model: string) => {
  const one = { model, max_tokens: 20, messages: [system, { role: 'user', content: 'What is the capital of France? '.repeat(6) }] };
  const two = { ...one, messages: [...one.messages, { role: 'assistant', content: 'Paris.' }, { role: 'user', content: 'And of Spain?' }] };
  const three = { ...one, messages: [...two.messages, { role: 'assistant', content: 'Madrid.' }, { role: 'user', content: 'And of Italy?' }] };
  const four = { ...one, messages: [...three.messages, { role: 'assistant', content: 'Rome.' }, { role: 'user', content: 'Thank you.' }] };
  return { one, two, three, four };
};

/**
 * Two turns on a gateway configured with `before`, a restart on the same ledger (a new connection,
 * as a new process) configured with `after`, then the admission prediction and two more turns.
 */
async function acrossRestart(t: Test, factory: StoreFactory, before: Json[], after: Json[], model = 'gpt-4o', beforeRestart?: (ledger: Ledger) => Promise<void>) {
  const store = await factory.create(t);
  const body = turns(model);
  // 1. Two turns before the restart: the second shares the first's prefix.
  const first = await serve(t, store.ledger, before);
  t.equal((await send(first, body.one)).status, 200);
  const two = await send(first, body.two);
  t.equal(two.status, 200);
  t.ok(two.shared > 16, `before the restart, turn two shared ${two.shared} tokens`);
  await first.close();
  await beforeRestart?.(store.ledger);
  // 2. The restart: what admission predicts is what the request is charged.
  const second = await serve(t, await store.reopen(), after);
  const predicted = await predict(second, body.three);
  const three = await send(second, body.three);
  t.equal(three.status, 200);
  t.equal(predicted.shared, three.shared, '/v1/admission predicts the same shared prefix');
  t.equal(predicted.prompt, three.reserved - 20, '/v1/admission predicts the same prompt charge');
  // 3. The turn after: the server serving now has read turn three.
  const four = await send(second, body.four);
  t.ok(four.shared > 16, `the turn after the restart shares again (${four.shared} tokens)`);
  return { three };
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a restart that keeps the server keeps the credit`, async (t) => {
    const up = await startOpenAiDouble({ completionTokens: 3 });
    t.teardown(up.close);
    const { three } = await acrossRestart(t, factory, [openaiUpstream(up.url)], [openaiUpstream(up.url)]);
    t.ok(three.shared > 16, `shared ${three.shared} tokens`);
  });

  t.test(`${factory.kind}: a renamed upstream on the same server keeps the credit (the name is not the server)`, async (t) => {
    const up = await startOpenAiDouble({ completionTokens: 3 });
    t.teardown(up.close);
    // The same server written another way: a trailing slash is the same base URL.
    const { three } = await acrossRestart(t, factory, [openaiUpstream(up.url)], [openaiUpstream(up.url, { name: 'primary', baseUrl: `${up.url}/v1/` })]);
    t.ok(three.shared > 16, `shared ${three.shared} tokens`);
  });

  t.test(`${factory.kind}: an upstream pointed at another server shares nothing after the restart`, async (t) => {
    const a = await startOpenAiDouble({ completionTokens: 3 });
    const b = await startOpenAiDouble({ completionTokens: 3 });
    t.teardown(a.close);
    t.teardown(b.close);
    const { three } = await acrossRestart(t, factory, [openaiUpstream(a.url)], [openaiUpstream(b.url)]);
    t.equal(three.shared, 0, 'charged in full: the new server has nothing cached');
    t.equal(b.requests.length, 2, 'the second server served the turns after the restart');
  });

  t.test(`${factory.kind}: a model moved to another upstream shares nothing after the restart`, async (t) => {
    const a = await startOpenAiDouble({ completionTokens: 3 });
    const b = await startOpenAiDouble({ completionTokens: 3 });
    t.teardown(a.close);
    t.teardown(b.close);
    const other = (models: string[]) => openaiUpstream(b.url, { name: 'other', models });
    const { three } = await acrossRestart(
      t,
      factory,
      [openaiUpstream(a.url), other(['claude-*'])],
      [openaiUpstream(a.url), other(['gpt-4o', 'claude-*'])],
    );
    t.equal(three.shared, 0, 'the same model name on another server: charged in full');
    t.equal(b.requests.length, 2);
  });

  t.test(`${factory.kind}: an upstream whose kind changed shares nothing after the restart`, async (t) => {
    const llama = await startLlamaCppDouble();
    t.teardown(llama.close);
    // The same URL, read as an OpenAI-compatible server: another server as far as the cache goes.
    const { three } = await acrossRestart(t, factory, [llamaUpstream(llama.url)], [llamaUpstream(llama.url, { kind: 'openai' })], 'tiny');
    t.equal(three.shared, 0);
  });

  t.test(`${factory.kind}: a head an older build wrote (no server recorded) is still credited`, async (t) => {
    const up = await startOpenAiDouble({ completionTokens: 3 });
    t.teardown(up.close);
    const { three } = await acrossRestart(t, factory, [openaiUpstream(up.url)], [openaiUpstream(up.url)], 'gpt-4o', async (ledger) => {
      const head = await ledger.getHead(CONVERSATION);
      t.type(head?.serverId, 'string', 'this build records the server');
      await ledger.putHead({ ...head!, serverId: null });
    });
    t.ok(three.shared > 16, `an upgrade costs no full charge: shared ${three.shared} tokens`);
  });
}
