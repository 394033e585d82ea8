// A run whose research outgrew the model's window after tools have run still ends in an answer
// (seed 001, SPEC §5): the round that no longer fits goes as the tools-free final answer, and when
// even that cannot fit, the run ends with the evidence excerpt — no model called, nothing charged.
// A first request too large, with no tool results to answer from, is refused as before (413).

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { EXCERPT_FIRST_LINE } from '../../metering/runs/evidence-excerpt.js';
import { chatRequests, searchWhileOffered } from './agent-loop.js';

type Json = Record<string, unknown>;

const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: {} } } }];

/** A run with one tool round whose result is `resultWords` tokens long. */
function runWithResult(resultWords: number): Json[] {
  return [
    { role: 'user', content: 'Survey the field.' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: `found:${' word'.repeat(resultWords)}` },
  ];
}

async function setup(t: { teardown(fn: () => unknown): void }) {
  const upstream = await startOpenAiDouble({ completionTokens: 5, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 3000 })] });
  const post = async (messages: Json[], extra: Json = {}) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': `c-${messages.length}-${JSON.stringify(extra).length}` },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages, tools, max_tokens: 256, ...extra }),
    });
    return { res, body: (await res.json()) as Json };
  };
  return { upstream, post };
}

t.test('a round that no longer fits the window after tools have run goes as the final answer', async (t) => {
  const { upstream, post } = await setup(t);
  // ~2,800 tokens of results + 256 asked: over the 3,000-token window as sent.
  const { res, body } = await post(runWithResult(2800));
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  t.equal(res.headers.get('x-tollgate-fallback'), null, "the model's own answer");
  const sent = chatRequests(upstream).at(-1)!;
  t.notOk('tools' in sent, 'no tools offered');
  const prompt = Number(res.headers.get('x-tollgate-reserved-tokens')) - Number(sent.max_tokens ?? sent.max_completion_tokens);
  t.ok(prompt + Number(sent.max_tokens ?? sent.max_completion_tokens) <= 3000, 'the answer was sent within the window');
  t.match(((body.choices as Json[])[0]!.message as Json).content, /^( hi)+$/);
});

// Regression: a round past the window was said to end for want of tokens even when the run had
// already made its last round — the notice and the final-answer metric gave the wrong reason.
t.test('a round past the window at the run\'s last round ends for its rounds, as the same round within the window does', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5, toolCalls: searchWhileOffered });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { contextWindow: 3000 })], runs: { maxToolRounds: 1 } });
  for (const [conversation, maxTokens] of [['within', 256], ['past', 2990]] as const) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation },
      body: JSON.stringify({ model: 'gpt-4o-mini', messages: runWithResult(20), tools, max_tokens: maxTokens }),
    });
    await res.json();
    t.equal(res.status, 200, conversation);
    t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds', conversation);
  }
});

