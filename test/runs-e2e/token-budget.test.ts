// The run token budget (SPEC §4, §5, §11): a run whose every round spends its whole allowance is
// switched to its final answer while the answer's reserve is still untouched, gets that answer
// (reason=tokens), and the ledger never charges the run more than its budget.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { client, runAgent, chatRequests, searchWhileOffered } from './agent-loop.js';

const BUDGET = 1200;
const RESERVE = 200;
const MAX_TOKENS = 150;

interface LedgerRow {
  run: string;
  conversation: string;
  status: number | null;
  reserved_tokens: number;
  charge_tokens: number;
  refund_tokens: number;
}

async function ledgerRows(url: string): Promise<LedgerRow[]> {
  const res = await fetch(`${url}/admin/ledger`, { headers: { authorization: 'Bearer admin-secret' } });
  const text = await res.text();
  return text
    .split('\n')
    .filter((l) => l.trim() !== '')
    .map((l) => JSON.parse(l) as LedgerRow);
}

for (const stream of [false, true]) {
  const mode = stream ? 'streamed' : 'non-streamed';
  t.test(`a run that spends every allowance still gets its answer within budget (${mode})`, async (t) => {
    // Every request generates far more than it may: each one uses its whole allowance.
    const upstream = await startOpenAiDouble({ completionTokens: 10_000, toolCalls: searchWhileOffered });
    t.teardown(upstream.close);
    const gw = await startGateway(t, {
      upstreams: [openaiUpstream(upstream.url)],
      runs: { tokenBudget: BUDGET, answerReserveTokens: RESERVE, maxToolRounds: 64, patience: null },
    });

    const run = await runAgent(client(gw.url), {
      question: 'Summarise every page of the Tollgate documentation.',
      stream,
      conversation: stream ? 'conv-tokens' : undefined,
      maxTokens: MAX_TOKENS,
      maxTurns: 20,
    });

    // 1. Several rounds ran, then the answer came with reason=tokens — no 402 along the way.
    t.ok(run.turns.length >= 3, `${run.turns.length} turns`);
    const answer = run.turns.at(-1)!;
    for (const x of run.turns.slice(0, -1)) t.equal(x.headers.get('x-tollgate-notice'), null);
    t.equal(answer.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
    t.equal(answer.headers.get('x-tollgate-fallback'), null);
    t.same(answer.toolCalls, []);
    t.match(answer.content, /^( hi)+$/, 'the model’s own answer');

    // 2. The final request went without tools and with an allowance that fits what was left.
    const reqs = chatRequests(upstream);
    const final = reqs.at(-1)!;
    t.notOk('tools' in final);
    t.ok(Number(final.max_tokens) >= 1 && Number(final.max_tokens) <= MAX_TOKENS);

    // 3. The ledger: each round was charged its whole reservation, and the sum stays in budget.
    const rows = await ledgerRows(gw.url);
    t.equal(rows.length, run.turns.length);
    t.equal(new Set(rows.map((r) => r.run)).size, 1, 'one run');
    for (const r of rows) {
      t.equal(r.status, 200);
      t.equal(r.charge_tokens, r.reserved_tokens, 'whole allowance used');
      t.equal(r.refund_tokens, 0);
    }
    const charged = rows.reduce((n, r) => n + r.charge_tokens, 0);
    t.comment(`charges per request: ${rows.map((r) => r.charge_tokens).join(', ')}`);
    t.ok(charged <= BUDGET, `charged ${charged} ≤ budget ${BUDGET}`);
    // The tool rounds stopped while the reserve was intact: the answer was paid from it.
    const beforeAnswer = rows.slice(0, -1).reduce((n, r) => n + r.charge_tokens, 0);
    t.ok(beforeAnswer <= BUDGET - RESERVE, `tool rounds used ${beforeAnswer} ≤ ${BUDGET - RESERVE}`);

    // 4. The gateway's own view of the run agrees with the ledger.
    const state = await gw.ledger.getRun(rows[0]!.run);
    t.equal(state?.usedTokens, charged);
    t.equal(state?.budgetTokens, BUDGET);

    // 5. The next user question is a new run with a fresh budget, in the same conversation.
    const next = [...run.messages, { role: 'assistant', content: answer.content }, { role: 'user', content: 'Thanks. And the pricing pages?' }];
    const headers: Record<string, string> = { 'content-type': 'application/json' };
    if (stream) headers['x-tollgate-conversation'] = 'conv-tokens';
    const res = await fetch(`${gw.url}/v1/admission`, {
      method: 'POST',
      headers,
      body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o-mini', messages: next, tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }], max_tokens: MAX_TOKENS } }),
    });
    const view = (await res.json()) as { conversation: string; mode: string; run: { tool_rounds: number }; budgets: { run: { remaining_tokens: number } } };
    t.equal(view.conversation, answer.headers.get('x-tollgate-conversation'));
    t.equal(view.mode, 'normal');
    t.equal(view.run.tool_rounds, 0);
    t.equal(view.budgets.run.remaining_tokens, BUDGET);
  });
}

for (const withTools of [false, true]) {
  t.test(`an answer that cannot fit even the whole remainder is a 402, and nothing reaches the model (${withTools ? 'tools offered' : 'no tools'})`, async (t) => {
    const upstream = await startOpenAiDouble({ completionTokens: 5 });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 40, answerReserveTokens: 10 } });
    const tools = withTools ? { tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }] } : {};
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'word '.repeat(200) }], max_tokens: 10, ...tools }),
    });
    t.equal(res.status, 402);
    const body = (await res.json()) as { error: { code: string; remaining: number; needed: number } };
    t.equal(body.error.code, 'token_budget_exhausted');
    t.equal(body.error.remaining, 40);
    t.ok(body.error.needed > 40);
    t.equal(chatRequests(upstream).length, 0);
  });
}

