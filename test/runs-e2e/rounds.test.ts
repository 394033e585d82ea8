// Research runs end after `runs.maxToolRounds` tool rounds with a real answer (SPEC §5, §11):
// the request after the N-th round reaches the model with no tools offered and the added
// final-answer instruction, and the client is told why with `x-tollgate-notice`.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { FINAL_ANSWER_INSTRUCTION } from '../../metering/runs/final-answer.js';
import { client, runAgent, chatRequests, lastMessage, searchWhileOffered } from './agent-loop.js';

for (const stream of [false, true]) {
  // Non-streamed: the conversation is inferred from the growing message list; streamed: named.
  const how = stream ? 'streamed, conversation named by header' : 'non-streamed, conversation inferred';
  t.test(`maxToolRounds 2 → the third request is the final answer (${how})`, async (t) => {
    const upstream = await startOpenAiDouble({ completionTokens: 6, toolCalls: searchWhileOffered });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 2 } });
    const c = client(gw.url);

    const run = await runAgent(c, { question: 'What does Tollgate meter?', stream, conversation: stream ? 'conv-rounds' : undefined });

    // 1. Two tool rounds, then an answer: three requests in all.
    t.equal(run.turns.length, 3);
    t.equal(run.turns[0]!.toolCalls.length, 1);
    t.equal(run.turns[1]!.toolCalls.length, 1);
    const reqs = chatRequests(upstream);
    t.equal(reqs.length, 3);

    // 2. The first two reached the model with tools and no notice was sent.
    for (const i of [0, 1]) {
      t.ok(Array.isArray(reqs[i]!.tools), `request ${i + 1} offered tools`);
      t.equal(run.turns[i]!.headers.get('x-tollgate-notice'), null, `no notice on request ${i + 1}`);
    }

    // 3. The third reached the model with no tool fields and the final-answer instruction last.
    const final = reqs[2]!;
    t.notOk('tools' in final, 'no tools');
    t.notOk('tool_choice' in final, 'no tool_choice');
    t.notOk('parallel_tool_calls' in final, 'no parallel_tool_calls');
    t.same(lastMessage(final), { role: 'system', content: FINAL_ANSWER_INSTRUCTION });
    // The evidence is still there: both tool results precede the instruction.
    const tools = (final.messages as Array<Record<string, unknown>>).filter((m) => m.role === 'tool');
    t.equal(tools.length, 2);

    // 4. The client got the model's answer, told why.
    const answer = run.turns[2]!;
    t.equal(answer.content, ' hi'.repeat(6));
    t.equal(answer.toolCalls.length, 0);
    t.equal(answer.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
    t.equal(answer.headers.get('x-tollgate-fallback'), null);
    // Its prompt without the tools is another from its start, and the run has room: charged in
    // full, as the model reads it (regression: credited the leading messages all the same).
    t.ok(Number(run.turns[1]!.headers.get('x-tollgate-shared-prefix-tokens')) > 0, 'a tool round shares the prefix');
    t.equal(answer.headers.get('x-tollgate-shared-prefix-tokens'), '0', 'the final answer shares nothing');

    // 5. One conversation throughout (inferred or named).
    const convs = new Set(run.turns.map((x) => x.headers.get('x-tollgate-conversation')));
    t.same([...convs], [stream ? 'conv-rounds' : run.turns[0]!.headers.get('x-tollgate-conversation')]);
  });
}

t.test('the client’s tool_choice and parallel_tool_calls never reach the final turn', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  const messages = [
    { role: 'user', content: 'Find the price of gpt-4o' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"price"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: '$2.50 per million input tokens' },
  ];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({
      model: 'gpt-4o-mini',
      messages,
      tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }],
      tool_choice: 'required',
      parallel_tool_calls: true,
      max_tokens: 20,
    }),
  });
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
  const seen = chatRequests(upstream)[0]!;
  t.same(Object.keys(seen).filter((k) => ['tools', 'tool_choice', 'parallel_tool_calls', 'functions', 'function_call'].includes(k)), []);
});

t.test('bounds are set per tenant and per key, and can be turned off', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(upstream.url)],
    runs: { maxToolRounds: 4 },
    tenants: [{ id: 'careful', runs: { maxToolRounds: 2 } }],
    auth: {
      keys: [
        { key: 'tg-default', tenant: 'plain' },
        { key: 'tg-tenant', tenant: 'careful' },
        { key: 'tg-strict', tenant: 'careful', runs: { maxToolRounds: 1 } },
        { key: 'tg-unbounded', tenant: 'plain', runs: { maxToolRounds: null } },
      ],
    },
  });
  const roundsFor = async (key: string, maxTurns = 12) => {
    const run = await runAgent(client(gw.url, key), { question: `question for ${key}`, stream: false, maxTurns });
    return { rounds: run.turns.length - 1, notice: run.turns.at(-1)!.headers.get('x-tollgate-notice') };
  };
  // 1. The config's bound, the tenant's, and the key's (the key wins over its tenant).
  t.same(await roundsFor('tg-default'), { rounds: 4, notice: 'finishing-the-answer; reason=rounds' });
  t.same(await roundsFor('tg-tenant'), { rounds: 2, notice: 'finishing-the-answer; reason=rounds' });
  t.same(await roundsFor('tg-strict'), { rounds: 1, notice: 'finishing-the-answer; reason=rounds' });
  // 2. Turned off: the model keeps its tools past the config's 4 rounds (the agent stops at 8).
  await t.rejects(roundsFor('tg-unbounded', 8), /did not end within 8 turns/);
  const last = chatRequests(upstream).at(-1)!;
  t.ok(Array.isArray(last.tools), 'the 8th request still offered tools');
});

