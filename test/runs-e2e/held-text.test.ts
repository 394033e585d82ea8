// Regression: a final turn whose only text was held back by the tool-call filter (it could have
// been the start of a `<tool_call>` tag) and released when the stream ended must still reach the
// client — it is the answer, not lost, and no excerpt replaces it.

import t from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

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
  // 3. the held text came through; no excerpt was sent in its place
  t.equal(content, '<tool');
  t.equal(res.headers.get('x-tollgate-fallback'), null);
  t.ok(text.trimEnd().endsWith('data: [DONE]'));
});
