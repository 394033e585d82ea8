// A money refusal seen through the official openai SDK (SPEC §6): with its default two retries,
// the 402 surfaces as an APIError carrying the envelope and is never retried.

import t, { type Test } from 'tap';
import OpenAI, { APIError } from 'openai';
import { ADMIN, ALICE, call, moneyWorld } from './money-fixture.js';

function countingClient(url: string, conversation: string) {
  const calls: string[] = [];
  const client = new OpenAI({
    baseURL: `${url}/v1`,
    apiKey: ALICE,
    defaultHeaders: { 'x-tollgate-conversation': conversation },
    fetch: (input, init) => {
      calls.push(String(input));
      return fetch(input, init);
    },
  });
  return { client, calls };
}

async function refusal(t: Test, p: Promise<unknown>): Promise<APIError> {
  try {
    await p;
  } catch (err) {
    t.ok(err instanceof APIError, 'an APIError');
    return err as APIError;
  }
  throw new Error('the request was not refused');
}

t.test('a cap refusal reaches the SDK as a 402 APIError, sent once', async (t) => {
  const { gw, metered } = await moneyWorld(t);
  const { client, calls } = countingClient(gw.url, 'sdk-capped');
  t.equal(client.maxRetries, 2, 'the SDK keeps its default retries');

  // 1. A normal turn goes through.
  const ok = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hi' }], max_tokens: 10 });
  t.equal(ok.choices[0].message.content, ' hi'.repeat(8));
  t.equal(calls.length, 1);

  // 2. A cap of a tenth of a cent; the next request's worst case is far past it.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/sdk-capped/cap', ADMIN, { cap_usd: 0.001 })).status, 200);
  const err = await refusal(
    t,
    client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], max_tokens: 1000 }),
  );
  t.equal(err.status, 402);
  t.equal(err.code, 'conversation_cap_reached');
  t.equal(err.type, 'insufficient_quota');
  t.equal(err.headers?.get('x-should-retry'), 'false');
  const envelope = err.error as { limit_usd: number; needed_usd: number; limit_to_admit_usd: number; choices: { raise_to_usd: number; stop: boolean; cheaper_models: Array<{ model: string }> } };
  t.equal(envelope.limit_usd, 0.001);
  t.ok(envelope.needed_usd > 0.001);
  t.match(err.message, /more than the whole conversation cap/);
  t.equal(envelope.choices.stop, true);
  t.equal(envelope.choices.cheaper_models[0].model, 'llama-local');
  // SPEC §6: twice the cap, up to the lowest rung (a cent); what would admit this request is given apart.
  t.equal(envelope.choices.raise_to_usd, 0.01, 'twice $0.001, rounded up to a cent');
  t.ok(envelope.limit_to_admit_usd >= envelope.needed_usd, 'the limit that would admit this request');

  // 3. Sent once: the gateway got one call for it, the provider none.
  t.equal(calls.length, 2);
  t.equal(metered.requests.length, 1);
});

t.test('model_not_priced reaches the SDK as a 402 APIError, sent once', async (t) => {
  const { gw, metered } = await moneyWorld(t);
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/alice/budget', ADMIN, { monthly_budget_usd: 10 })).status, 200);
  const { client, calls } = countingClient(gw.url, 'sdk-unpriced');
  const err = await refusal(t, client.chat.completions.create({ model: 'gpt-unpriced-x', messages: [{ role: 'user', content: 'hi' }] }));
  t.equal(err.status, 402);
  t.equal(err.code, 'model_not_priced');
  t.equal(err.param, 'model');
  t.equal(calls.length, 1);
  t.equal(metered.requests.length, 0);
});
