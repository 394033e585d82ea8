// The run time bound (SPEC §5): wall time since the run's first request, read from the gateway's
// injected clock. Past `runs.timeBudgetSeconds` the next request is the final answer, reason=time.
// A new user question starts a new run with a fresh clock.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { FINAL_ANSWER_INSTRUCTION } from '../../metering/runs/final-answer.js';
import { client, turn, appendToolRound, chatRequests, lastMessage, searchWhileOffered, defaultToolResult } from './agent-loop.js';

for (const stream of [false, true]) {
  const mode = stream ? 'streamed' : 'non-streamed';
  t.test(`past runs.timeBudgetSeconds → final answer, reason=time (${mode})`, async (t) => {
    const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { timeBudgetSeconds: 60 } }, { clock: true });
    const c = client(gw.url);
    // Streamed: the conversation is inferred; non-streamed: named.
    const conversation = stream ? undefined : 'conv-time';
    const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Which upstreams does Tollgate support?' }];

    // 1. The run starts; 59 s later (inside the bound) another tool round is still normal.
    const first = await turn(c, messages, { stream, conversation });
    t.equal(first.toolCalls.length, 1);
    appendToolRound(messages, first.toolCalls, defaultToolResult);
    gw.now.ms += 59_000;
    const second = await turn(c, messages, { stream, conversation });
    t.equal(second.headers.get('x-tollgate-notice'), null);
    t.equal(second.toolCalls.length, 1);
    appendToolRound(messages, second.toolCalls, defaultToolResult);

    // 2. Past 60 s since the run began: the next request is the answer.
    gw.now.ms += 2_000;
    const third = await turn(c, messages, { stream, conversation });
    t.equal(third.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=time');
    t.same(third.toolCalls, []);
    t.equal(third.content, ' hi hi hi');
    const reqs = chatRequests(upstream);
    t.equal(reqs.length, 3);
    t.notOk('tools' in reqs[2]!);
    t.same(lastMessage(reqs[2]!), { role: 'system', content: FINAL_ANSWER_INSTRUCTION });
    t.equal(third.headers.get('x-tollgate-conversation'), first.headers.get('x-tollgate-conversation'), 'same conversation');

    // 3. The next user question is a new run: its clock starts again, tools are offered again.
    messages.push({ role: 'assistant', content: third.content });
    messages.push({ role: 'user', content: 'And which tokenizers?' });
    const next = await turn(c, messages, { stream, conversation });
    t.equal(next.headers.get('x-tollgate-notice'), null);
    t.equal(next.toolCalls.length, 1);
    t.ok(Array.isArray(chatRequests(upstream)[3]!.tools));
  });
}

t.test('a system prompt with a clock line, rewritten every turn, keeps the run: its time bound still ends it', async (t) => {
  // Seed 000: such a turn shares nothing and is charged in full — against the same research.
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { timeBudgetSeconds: 60 } }, { clock: true });
  const c = client(gw.url);
  const clock = () => ({ role: 'system' as const, content: `You are a research agent. Current time: ${new Date(gw.now.ms).toISOString()}` });
  const history: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Which upstreams does Tollgate support?' }];
  const ask = () => turn(c, [clock(), ...history], { stream: false, conversation: 'conv-clock' });

  const first = await ask();
  t.equal(first.toolCalls.length, 1);
  appendToolRound(history, first.toolCalls, defaultToolResult);
  gw.now.ms += 40_000;
  const second = await ask();
  t.equal(second.headers.get('x-tollgate-notice'), null, 'inside the bound: another round');
  t.equal(second.headers.get('x-tollgate-shared-prefix-tokens'), '0', 'the new clock line shares nothing: charged in full');
  appendToolRound(history, second.toolCalls, defaultToolResult);
  gw.now.ms += 40_000;
  const third = await ask();
  t.equal(third.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=time', '80 s after the run began: the answer');
  t.same(third.toolCalls, []);
});

// Audit: with the clock stepped back an hour after a run began, its elapsed time was negative and
// its time bound never ended it. Its time is unknown: it ends now, with its answer (ADR 0007).
t.test('a run begun before the clock was stepped back goes to its final answer, reason=time', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { timeBudgetSeconds: 300 } }, { clock: true });
  const c = client(gw.url);
  const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Which upstreams does Tollgate support?' }];
  const first = await turn(c, messages, { stream: false, conversation: 'conv-stepped' });
  t.equal(first.toolCalls.length, 1);
  appendToolRound(messages, first.toolCalls, defaultToolResult);
  // 1. The clock is stepped back an hour; 2. ten real minutes pass (twice the run's time).
  gw.now.ms -= 3_600_000;
  gw.now.ms += 600_000;
  const second = await turn(c, messages, { stream: false, conversation: 'conv-stepped' });
  t.equal(second.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=time', 'ended, with its answer');
  t.same(second.toolCalls, []);
  t.equal(second.content, ' hi hi hi');
});
