// A conversation adds up what it spent (SPEC §7, §11): money, what the cache saved, turns on a plan,
// and `tasks_usd` — what child conversations (`x-tollgate-parent`) spent on its behalf. Only the
// tenant that owns a conversation can see it.

import t from 'tap';
import { ADMIN, ALICE, BOB, call, chat, close, costHeader, listUsd, moneyWorld } from './money-fixture.js';

interface SpendView {
  conversation: string;
  spent_usd: number;
  saved_usd: number;
  plan_turns: number;
  tasks_usd: number;
  turns: number;
  cap_usd: number | null;
  by_model: Record<string, { turns: number; spent_usd: number }>;
}

const turn = (model: string) => ({ model, messages: [{ role: 'user', content: 'Do one step of the task' }], max_tokens: 50 });

t.test('spend adds up across a parent and its child, by model, for its owner only', async (t) => {
  // Every metered turn: 1000 prompt tokens of which 200 cached, 8 generated.
  const { gw, metered } = await moneyWorld(t, { metered: { promptTokens: () => 1000, cachedTokens: 200, completionTokens: 8 } });
  const parent = { 'x-tollgate-conversation': 'main' };
  const child = { 'x-tollgate-conversation': 'research-1', 'x-tollgate-parent': 'main' };

  // 1. The parent: two metered turns, one on this machine, one on a plan.
  const costs: number[] = [];
  for (const model of ['gpt-4o', 'llama-local', 'gpt-4o', 'plan-model']) {
    const r = await chat(gw, ALICE, turn(model), parent);
    t.equal(r.status, 200, model);
    costs.push(costHeader(r) ?? -1);
  }
  const dear = listUsd('gpt-4o', 1000, 200, 8); // 0.08 + 0.002 + 0.0032
  t.ok(close(dear, 0.0852));
  // A plan turn spends no money, even without a list price: its header says 0.
  t.same(costs, [0.0852, 0, 0.0852, 0]);

  // 2. The child: one cheap turn and one dear one, each counted in the child and in the parent.
  const cheap = listUsd('gpt-4o-mini', 1000, 200, 8); // 0.0008 + 0.0001 + 0.000016
  for (const model of ['gpt-4o-mini', 'gpt-4o']) t.equal((await chat(gw, ALICE, turn(model), child)).status, 200);
  t.equal(metered.requests.length, 4);

  const parentSpend = await call(gw.url, 'GET', '/v1/conversations/main/spend', { authorization: `Bearer ${ALICE}` });
  t.equal(parentSpend.status, 200);
  const p = parentSpend.body as unknown as SpendView;
  t.equal(p.conversation, 'main');
  t.ok(close(p.spent_usd, 2 * dear), `parent spent ${p.spent_usd}`);
  // 200 cached tokens × ($100 − $10)/M per metered turn
  t.ok(close(p.saved_usd, 2 * 0.018), `parent saved ${p.saved_usd}`);
  t.equal(p.plan_turns, 1);
  t.ok(close(p.tasks_usd, cheap + dear), `tasks ${p.tasks_usd}`);
  t.equal(p.turns, 4);
  t.equal(p.cap_usd, null);
  t.same(Object.keys(p.by_model).sort(), ['gpt-4o', 'llama-local', 'plan-model']);
  t.equal(p.by_model['gpt-4o'].turns, 2);
  t.ok(close(p.by_model['gpt-4o'].spent_usd, 2 * dear));
  t.same(p.by_model['llama-local'], { turns: 1, spent_usd: 0 });
  t.same(p.by_model['plan-model'], { turns: 1, spent_usd: 0 });

  const childSpend = (await call(gw.url, 'GET', '/v1/conversations/research-1/spend', { authorization: `Bearer ${ALICE}` })).body as unknown as SpendView;
  t.ok(close(childSpend.spent_usd, cheap + dear));
  t.equal(childSpend.tasks_usd, 0);
  t.equal(childSpend.turns, 2);
  t.equal(childSpend.plan_turns, 0);
  t.same(Object.keys(childSpend.by_model).sort(), ['gpt-4o', 'gpt-4o-mini']);

  // 3. The month counts each dollar once: a child's turn is not billed again through its parent.
  const month = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.ok(close(month.body.spent_usd as number, 3 * dear + cheap), `month ${String(month.body.spent_usd)}`);

  // 4. Another tenant's key: the conversation does not exist for it.
  for (const id of ['main', 'research-1']) {
    const other = await call(gw.url, 'GET', `/v1/conversations/${id}/spend`, { authorization: `Bearer ${BOB}` });
    t.equal(other.status, 404);
    t.match(other.body, { error: { code: 'not_found', type: 'not_found_error' } });
    t.notMatch(JSON.stringify(other.body), /spent_usd/);
  }
  // …and an unknown conversation looks the same to its would-be owner.
  t.equal((await call(gw.url, 'GET', '/v1/conversations/nope/spend', { authorization: `Bearer ${ALICE}` })).status, 404);
});

