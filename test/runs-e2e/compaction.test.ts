// History compacted during a research run — the agent replaces earlier turns with a summary — is
// the same run: the question it answers has not changed, so its budget and clock go on (SPEC §5:
// a run is the messages after the last user message).
import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

const tools = [{ type: 'function', function: { name: 'search', description: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
const round = (i: number) => [
  { role: 'assistant', content: null, tool_calls: [{ id: `call_${i}`, type: 'function', function: { name: 'search', arguments: `{"q":"page ${i}"}` } }] },
  { role: 'tool', tool_call_id: `call_${i}`, content: `result ${i}` },
];

t.test('a compacted history keeps its run, its budget and its clock', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })], runs: { tokenBudget: 4000, answerReserveTokens: 100 } });
  const send = (messages: unknown[]) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'conv-compact' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 50 }),
    });
  const earlier = [
    { role: 'user', content: 'What is Tollgate?' },
    { role: 'assistant', content: 'A metering gateway.' },
    { role: 'user', content: 'And who runs it?' },
    { role: 'assistant', content: 'Operators.' },
  ];
  const question = { role: 'user', content: 'Find every page about budgets.' };
  const system = { role: 'system', content: 'You research.' };
  const turns = [
    [system, ...earlier, question],
    [system, ...earlier, question, ...round(1)],
    // Compacted: the earlier turns are now a line of the system prompt.
    [{ role: 'system', content: 'You research. Earlier: Tollgate is a metering gateway run by operators.' }, question, ...round(1), ...round(2)],
  ];
  for (const messages of turns) t.equal((await send(messages)).status, 200);
  const rows = (await (await fetch(`${gw.url}/admin/ledger`, { headers: { authorization: 'Bearer admin-secret' } })).text())
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l) as { run: string; charge_tokens: number });
  t.equal(rows.length, 3);
  t.equal(new Set(rows.map((r) => r.run)).size, 1, 'one run for the three requests');
  const spent = rows.reduce((a, r) => a + r.charge_tokens, 0);
  const plan = (await (
    await fetch(`${gw.url}/v1/admission`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'conv-compact' },
      body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o-mini', messages: [...turns[2]!, ...round(3)], tools, max_tokens: 50 } }),
    })
  ).json()) as { budgets: { run: { limit_tokens: number; remaining_tokens: number } } };
  t.same(plan.budgets.run, { ...plan.budgets.run, limit_tokens: 4000, remaining_tokens: 4000 - spent }, 'the budget went on shrinking');
});
