// No-progress patience (SPEC §5, §11): three identical read-only batches in a row — same tool
// name, arguments and results, whatever the call ids — end the run early with reason=patience.
// A batch that calls a configured write tool never counts: writes change the world.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { FINAL_ANSWER_INSTRUCTION } from '../../metering/runs/final-answer.js';
import { client, runAgent, chatRequests, lastMessage } from './agent-loop.js';

// The same result for the same call, as a read of unchanged data returns.
const sameResult = () => 'status: pending (no change)';

for (const stream of [false, true]) {
  const mode = stream ? 'streamed' : 'non-streamed';

  t.test(`three identical read-only batches → final answer, reason=patience (${mode})`, async (t) => {
    // The model keeps polling the same thing with the same arguments while tools are offered.
    const upstream = await startOpenAiDouble({
      completionTokens: 5,
      toolCalls: (body) => (Array.isArray(body.tools) ? [{ name: 'search', arguments: '{"q":"job 42 status"}' }] : null),
    });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 10, patience: 3 } });

    const run = await runAgent(client(gw.url), {
      question: 'Is job 42 done?',
      stream,
      conversation: stream ? undefined : 'conv-patience',
      toolResult: sameResult,
    });

    // 1. Three rounds with identical batches (ids differ: the double numbers them per request).
    t.equal(run.turns.length, 4, 'three tool rounds, then the answer');
    const ids = run.turns.slice(0, 3).map((x) => x.toolCalls[0]!.id);
    t.equal(new Set(ids).size, 3, 'call ids differ from round to round');
    t.same(new Set(run.turns.slice(0, 3).map((x) => x.toolCalls[0]!.arguments)), new Set(['{"q":"job 42 status"}']));

    // 2. Requests 2 and 3 (one and two identical batches) still offered tools; the 4th did not.
    const reqs = chatRequests(upstream);
    t.equal(reqs.length, 4);
    for (const i of [0, 1, 2]) t.ok(Array.isArray(reqs[i]!.tools), `request ${i + 1} offered tools`);
    t.notOk('tools' in reqs[3]!);
    t.same(lastMessage(reqs[3]!), { role: 'system', content: FINAL_ANSWER_INSTRUCTION });

    // 3. The client got the answer and the reason, well before maxToolRounds.
    const answer = run.turns[3]!;
    t.equal(answer.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=patience');
    t.equal(answer.content, ' hi'.repeat(5));
  });

  t.test(`batches calling a write tool never count toward patience (${mode})`, async (t) => {
    // The model saves the same note every round: a write, repeated, is not "no progress".
    const upstream = await startOpenAiDouble({
      completionTokens: 5,
      toolCalls: (body) => (Array.isArray(body.tools) ? [{ name: 'save_note', arguments: '{"text":"checked"}' }] : null),
    });
    t.teardown(upstream.close);
    const gw = await startGateway(t, {
      upstreams: [openaiUpstream(upstream.url)],
      runs: { maxToolRounds: 5, patience: 3, writeTools: ['save_note'] },
    });

    const run = await runAgent(client(gw.url), { question: 'Keep notes', stream, toolResult: () => 'saved' });

    // 1. Five identical write batches ran; the run ended on rounds, not patience.
    t.equal(run.turns.length, 6);
    const reqs = chatRequests(upstream);
    for (const i of [0, 1, 2, 3, 4]) t.ok(Array.isArray(reqs[i]!.tools), `request ${i + 1} offered tools`);
    for (const x of run.turns.slice(0, 5)) t.equal(x.headers.get('x-tollgate-notice'), null);
    t.equal(run.turns[5]!.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
  });
}

t.test('a changed result, or a write in between, restarts the streak', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2, toolCalls: () => null });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { patience: 2, writeTools: ['save_note'] } });
  const call = (id: string, name: string, args: string) => ({ role: 'assistant', content: null, tool_calls: [{ id, type: 'function', function: { name, arguments: args } }] });
  const result = (id: string, content: string) => ({ role: 'tool', tool_call_id: id, content });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const ask = async (messages: unknown[]) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': `conv-${messages.length}-${Math.random()}` },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 8 }),
    });
    await res.arrayBuffer();
    return res.headers.get('x-tollgate-notice');
  };
  const user = { role: 'user', content: 'poll' };
  // 1. Same call, different results: progress — no patience notice.
  t.equal(await ask([user, call('a', 'search', '{"q":1}'), result('a', 'r1'), call('b', 'search', '{"q":1}'), result('b', 'r2')]), null);
  // 2. Same call and result with arguments reordered/spaced differently: identical — patience.
  t.equal(
    await ask([user, call('a', 'search', '{"q":1,"p":2}'), result('a', 'r'), call('b', 'search', '{ "p": 2, "q": 1 }'), result('b', 'r')]),
    'finishing-the-answer; reason=patience',
  );
  // 3. A write between two identical reads breaks the streak.
  t.equal(
    await ask([user, call('a', 'search', '{"q":1}'), result('a', 'r'), call('w', 'save_note', '{}'), result('w', 'ok'), call('b', 'search', '{"q":1}'), result('b', 'r')]),
    null,
  );
});