t.test('a final answer that cannot fit the window either: the evidence excerpt, no model called, nothing charged', async (t) => {
  const { upstream, post } = await setup(t);
  const before = chatRequests(upstream).length;
  const { res, body } = await post(runWithResult(3500));
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  t.equal(res.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  t.equal(res.headers.get('x-tollgate-charge-tokens'), '0');
  t.equal(chatRequests(upstream).length, before, 'no model was called');
  const content = ((body.choices as Json[])[0]!.message as Json).content as string;
  t.equal(content.split('\n')[0], EXCERPT_FIRST_LINE);
  t.match(content, /found: word word/);
});

t.test('a request too large with no tool results to answer from is refused as before', async (t) => {
  const { upstream, post } = await setup(t);
  const first = await post([{ role: 'user', content: ' word'.repeat(3500) }]);
  t.equal(first.res.status, 413);
  t.equal((first.body.error as Json).code, 'context_window_exceeded');
  // …and so is one that is itself an answer (no tools offered).
  const answer = await post(runWithResult(3500), { tools: undefined });
  t.equal(answer.res.status, 413);
  t.equal(chatRequests(upstream).length, 0);
});

// Regression (twentieth session): with the window unknown here (an openai-kind upstream with no
// contextWindow, a llama.cpp server whose /props is away), a research round the server refused for
// its context reached the client as the server's 400: the run ended in an error, not an answer.
t.test("a round the upstream refuses for a window the gateway did not know goes as the final answer, or ends with the excerpt", async (t) => {
  const { startLlamaCppDouble } = await import('../doubles/llamacpp.js');
  const llama = await startLlamaCppDouble({ nCtx: 4096, completionTokens: 5, toolCalls: (body) => (Array.isArray(body.tools) ? { name: 'search', arguments: '{}' } : null) });
  t.teardown(llama.close);
  // No contextWindow, and not the llamacpp kind: nothing here knows the server's window.
  const gw = await startGateway(t, { upstreams: [{ name: 'box', kind: 'openai', baseUrl: `${llama.url}/v1`, models: ['*'], billing: 'local' }] });
  const long = (words: number) => ' word'.repeat(words); // a token each, as the server counts
  // Tools whose description fills half the window: the round fits before the result, not after.
  const bigTools = [{ type: 'function', function: { name: 'search', description: `Search.${long(1800)}`, parameters: { type: 'object', properties: {} } } }];
  const post = async (conversation: string, messages: Json[], extra: Json = {}) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation },
      body: JSON.stringify({ model: 'tiny', messages, tools: bigTools, max_tokens: 50, ...extra }),
    });
    return { res, body: (await res.json()) as Json };
  };
  const round = (result: string): Json[] => [
    { role: 'user', content: 'Survey the field.' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: result },
  ];
  const first = await post('answered', [{ role: 'user', content: 'Survey the field.' }]);
  t.equal(first.res.status, 200, 'the first round fits');

  // 1. The tools take it past the window; without them the answer fits: the model answers.
  const before = llama.requests.filter((r) => r.path === '/v1/chat/completions').length;
  // No max_tokens: the default 4,096 is more than the window leaves.
  const answered = await post('answered', round(`found:${long(2400)}`), { max_tokens: undefined });
  t.equal(answered.res.status, 200);
  t.equal(answered.res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  t.equal(answered.res.headers.get('x-tollgate-fallback'), null, "the model's own answer");
  const sent = llama.requests.filter((r) => r.path === '/v1/chat/completions').slice(before);
  t.equal(sent.length, 2, 'the round as sent, then its final answer');
  t.ok(Array.isArray((sent[0]!.body as Json).tools), 'the round offered its tools');
  t.notOk('tools' in (sent[1]!.body as Json), 'the final answer offered none');
  // The refusal named the server's window (n_ctx): the answer's allowance is what it leaves.
  const finalPrompt = Number(answered.res.headers.get('x-tollgate-reserved-tokens')) - Number((sent[1]!.body as Json).max_tokens);
  t.equal(Number((sent[1]!.body as Json).max_tokens), 4096 - finalPrompt, 'the allowance: the window the refusal named, less the prompt');
  t.match(((answered.body.choices as Json[])[0]!.message as Json).content, /\S/);

  // 2. The result alone is past the window: the final answer is refused too, and the excerpt answers.
  const excerpt = await post('excerpt', round(`found:${long(4200)}`));
  t.equal(excerpt.res.status, 200);
  t.equal(excerpt.res.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  t.match(((excerpt.body.choices as Json[])[0]!.message as Json).content, new RegExp(`^${EXCERPT_FIRST_LINE.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}`));

  // The refused attempts were refunded whole: their rows charge nothing.
  const rows: Json[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row as unknown as Json);
  const refused = rows.filter((r) => r.status === 400);
  t.equal(refused.length, 2, 'one refused round in each run');
  t.ok(refused.every((r) => r.charge_tokens === 0), 'each refunded whole');

  // A first request too large, with no tool results to answer from, is the server's 400 as before.
  const tooLarge = await post('first', [{ role: 'user', content: long(4200) }]);
  t.equal(tooLarge.res.status, 400);
  t.match(tooLarge.body, { error: { type: 'exceed_context_size_error' } });
});

// A review: a window configured larger than the server's was kept over the one its refusal named,
// and the final answer asked for the same overflow again.
t.test("after the upstream's context refusal, the smaller of the configured window and the one it names holds", async (t) => {
  const { startLlamaCppDouble } = await import('../doubles/llamacpp.js');
  const llama = await startLlamaCppDouble({ nCtx: 4096, completionTokens: 5 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [{ name: 'box', kind: 'openai', baseUrl: `${llama.url}/v1`, models: ['*'], billing: 'local', contextWindow: 100000 }] });
  const tools = [{ type: 'function', function: { name: 'search', description: `Search.${' word'.repeat(1800)}`, parameters: { type: 'object', properties: {} } } }];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'configured' },
    body: JSON.stringify({
      model: 'tiny',
      tools,
      messages: [
        { role: 'user', content: 'Survey the field.' },
        { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
        { role: 'tool', tool_call_id: 'c1', content: `found:${' word'.repeat(2400)}` },
      ],
    }),
  });
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=tokens');
  const sent = llama.requests.filter((r) => r.path === '/v1/chat/completions').at(-1)!.body as Json;
  const allowance = Number(sent.max_tokens);
  const prompt = Number(res.headers.get('x-tollgate-reserved-tokens')) - allowance;
  t.equal(allowance, 4096 - prompt, "the server's 4,096, not the configured 100,000");
});