t.test('a max_tokens larger than the answer reserve still ends in an answer, not a 402', async (t) => {
  // Regression: the final-answer decision checked the request *as sent* (tools and the client's
  // whole max_tokens) against what the run had left, and answered 402 when it did not fit — though
  // the final request drops the tools and takes its allowance from what is left (SPEC §11).
  const upstream = await startOpenAiDouble({ completionTokens: 10_000, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const budget = 1000;
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(upstream.url)],
    runs: { tokenBudget: budget, answerReserveTokens: 100, maxToolRounds: 64, patience: null },
  });
  const run = await runAgent(client(gw.url), { question: 'Summarise every page of the Tollgate documentation.', stream: false, maxTokens: 300 });

  // 1. The run ended in the model's answer, told why.
  const answer = run.turns.at(-1)!;
  t.equal(answer.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  t.match(answer.content, /^( hi)+$/);

  // 2. The answer's allowance was what the run had left after its prompt: the budget holds.
  const final = chatRequests(upstream).at(-1)!;
  t.ok(Number(final.max_tokens) < 300, `final max_tokens ${String(final.max_tokens)} clamped below the client's 300`);
  const rows = await ledgerRows(gw.url);
  const charged = rows.reduce((n, r) => n + r.charge_tokens, 0);
  t.ok(charged <= budget, `charged ${charged} ≤ ${budget}`);
  // Charged in full, the prompt would leave the answer no room: the leading messages are credited (ADR 0004).
  t.ok(Number(answer.headers.get('x-tollgate-shared-prefix-tokens')) > 0, 'near the budget, the final answer keeps the credit');
});

t.test('a run budget no larger than the default reserve (1,024) sends tools requests as the final answer; a smaller reserve set beside it keeps tool rounds', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const request = {
    model: 'gpt-4o-mini',
    max_tokens: 50,
    messages: [{ role: 'user', content: 'Which tokenizers?' }],
    tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }],
  };
  const ask = async (runs: Record<string, unknown>) => {
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs });
    const plan = (await (
      await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })
    ).json()) as { mode: string; run: { bounds: { answerReserveTokens: number } } };
    const before = chatRequests(upstream).length;
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(request) });
    t.equal(res.status, 200);
    return { plan, notice: res.headers.get('x-tollgate-notice'), toolsOffered: Array.isArray(chatRequests(upstream)[before]!.tools) };
  };

  const byDefault = await ask({ tokenBudget: 1000 });
  t.equal(byDefault.plan.run.bounds.answerReserveTokens, 1024, 'admission shows the reserve that applies: the default');
  t.equal(byDefault.plan.mode, 'final-answer');
  t.equal(byDefault.notice, 'finishing-the-answer; reason=tokens');
  t.notOk(byDefault.toolsOffered, 'no tools offered to the model');

  const smaller = await ask({ tokenBudget: 1000, answerReserveTokens: 250 });
  t.equal(smaller.plan.run.bounds.answerReserveTokens, 250);
  t.equal(smaller.plan.mode, 'normal');
  t.equal(smaller.notice, null, 'a normal tool round, not the final answer');
  t.ok(smaller.toolsOffered, 'tools were offered to the model');
});

