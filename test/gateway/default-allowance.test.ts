// The allowance of a request that names none (SPEC §11: `defaults.maxTokens`), and an upstream's own
// (`upstreams[].maxTokens`): reasoning models count their hidden reasoning against it, and 4,096 left
// an o-series answer empty — its whole allowance spent reasoning, `finish_reason: "length"`.
import t from 'tap';
import { Writable } from 'node:stream';
import { startOpenAiDouble } from '../doubles/openai.js';
import { openaiUpstream, startGateway } from '../helpers/gateway.js';

type Json = Record<string, unknown>;

t.test("an upstream's maxTokens is the allowance of its requests that name none; the others keep defaults.maxTokens", async (t) => {
  const openai = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(openai.close);
  let output = '';
  const logStream = new Writable({
    write(chunk: Buffer, _enc, done) {
      output += chunk.toString('utf8');
      done();
    },
  });
  const gw = await startGateway(
    t,
    {
      upstreams: [
        openaiUpstream(openai.url, { name: 'reasoning', models: ['o3*', 'gpt-5*'], maxTokens: 32768, billing: 'local' }),
        openaiUpstream(openai.url, { name: 'chat', models: ['gpt-*'], billing: 'local' }),
      ],
      auth: { keys: [{ key: 'tg-small', tenant: 'acme', runs: { tokenBudget: 20000 } }, { key: 'tg-big', tenant: 'acme' }] },
      logging: { level: 'warn' },
    },
    { logStream },
  );
  const chat = (model: string, key: string, extra: Json = {}) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${key}` },
      body: JSON.stringify({ model, messages: [{ role: 'user', content: `Prove it (${model})` }], ...extra }),
    });
  const sent = () => openai.requests.at(-1)!.body as Json;

  const reasoning = await chat('o3-mini', 'tg-big');
  t.equal(reasoning.status, 200);
  t.equal(sent().max_completion_tokens ?? sent().max_tokens, 32768, "sent upstream as the request's allowance");
  t.ok(Number(reasoning.headers.get('x-tollgate-reserved-tokens')) > 32768, 'and reserved, with the prompt');
  const plain = await chat('gpt-4o', 'tg-big');
  t.equal(plain.status, 200);
  t.equal(sent().max_completion_tokens ?? sent().max_tokens, 4096, 'another upstream keeps defaults.maxTokens');
  const named = await chat('gpt-5', 'tg-big', { max_completion_tokens: 100 });
  t.equal(named.status, 200);
  t.equal(sent().max_completion_tokens, 100, 'a request that names its allowance keeps it');

  // Under a run budget below it, a refusal names the setting the allowance came from.
  const before = openai.requests.length;
  const refused = await chat('o3-mini', 'tg-small');
  t.equal(refused.status, 402);
  t.match(((await refused.json()) as { error: { message: string } }).error.message, /max output 32768: upstream "reasoning" maxTokens 32768, as the request named no max_tokens\)/);
  t.equal(openai.requests.length, before, 'nothing sent');
  t.equal((await chat('gpt-4o', 'tg-small')).status, 200, 'the default allowance fits that budget');

  // The start warns of a run budget below an upstream's maxTokens, by where each is set.
  const lines = output.trim().split('\n').filter(Boolean).map((l) => JSON.parse(l) as Json);
  t.match(lines.find((l) => String(l.msg).startsWith('auth.keys[0].runs.tokenBudget is below upstreams[0].maxTokens')), { 'auth.keys[0].runs.tokenBudget': 20000, 'upstreams[0].maxTokens': 32768 });
  t.notOk(lines.some((l) => String(l.msg).includes('below defaults.maxTokens')), 'defaults.maxTokens (4096) is within every budget');
});

t.test('a token 402 names the largest max_tokens that fits what the run has left, and that figure is exact', async (t) => {
  const openai = await startOpenAiDouble({ completionTokens: 100 });
  t.teardown(openai.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(openai.url, { billing: 'local' })], runs: { tokenBudget: 400, answerReserveTokens: 0 } });
  const headers = { 'content-type': 'application/json', 'x-tollgate-conversation': 'near-the-end' };
  const messages = [{ role: 'user', content: 'Summarise what we found about the proxy timeouts.' }];
  const chat = (extra: Json) => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify({ model: 'gpt-4o', messages, ...extra }) });
  const admits = async (extra: Json) => {
    const res = await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o', messages, ...extra } }) });
    return ((await res.json()) as { verdict: { admit: boolean } }).verdict.admit;
  };
  t.equal((await chat({ max_tokens: 100 })).status, 200, 'the first request spends part of the run');

  // The same run asks again, naming no allowance: the default (4,096) does not fit what is left.
  const refused = await chat({});
  t.equal(refused.status, 402);
  const error = ((await refused.json()) as { error: { message: string; remaining: number; prompt_tokens: number } }).error;
  const most = error.remaining - error.prompt_tokens;
  t.ok(most > 1, `some room is left (${most})`);
  t.ok(error.message.endsWith(`; max_tokens ${most} or less would fit what the run has left`), error.message);
  t.ok(await admits({ max_tokens: most }), 'the named figure is admitted');
  t.notOk(await admits({ max_tokens: most + 1 }), 'one more is not');
  t.equal((await chat({ max_tokens: most })).status, 200);

  // When not one token fits, no figure is offered.
  const full = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'word '.repeat(500) }], max_tokens: 10 }) });
  t.equal(full.status, 402);
  t.notMatch(((await full.json()) as { error: { message: string } }).error.message, /would fit/);
});
