// A request refused with 402 at a money limit changes nothing in the ledger (SPEC §2.4, §7).
// Found by an outside audit: the refusal still created the run — starting its clock, so the first
// admitted request minutes later was sent as the final answer, reason=time, with its tools
// stripped — and claimed a conversation the operator had capped before its first request.

import t from 'tap';
import { ADMIN, ALICE, BOB, call, chat, moneyWorld, type ErrorBody } from './money-fixture.js';

const TOOLS = [{ type: 'function', function: { name: 'search', description: 'Search the documentation', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
const question = { model: 'gpt-4o', messages: [{ role: 'user', content: 'Which upstreams does Tollgate support?' }], tools: TOOLS, max_tokens: 50 };
const inR = { 'x-tollgate-conversation': 'R' };

t.test("a refusal does not start the run's clock: the first admitted request keeps its tools", async (t) => {
  const { gw, metered } = await moneyWorld(t, { clock: true, metered: { completionTokens: 3 } });

  // 1. A cap too small for any request, set before the conversation's first request.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/R/cap', ADMIN, { cap_usd: 1e-8 })).status, 200);
  const refused = await chat(gw, ALICE, question, inR);
  t.equal(refused.status, 402);
  t.equal((refused.body as unknown as ErrorBody).error.code, 'conversation_cap_reached');
  t.equal(metered.requests.length, 0);

  // 2. Past the run's time bound (300 s by default) the operator raises the cap.
  gw.now.ms += 301_000;
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/R/cap', ADMIN, { cap_usd: 10 })).status, 200);

  // 3. The same question again: it starts the run now, so it is forwarded as asked, tools and all.
  const admitted = await chat(gw, ALICE, question, inR);
  t.equal(admitted.status, 200);
  t.equal(admitted.headers.get('x-tollgate-notice'), null, 'not the final answer');
  t.equal(metered.requests.length, 1);
  t.ok(Array.isArray(metered.requests[0]!.body?.tools), 'the tools reached the provider');
});

t.test('a refusal does not claim a conversation capped before its first request', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 3 } });
  const small = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 };

  // 1. Bob's request is refused at the cap; the conversation stays nobody's.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/R/cap', ADMIN, { cap_usd: 1e-8 })).status, 200);
  t.equal((await chat(gw, BOB, small, inR)).status, 402);
  const spend = await call(gw.url, 'GET', '/admin/conversations/R/spend', ADMIN);
  t.match(spend.body, { tenant: null, cap_usd: 1e-8, turns: 0 });
  t.equal((await call(gw.url, 'GET', '/v1/conversations/R/spend', { authorization: `Bearer ${BOB}` })).status, 404, "not Bob's");

  // 2. With the cap raised, Alice's request is the first admitted one: the conversation is hers.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/R/cap', ADMIN, { cap_usd: 10 })).status, 200);
  t.equal((await chat(gw, ALICE, small, inR)).status, 200);
  t.equal(metered.requests.length, 1);
  t.equal((await call(gw.url, 'GET', '/v1/conversations/R/spend', { authorization: `Bearer ${ALICE}` })).status, 200);
});

t.test('a request the upstream refuses or fails is refunded in full and is no turn of its conversation', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 3 } });
  const small = { model: 'gpt-4o', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 };
  const inT = { 'x-tollgate-conversation': 'T' };
  const spend = async () => (await call(gw.url, 'GET', '/v1/conversations/T/spend', { authorization: `Bearer ${ALICE}` })).body as { turns: number; by_model: Record<string, unknown> };

  // 1. The provider refuses the request (bad input it checks and the gateway does not), then fails.
  metered.options.failWith = { status: 400, body: { error: { message: 'bad temperature', type: 'invalid_request_error', param: 'temperature', code: null } } };
  t.equal((await chat(gw, ALICE, small, inT)).status, 400);
  metered.options.failWith = { status: 503, body: { error: { message: 'overloaded', type: 'server_error', param: null, code: null } } };
  t.equal((await chat(gw, ALICE, small, inT)).status, 503);
  t.match(await spend(), { turns: 0, by_model: {} }, 'neither is a turn');

  // 2. An answered request is.
  delete metered.options.failWith;
  t.equal((await chat(gw, ALICE, small, inT)).status, 200);
  t.match(await spend(), { turns: 1, by_model: { 'gpt-4o': { turns: 1 } } });
});