t.test('a parent named after the first holds nothing: no conversation is made for it, on every store', async (t) => {
  const { gw } = await moneyWorld(t);
  t.equal((await chat(gw, ALICE, turn('llama-local'), { 'x-tollgate-conversation': 'k-0', 'x-tollgate-parent': 'p-1' })).status, 200);
  // The first parent stays the conversation's parent; the one named now is no part of it.
  t.equal((await chat(gw, ALICE, turn('llama-local'), { 'x-tollgate-conversation': 'k-0', 'x-tollgate-parent': 'p-other' })).status, 200);
  t.equal((await call(gw.url, 'GET', '/v1/conversations/p-other/spend', { authorization: `Bearer ${ALICE}` })).status, 404, 'p-other was never made');
  t.equal((await call(gw.url, 'GET', '/v1/conversations/p-1/spend', { authorization: `Bearer ${ALICE}` })).status, 200);
  // So another tenant can still use the name.
  t.equal((await chat(gw, BOB, turn('llama-local'), { 'x-tollgate-conversation': 'p-other' })).status, 200);
});

// Regression: a sub-agent forked from its parent's messages, with no conversation id of its own,
// was inferred into the parent's own conversation — no child link, and the parent, its head moved,
// began a new conversation and run at its next turn.
t.test("a sub-agent that names its parent and resends the parent's messages is the parent's child, not the parent", async (t) => {
  const { gw } = await moneyWorld(t);
  const first = await chat(gw, ALICE, turn('llama-local'));
  const parent = first.headers.get('x-tollgate-conversation')!;
  const asked = turn('llama-local').messages;
  const reply = { role: 'assistant', content: (first.body.choices as Array<{ message: { content: string } }>)[0]!.message.content };
  const fork = { ...turn('llama-local'), messages: [...asked, reply, { role: 'user', content: 'Sub-task: look up the second source.' }] };
  const child = await chat(gw, ALICE, fork, { 'x-tollgate-parent': parent });
  t.equal(child.status, 200);
  const childId = child.headers.get('x-tollgate-conversation')!;
  t.not(childId, parent, 'a conversation of its own');
  const next = { ...turn('llama-local'), messages: [...asked, reply, { role: 'user', content: 'Now the main question, step two.' }] };
  const again = await chat(gw, ALICE, next);
  t.equal(again.headers.get('x-tollgate-conversation'), parent, "the parent's next turn is still the parent's");
  // A level down: a grandchild names the child and resends the parent's latest messages.
  const grandchild = await chat(gw, ALICE, { ...next, messages: [...next.messages, { role: 'assistant', content: 'on it' }, { role: 'user', content: 'Sub-sub-task.' }] }, { 'x-tollgate-parent': childId });
  const grandchildId = grandchild.headers.get('x-tollgate-conversation')!;
  t.not(grandchildId, parent, "not the grandparent's conversation");
  t.not(grandchildId, childId);
  // And the child, going on without its id, is still the child.
  const childNext = await chat(gw, ALICE, { ...fork, messages: [...fork.messages, { role: 'assistant', content: 'found it' }, { role: 'user', content: 'Next source.' }] }, { 'x-tollgate-parent': parent });
  t.equal(childNext.headers.get('x-tollgate-conversation'), childId);
});