// Regression: a run kept the budget of the key that began it, so a key held to a smaller budget
// could take a larger one by joining a run another key of its tenant had begun.
t.test("a key that joins another key's run is held to the lower of the two budgets", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(upstream.url)],
    auth: { keys: [{ key: 'tg-wide', tenant: 'acme' }, { key: 'tg-narrow', tenant: 'acme', runs: { tokenBudget: 100 } }] },
  });
  const body = { model: 'gpt-4o-mini', max_tokens: 1000, messages: [{ role: 'user', content: 'One question.' }] };
  const headers = (key: string) => ({ 'content-type': 'application/json', authorization: `Bearer ${key}`, 'x-tollgate-conversation': 'shared-run' });
  const send = (key: string) => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: headers(key), body: JSON.stringify(body) });
  t.equal((await send('tg-narrow')).status, 402, 'alone, the narrow key may not reserve 1,000');
  t.equal((await send('tg-wide')).status, 200, 'the wide key begins the run');
  const joined = await send('tg-narrow');
  t.equal(joined.status, 402, 'nor by joining the run the wide key began');
  t.match(await joined.json(), { error: { code: 'token_budget_exhausted', limit: 100 } });
  const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: headers('tg-narrow'), body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { budgets: { run: { limit_tokens: number } } };
  t.equal(plan.budgets.run.limit_tokens, 100, 'and admission shows the budget it is held to');
});

t.test('legacy function calling (functions / function_call / role "function") counts its rounds too', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 2 } });
  const round = (n: number) => [
    { role: 'assistant', content: null, function_call: { name: 'search', arguments: `{"q":"page ${n}"}` } },
    { role: 'function', name: 'search', content: `result ${n}` },
  ];
  const ask = async (rounds: number) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'conv-legacy' },
      body: JSON.stringify({
        model: 'gpt-4o-mini',
        max_tokens: 20,
        messages: [{ role: 'user', content: 'Search twice.' }, ...Array.from({ length: rounds }, (_, i) => round(i + 1)).flat()],
        functions: [{ name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } }],
      }),
    });
    t.equal(res.status, 200);
    await res.text();
    return res.headers.get('x-tollgate-notice');
  };
  t.equal(await ask(1), null, 'after one round: another may follow');
  t.equal(await ask(2), 'finishing-the-answer; reason=rounds', 'after the second round: the final answer');
  const final = chatRequests(upstream).at(-1)!;
  t.notOk('functions' in final, 'no functions offered');
  t.notOk('function_call' in final);
});

// Regression (twentieth session, a review): the final answer was charged in full only where the
// run could hold its prompt and the whole allowance it asked for (4,096 by default): a run with room
// for the answer's reserve, not for all of that, had its prefix credited all the same.
t.test('a final answer is charged in full where that leaves it the answer reserve, its allowance cut to the room', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 6, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1, tokenBudget: 3000 } });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const post = async (messages: Array<Record<string, unknown>>, extra: Record<string, unknown> = {}) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'room' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, ...extra }),
    });
    return { res, body: (await res.json()) as Record<string, unknown> };
  };
  const question = [{ role: 'system', content: 'You research. '.repeat(40) }, { role: 'user', content: 'What does Tollgate meter?' }];
  const round = await post(question, { max_tokens: 50 });
  const call = ((round.body.choices as Array<Record<string, unknown>>)[0]!.message as Record<string, unknown>).tool_calls as Array<Record<string, unknown>>;
  t.ok(call?.length, 'a tool round');
  const final = await post([...question, { role: 'assistant', content: null, tool_calls: call }, { role: 'tool', tool_call_id: call[0]!.id, content: 'It meters tokens.' }]);
  t.equal(final.res.status, 200);
  t.equal(final.res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
  t.equal(final.res.headers.get('x-tollgate-shared-prefix-tokens'), '0', 'charged in full: it leaves the answer its reserve');
  const sent = chatRequests(upstream).at(-1)!;
  const allowance = Number(sent.max_completion_tokens ?? sent.max_tokens);
  t.ok(allowance >= 1024 && allowance < 4096, `its allowance (${allowance}) cut to what the run has left, at least the reserve`);
  t.ok(Number(final.res.headers.get('x-tollgate-reserved-tokens')) <= 3000 - (Number(round.res.headers.get('x-tollgate-charge-tokens'))), 'within the run');
});