t.test('without the conversation header, the request after a final answer (or after a failed turn) stays in its conversation and run', async (t) => {
  // Regression: only a normal turn that succeeded wrote the conversation's head, and an inferred
  // conversation is found by its heads: the next request, resending the same messages, started a
  // new conversation with a fresh run budget — one question spent 2.4× its budget.
  const upstream = await startOpenAiDouble({ completionTokens: 1000, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 450, answerReserveTokens: 300 } });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const messages: Array<Record<string, unknown>> = [
    { role: 'system', content: 'You research.' },
    { role: 'user', content: 'The question.' },
  ];
  const send = async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 150 }) });
    const body = (await res.json()) as { choices?: Array<{ message: { content: string | null } }>; error?: { remaining: number } };
    if (res.status === 200) messages.push({ role: 'assistant', content: body.choices![0]!.message.content });
    return { status: res.status, remaining: body.error?.remaining, conversation: res.headers.get('x-tollgate-conversation'), notice: res.headers.get('x-tollgate-notice'), charge: Number(res.headers.get('x-tollgate-charge-tokens')) };
  };
  const first = await send();
  t.equal(first.notice, 'finishing-the-answer; reason=tokens', 'the budget leaves room for the answer only');
  let charged = first.charge;
  for (let i = 0; i < 3; i++) {
    const next = await send();
    if (next.status !== 200) {
      t.equal(next.status, 402, 'the run has spent its budget');
      t.equal(next.remaining, 450 - charged, 'what the run has left, not a fresh budget');
      break;
    }
    t.equal(next.conversation, first.conversation, 'the same conversation, inferred');
    charged += next.charge;
  }
  t.ok(charged <= 450, `the question was charged ${charged} ≤ its budget of 450`);
  const rows = await ledgerRows(gw.url);
  t.equal(new Set(rows.map((r) => r.run)).size, 1, 'one run');

  // An upstream that fails before any output: the retry of the same messages is the same conversation.
  const failing = await startOpenAiDouble({ failWith: { status: 400, body: { error: { message: 'no', type: 'invalid_request_error' } } } });
  t.teardown(failing.close);
  const gw2 = await startGateway(t, { upstreams: [openaiUpstream(failing.url)] });
  const ask = async () =>
    (await fetch(`${gw2.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Again?' }] }) })).headers.get('x-tollgate-conversation');
  const a = await ask();
  t.equal(await ask(), a, 'a retry after a failed turn joins its conversation');
});

t.test("a run with nothing left is refused with the final answer's own figures: its prompt and one token", async (t) => {
  // Regression: the refusal said `needed: 1` beside the tool request's prompt and max_tokens.
  const upstream = await startOpenAiDouble({ completionTokens: 1000, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: 600, answerReserveTokens: 100 } });
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];
  const messages: Array<Record<string, unknown>> = [{ role: 'user', content: 'The question.' }];
  const send = async () => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-spent' },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 300 }),
    });
    return { res, body: (await res.json()) as Record<string, any> };
  };
  // A tool round, then the final answer, which spends everything left.
  let turn = await send();
  messages.push(turn.body.choices[0].message, { role: 'tool', tool_call_id: turn.body.choices[0].message.tool_calls[0].id, content: 'found it' });
  turn = await send();
  t.equal(turn.res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  messages.push({ role: 'assistant', content: turn.body.choices[0].message.content });
  const plan = (await (
    await fetch(`${gw.url}/v1/admission`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-spent' },
      body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { model: 'gpt-4o-mini', messages, tools, max_tokens: 300 } }),
    })
  ).json()) as Record<string, any>;
  const refused = await send();
  t.equal(refused.res.status, 402);
  const e = refused.body.error;
  t.equal(e.remaining, 0);
  t.equal(e.allowance, 1, 'the final answer needs one token at least');
  t.equal(e.needed, e.prompt_tokens + 1, 'needed = its prompt + that token');
  t.ok(e.prompt_tokens > 1);
  t.match(e.message, `needs ${e.needed} tokens (prompt ${e.prompt_tokens} + max output 1), 0 of the run's 600 tokens remain`);
  t.same(plan.verdict.error, refused.body, 'admission said so too');
});

t.test('tool rounds of one run sent at once never take the answer reserve: those that would go as the final answer', async (t) => {
  // Regression: the mode was decided from the run as planned, and the store checked only the run's
  // budget, so four rounds admitted at once ate the answer's reserve (the answer then had 26 tokens).
  const upstream = await startOpenAiDouble({ completionTokens: 1000, delayMs: 150, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const budget = 1000;
  const reserve = 300;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { tokenBudget: budget, answerReserveTokens: reserve } });
  const request = {
    model: 'gpt-4o-mini',
    max_tokens: 150,
    messages: [{ role: 'user', content: 'Search everything at once.' }],
    tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }],
  };
  const send = () =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c-at-once' }, body: JSON.stringify(request) }).then(async (res) => {
      await res.text();
      return { status: res.status, notice: res.headers.get('x-tollgate-notice'), reserved: Number(res.headers.get('x-tollgate-reserved-tokens')) };
    });
  const results = await Promise.all([send(), send(), send(), send(), send(), send()]);
  t.comment(JSON.stringify(results));
  const rounds = results.filter((r) => r.status === 200 && r.notice === null);
  const answers = results.filter((r) => r.notice === 'finishing-the-answer; reason=tokens');
  t.ok(rounds.length >= 1 && answers.length >= 1, `${rounds.length} tool rounds, ${answers.length} final answers`);
  const roundsReserved = rounds.reduce((n, r) => n + r.reserved, 0);
  t.ok(roundsReserved <= budget - reserve, `the tool rounds reserved ${roundsReserved} ≤ ${budget - reserve}: the answer's reserve was kept`);
  for (const r of results) t.ok(r.status === 200 || r.status === 402, `status ${r.status}`);
});
