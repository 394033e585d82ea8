// Regression: a final turn whose only text was held back by the tool-call filter (it could have
// been the start of a `<tool_call>` tag) and released when the stream ended must still reach the
// client — it is not lost, and no excerpt replaces it. (The upstream failed part way, so the labelled
// excerpt follows it: SPEC §5.)

import t, { type Test } from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { EXCERPT_FIRST_LINE } from '../../metering/runs/evidence-excerpt.js';

t.test('text released by the filter at the end of a final stream reaches the client', async (t) => {
  // 1. an upstream that writes one chunk "<tool" and then loses the connection
  const upstream = await startOpenAiDouble({ word: '<tool', completionTokens: 5, dropAfterChunks: 1 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  // 2. a request after one tool round: the run is at its bound, so this turn is the final answer
  const messages = [
    { role: 'user', content: 'Find it.' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"it"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'found: it is here' },
  ];
  const tools = [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, max_tokens: 20, messages, tools }),
  });
  t.equal(res.status, 200);
  t.match(res.headers.get('x-tollgate-notice') ?? '', /finishing-the-answer; reason=rounds/);
  const text = await res.text();
  const content = text
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)) as { choices: Array<{ delta?: { content?: string } }> })
    .map((c) => c.choices[0]?.delta?.content ?? '')
    .join('');
  // 3. the held text came through first; the turn failed, so the labelled excerpt follows it
  t.ok(content.startsWith(`<tool\n\n${EXCERPT_FIRST_LINE}\n`), 'the text, then the excerpt under its own first line');
  t.match(content, /found: it is here/);
  t.equal(res.headers.get('x-tollgate-fallback'), null, 'the headers had gone out with the text');
  t.match(text, /^: tollgate \{.*"fallback":"evidence-excerpt".*\}$/m, 'the closing comment says so');
  t.ok(text.trimEnd().endsWith('data: [DONE]'));
});

/** A run at its one-round bound asks for its final answer, streamed with usage; the SSE `data:` events. */
async function finalTurnEvents(t: Test, upstreamOptions: Parameters<typeof startOpenAiDouble>[0]) {
  const upstream = await startOpenAiDouble(upstreamOptions);
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  const messages = [
    { role: 'user', content: 'Find it.' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'found: it is here' },
  ];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, stream_options: { include_usage: true }, messages, tools: [{ type: 'function', function: { name: 'search' } }] }),
  });
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  return (await res.text())
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)) as { id: string; choices: unknown[]; usage?: Record<string, number> });
}

t.test('a streamed fallback after a failed final turn still sends the usage chunk the client asked for', async (t) => {
  const events = await finalTurnEvents(t, { failWith: { status: 500, body: { error: { message: 'boom', type: 'server_error', param: null, code: null } } } });
  const last = events.at(-1)!;
  t.same(last.choices, []);
  t.same(last.usage, { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 }, 'the model generated nothing');
  t.equal(new Set(events.map((e) => e.id)).size, 1, 'every chunk of the excerpt, its usage chunk too, has one id');
});

// Regression: a final turn whose stream had begun and was lost before any output was refunded
// whole, yet its usage chunk reported the prompt as read (a failure before the response said 0).
t.test('a streamed final turn lost before any output: the usage chunk says nothing was used, as its charge does', async (t) => {
  const events = await finalTurnEvents(t, { dropAfterChunks: 0, completionTokens: 5 });
  const last = events.at(-1)!;
  t.same(last.choices, []);
  t.same(last.usage, { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 }, 'refunded whole: nothing used');
});

t.test('a streamed final turn that only proposed tools: the excerpt and its usage chunk share one id', async (t) => {
  const events = await finalTurnEvents(t, { toolCalls: () => [{ name: 'search', arguments: '{"q":"more"}' }] });
  t.ok(events.at(-1)?.usage, 'a usage chunk last');
  t.equal(new Set(events.map((e) => e.id)).size, 1, 'one id for every chunk the client saw');
});

t.test('a streamed final turn lost part way: its text, then the labelled excerpt, and the stream ends as an answer', async (t) => {
  const upstream = await startOpenAiDouble({ word: ' Paris', completionTokens: 8, dropAfterChunks: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  const messages = [
    { role: 'user', content: 'Capital of France?' },
    { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"france"}' } }] },
    { role: 'tool', tool_call_id: 'c1', content: 'the capital of France is Paris' },
  ];
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, max_tokens: 20, messages, tools: [{ type: 'function', function: { name: 'search' } }] }),
  });
  t.equal(res.status, 200);
  const text = await res.text();
  const chunks = text
    .split('\n\n')
    .filter((e) => e.startsWith('data: {'))
    .map((e) => JSON.parse(e.slice(6)) as { choices: Array<{ delta?: { content?: string }; finish_reason?: string | null }> });
  const content = chunks.map((c) => c.choices[0]?.delta?.content ?? '').join('');
  t.ok(content.startsWith(` Paris Paris Paris\n\n${EXCERPT_FIRST_LINE}\n`), 'what the model wrote, then the excerpt under its label');
  t.match(content, /the capital of France is Paris/);
  t.same(chunks.map((c) => c.choices[0]?.finish_reason).filter(Boolean), ['stop'], 'one finish, after the excerpt');
  t.notMatch(text, /"error"/, 'no error event: the final answer ends as an answer');
  t.match(text, /^: tollgate \{.*"fallback":"evidence-excerpt".*\}$/m);
  t.ok(text.trimEnd().endsWith('data: [DONE]'));
});
