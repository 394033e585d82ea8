// What an operator and a client can see of a run (SPEC §8, §10, §11): `/v1/admission` reports the
// run's state and the mode the request would run in, without calling a model or spending budget;
// `tollgate_final_answer_total{reason}` and `tollgate_fallback_total` count final turns and
// excerpt fallbacks.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { client, turn, appendToolRound, chatRequests, searchWhileOffered, defaultToolResult, metricsText, sample, runAgent, TOOLS, MODEL } from './agent-loop.js';

interface Admission {
  conversation: string;
  conversation_source: string;
  mode: string;
  final_reason: string | null;
  run: { tool_rounds: number; identical_batches: number; started_at: string | null } | null;
  budgets: { run: { limit_tokens: number; remaining_tokens: number } | null };
  charge: { prompt: number; allowance: number };
  verdict: { admit: boolean; status: number; error: unknown };
}

async function admission(url: string, messages: unknown[], conversation?: string): Promise<Admission> {
  const headers: Record<string, string> = { 'content-type': 'application/json' };
  if (conversation) headers['x-tollgate-conversation'] = conversation;
  const res = await fetch(`${url}/v1/admission`, {
    method: 'POST',
    headers,
    body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: MODEL, messages, tools: TOOLS, max_tokens: 64 } }),
  });
  if (res.status !== 200) throw new Error(`admission answered ${res.status}: ${await res.text()}`);
  return (await res.json()) as Admission;
}

for (const named of [true, false]) {
  const how = named ? 'conversation named by header' : 'conversation inferred';
  t.test(`/v1/admission shows the run and the mode the request would run in (${how})`, async (t) => {
    const upstream = await startOpenAiDouble({ completionTokens: 4, toolCalls: searchWhileOffered });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 2, tokenBudget: 20_000 } });
    const c = client(gw.url);
    const conversation = named ? 'conv-admission' : undefined;
    const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'How are runs bounded?' }];

    // 1. Before anything ran: a new run, normal mode, its whole budget left.
    const before = await admission(gw.url, messages, conversation);
    t.equal(before.mode, 'normal');
    t.equal(before.final_reason, null);
    t.equal(before.run?.tool_rounds, 0);
    t.equal(before.run?.started_at, null);
    t.same(before.budgets.run, { limit_tokens: 20_000, remaining_tokens: 20_000 });
    t.same(before.verdict, { admit: true, status: 200, error: null });

    // 2. After one tool round: still normal, one round counted, budget spent, same conversation.
    const r1 = await turn(c, messages, { stream: false, conversation });
    appendToolRound(messages, r1.toolCalls, defaultToolResult);
    const mid = await admission(gw.url, messages, conversation);
    t.equal(mid.mode, 'normal');
    t.equal(mid.run?.tool_rounds, 1);
    t.equal(mid.conversation, r1.headers.get('x-tollgate-conversation'));
    t.equal(mid.conversation_source, named ? 'header' : 'inferred');
    t.ok(mid.run?.started_at, 'the run has begun');
    const charged = Number(r1.headers.get('x-tollgate-charge-tokens'));
    t.equal(mid.budgets.run?.remaining_tokens, 20_000 - charged);

    // 3. After the second round: the request would be the final answer, reason=rounds.
    const r2 = await turn(c, messages, { stream: true, conversation });
    appendToolRound(messages, r2.toolCalls, defaultToolResult);
    const requestsBefore = chatRequests(upstream).length;
    const last = await admission(gw.url, messages, conversation);
    t.equal(last.mode, 'final-answer');
    t.equal(last.final_reason, 'rounds');
    t.equal(last.run?.tool_rounds, 2);
    t.same(last.verdict, { admit: true, status: 200, error: null });

    // 4. Asking changed nothing: no model was called, no budget moved, and twice gives the same.
    t.equal(chatRequests(upstream).length, requestsBefore);
    const again = await admission(gw.url, messages, conversation);
    t.same(again.budgets, last.budgets);
    t.equal(again.mode, 'final-answer');

    // 5. And the real request does what admission said.
    const real = await turn(c, messages, { stream: false, conversation });
    t.equal(real.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
  });
}

t.test('/v1/admission reports patience and its streak', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { patience: 2 } });
  const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Poll the job' }];
  for (const id of ['a', 'b']) appendToolRound(messages, [{ id, name: 'search', arguments: '{"q":"job"}' }], () => 'pending');
  const a = await admission(gw.url, messages, 'conv-patience-admission');
  t.equal(a.mode, 'final-answer');
  t.equal(a.final_reason, 'patience');
  t.equal(a.run?.identical_batches, 2);
  t.equal(chatRequests(upstream).length, 0);
});

t.test('metrics: tollgate_final_answer_total{reason} and tollgate_fallback_total move', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  const c = client(gw.url);
  const series = (reason: string) => `tollgate_final_answer_total{reason="${reason}"}`;

  // 1. Nothing yet.
  let text = await metricsText(gw.url);
  t.equal(sample(text, series('rounds')), 0);
  t.equal(sample(text, 'tollgate_fallback_total'), 0);

  // 2. A run answered by the model: one final answer, no fallback.
  await runAgent(c, { question: 'first question', stream: false });
  text = await metricsText(gw.url);
  t.equal(sample(text, series('rounds')), 1);
  t.equal(sample(text, 'tollgate_fallback_total'), 0);

  // 3. A streamed run whose model keeps proposing tools: a second final answer and one fallback.
  upstream.options.toolCalls = () => [{ name: 'search', arguments: '{}' }];
  const run = await runAgent(c, { question: 'second question', stream: true });
  t.equal(run.turns.at(-1)!.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  text = await metricsText(gw.url);
  t.equal(sample(text, series('rounds')), 2);
  t.equal(sample(text, 'tollgate_fallback_total'), 1);

  // 4. A final turn whose upstream fails: a third final answer and a second fallback.
  upstream.options.toolCalls = searchWhileOffered;
  const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'third question' }];
  const r1 = await turn(c, messages, { stream: false, conversation: 'conv-metrics-fail' });
  appendToolRound(messages, r1.toolCalls, defaultToolResult);
  upstream.options.failWith = { status: 503, body: { error: { message: 'overloaded', type: 'server_error', code: null } } };
  const fin = await turn(c, messages, { stream: false, conversation: 'conv-metrics-fail' });
  t.equal(fin.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  text = await metricsText(gw.url);
  t.equal(sample(text, series('rounds')), 3);
  t.equal(sample(text, 'tollgate_fallback_total'), 2);
  t.equal(sample(text, series('time')), 0, 'other reasons did not move');
});
