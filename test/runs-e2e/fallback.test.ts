// When the final turn yields no answer — the model proposes tools again, or the upstream fails —
// the client still gets a 200: a labelled excerpt of the run's tool results, marked as unverified
// evidence and not an answer, with `x-tollgate-fallback: evidence-excerpt` (SPEC §5, §11).

import t from 'tap';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream, metricValue } from '../helpers/gateway.js';
import { EXCERPT_FIRST_LINE } from '../../metering/runs/evidence-excerpt.js';
import { client, runAgent, turn, chatRequests, searchWhileOffered, type Call } from './agent-loop.js';

const result = (call: Call) => `EVIDENCE<${call.arguments}> Tollgate meters tokens and money.`;

for (const stream of [false, true]) {
  const mode = stream ? 'streamed' : 'non-streamed';

  t.test(`a model that keeps proposing tools in the final turn → evidence excerpt (${mode})`, async (t) => {
    // The model proposes a call on every request, tools offered or not.
    const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'search', arguments: '{"q":"again"}' }] });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 2 } });

    // 1. Conversation inferred when streamed, named when not (both ways are covered).
    const run = await runAgent(client(gw.url), {
      question: 'What does Tollgate meter?',
      stream,
      conversation: stream ? undefined : 'conv-fallback',
      toolResult: result,
    });
    t.equal(run.turns.length, 3, 'two tool rounds, then the final turn');
    const final = run.turns[2]!;

    // 2. The final request reached the model without tools, and its tool calls did not come out.
    const reqs = chatRequests(upstream);
    t.equal(reqs.length, 3);
    t.notOk('tools' in reqs[2]!);
    t.same(final.toolCalls, [], 'no tool calls reach the client');
    t.not(final.finishReason, 'tool_calls');

    // 3. The excerpt: first line says unverified evidence, not an answer; both results quoted.
    t.equal(final.content.split('\n')[0], EXCERPT_FIRST_LINE);
    t.match(final.content.split('\n')[0]!, /unverified evidence, not an answer/i);
    t.match(final.content, /EVIDENCE<\{"q":"again"\}> Tollgate meters tokens and money\./);
    t.equal((final.content.match(/\[\d\] tool search/g) ?? []).length, 2, 'both tool results are in the excerpt');

    // 4. Labelled as a fallback, on a final turn.
    t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
    t.equal(final.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
    // 5. A whole answer says what the turn used, as any completion does: the model read the prompt
    // and wrote a call that was dropped.
    if (!stream) {
      const u = final.usage;
      t.ok(u !== null && u.prompt_tokens > 0 && u.completion_tokens > 0, `usage of the turn: ${JSON.stringify(u)}`);
      t.equal(u?.total_tokens, (u?.prompt_tokens ?? 0) + (u?.completion_tokens ?? 0));
    }
  });

  t.test(`a final turn that writes a line and then proposes tools again → the excerpt too (${mode})`, async (t) => {
    // "Let me search once more." plus a call is no answer (SPEC §5: "proposes tools again").
    const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'search', arguments: '{"q":"again"}' }], toolCallText: 'Let me search once more.' });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
    const run = await runAgent(client(gw.url), { question: 'What does Tollgate meter?', stream, conversation: `conv-text-then-tools-${mode}`, toolResult: result });
    t.equal(run.turns.length, 2, 'one tool round, then the final turn');
    const final = run.turns[1]!;
    t.same(final.toolCalls, [], 'no tool calls reach the client');
    t.not(final.finishReason, 'tool_calls');
    t.match(final.content, /EVIDENCE<\{"q":"again"\}> Tollgate meters tokens and money\./, 'the tool result is in the answer');
    if (stream) {
      // The line had already gone out when the call came: the excerpt follows it, labelled.
      t.ok(final.content.startsWith('Let me search once more.\n\n' + EXCERPT_FIRST_LINE), 'the streamed line, then the excerpt under its first line');
      const rows = [];
      for await (const r of gw.ledger.exportRows(null, null)) rows.push(r);
      t.equal(rows.at(-1)?.fallback, true, 'the ledger marks the turn as answered with the excerpt');
    } else {
      t.equal(final.content.split('\n')[0], EXCERPT_FIRST_LINE, 'the excerpt in place of the line');
      t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
    }
    t.equal(await metricValue(gw.registry, 'tollgate_fallback_total'), 1);
  });

  t.test(`the final-answer upstream failing → evidence excerpt, 200 (${mode})`, async (t) => {
    const upstream = await startOpenAiDouble({ completionTokens: 4, toolCalls: searchWhileOffered });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
    const c = client(gw.url);
    const conversation = 'conv-fail';
    const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Where is the price table?' }];

    // 1. One tool round goes through normally.
    const first = await turn(c, messages, { stream, conversation });
    t.equal(first.toolCalls.length, 1);
    messages.push({
      role: 'assistant',
      content: null,
      tool_calls: first.toolCalls.map((x) => ({ id: x.id, type: 'function' as const, function: { name: x.name, arguments: x.arguments } })),
    });
    messages.push({ role: 'tool', tool_call_id: first.toolCalls[0]!.id, content: 'pricing/price-table.ts wraps genai-prices' });

    // 2. The upstream now fails every request; the final turn still answers 200 with the excerpt.
    upstream.options.failWith = { status: 500, body: { error: { message: 'upstream exploded', type: 'server_error', code: null } } };
    const final = await turn(c, messages, { stream, conversation });
    t.equal(chatRequests(upstream).length, 2, 'the final turn did reach the upstream (once: no retry)');
    t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
    t.equal(final.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
    t.equal(final.content.split('\n')[0], EXCERPT_FIRST_LINE);
    t.match(final.content, /pricing\/price-table\.ts wraps genai-prices/);
    t.same(final.toolCalls, []);
    if (!stream) t.same(final.usage, { prompt_tokens: 0, completion_tokens: 0, total_tokens: 0 }, 'its usage: nothing used');
    // 3. Nothing was generated: the whole reservation of the failed turn is refunded (SPEC §2.7).
    const reserved = Number(final.headers.get('x-tollgate-reserved-tokens'));
    t.ok(reserved > 0);
    t.equal(final.headers.get('x-tollgate-charge-tokens'), '0');
    t.equal(Number(final.headers.get('x-tollgate-refund-tokens')), reserved);
    // 4. The ledger records what the client got: a 200 answered with the excerpt.
    const rows: Array<{ status: number; fallback: boolean }> = [];
    for await (const r of gw.ledger.exportRows(null, null)) rows.push(r as unknown as { status: number; fallback: boolean });
    t.match(rows.at(-1), { status: 200, fallback: true });
    // 5. The output metrics add up: what was reserved was generated or refunded, no more (the
    // prompt's charge came back too, but it is no output).
    const reservedOut = await metricValue(gw.registry, 'tollgate_output_tokens_total', { kind: 'reserved' });
    const generated = await metricValue(gw.registry, 'tollgate_output_tokens_total', { kind: 'generated' });
    const refunded = await metricValue(gw.registry, 'tollgate_output_tokens_total', { kind: 'refunded' });
    t.equal(generated + refunded, reservedOut, `reserved ${reservedOut} = generated ${generated} + refunded ${refunded}`);
  });
}

t.test('the fallback excerpt is byte-bounded even when the tool results are huge', async (t) => {
  const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'fetch', arguments: '{}' }] });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 2 } });
  const big = 'x'.repeat(50_000);
  const run = await runAgent(client(gw.url), { question: 'Fetch everything', stream: false, toolResult: () => `${big} end` });
  const final = run.turns.at(-1)!;
  t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  t.ok(Buffer.byteLength(final.content) <= 8192, `excerpt has ${Buffer.byteLength(final.content)} bytes`);
  t.match(final.content, /\[…cut: \d+ bytes in full\]/);
});

for (const stream of [false, true]) {
  t.test(`tool-call markup written as text in the final turn is stripped → excerpt (${stream ? 'streamed' : 'non-streamed'})`, async (t) => {
    // The final turn has no tools, so this model writes its call into the text (Hermes style).
    const upstream = await startOpenAiDouble({ completionTokens: 2, toolCalls: searchWhileOffered, word: '<tool_call>{"name":"search","arguments":{"q":"more"}}</tool_call>' });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
    const run = await runAgent(client(gw.url), { question: 'Look it up', stream, toolResult: () => 'found: 42' });
    const final = run.turns.at(-1)!;
    t.equal(run.turns.length, 2);
    t.notMatch(final.content, /tool_call/);
    t.equal(final.content.split('\n')[0], EXCERPT_FIRST_LINE);
    t.match(final.content, /found: 42/);
    t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
  });
}

for (const stream of [false, true]) {
  for (const [label, failWith] of [
    ['an error object in a 200', { status: 200, body: { error: { message: 'No endpoints found', code: 404 } } }],
    ['a body that is not JSON', { status: 200, body: '<html>oops</html>' }],
  ] as const) {
    t.test(`a final turn answered with ${label} → the evidence excerpt, 200, nothing charged (${stream ? 'streamed' : 'non-streamed'})`, async (t) => {
      const upstream = await startOpenAiDouble({ completionTokens: 4, toolCalls: searchWhileOffered });
      t.teardown(upstream.close);
      const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
      const c = client(gw.url);
      const messages: Parameters<typeof turn>[1] = [{ role: 'user', content: 'Where is the price table?' }];
      const first = await turn(c, messages, { stream, conversation: 'conv-bad' });
      messages.push({ role: 'assistant', content: null, tool_calls: first.toolCalls.map((x) => ({ id: x.id, type: 'function' as const, function: { name: x.name, arguments: x.arguments } })) });
      messages.push({ role: 'tool', tool_call_id: first.toolCalls[0]!.id, content: 'pricing/price-table.ts wraps genai-prices' });
      upstream.options.failWith = failWith;
      const final = await turn(c, messages, { stream, conversation: 'conv-bad' });
      t.equal(final.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
      t.equal(final.content.split('\n')[0], EXCERPT_FIRST_LINE);
      t.equal(final.headers.get('x-tollgate-charge-tokens') ?? '0', '0');
      t.equal(chatRequests(upstream).length, 2, 'the final turn reached the upstream once: no retries');
    });
  }
}

// Regression: a client that asked for structured output got the excerpt as content, which is no
// JSON, and the SDK's parse helper threw on it. It is the message's refusal now.
for (const stream of [false, true]) {
  t.test(`a final turn of a request for structured output falls back to the excerpt as a refusal (${stream ? 'streamed' : 'non-streamed'})`, async (t) => {
    const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'search', arguments: '{"q":"again"}' }] });
    t.teardown(upstream.close);
    const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
    const sdk = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
    const body = {
      model: 'gpt-4o-mini',
      max_tokens: 100,
      messages: [
        { role: 'user' as const, content: 'What does Tollgate meter?' },
        { role: 'assistant' as const, content: null, tool_calls: [{ id: 'c1', type: 'function' as const, function: { name: 'search', arguments: '{"q":"tollgate"}' } }] },
        { role: 'tool' as const, tool_call_id: 'c1', content: 'Tollgate meters tokens and money.' },
      ],
      tools: [{ type: 'function' as const, function: { name: 'search', strict: true, parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'], additionalProperties: false } } }],
      response_format: { type: 'json_schema' as const, json_schema: { name: 'answer', strict: true, schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['a'], additionalProperties: false } } },
    };
    const message = stream
      ? (await sdk.chat.completions.stream(body).finalChatCompletion()).choices[0]!.message
      : (await sdk.chat.completions.parse(body)).choices[0]!.message;
    t.equal(message.content, null, 'no content to parse');
    t.equal(message.refusal?.split('\n')[0], EXCERPT_FIRST_LINE, 'the labelled excerpt, as a refusal');
    t.match(message.refusal ?? '', /Tollgate meters tokens and money\./);
    if (!stream) t.equal((message as { parsed?: unknown }).parsed, null, 'parse() gives no parsed value, and does not throw');
  });
}

// Review: text that had already gone out when the final turn proposed tools again was followed by
// the excerpt as content, and the SDK's stream helper threw parsing it all as JSON.
t.test('a streamed final turn for structured output that wrote text, then proposed tools: the excerpt follows as a refusal', async (t) => {
  const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'search', arguments: '{"q":"again"}' }], toolCallText: 'Let me search once more.' });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], runs: { maxToolRounds: 1 } });
  const sdk = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const message = (
    await sdk.chat.completions
      .stream({
        model: 'gpt-4o-mini',
        max_tokens: 100,
        messages: [
          { role: 'user', content: 'What does Tollgate meter?' },
          { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"tollgate"}' } }] },
          { role: 'tool', tool_call_id: 'c1', content: 'Tollgate meters tokens and money.' },
        ],
        tools: [{ type: 'function', function: { name: 'search', strict: true, parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'], additionalProperties: false } } }],
        response_format: { type: 'json_schema', json_schema: { name: 'answer', strict: true, schema: { type: 'object', properties: { a: { type: 'string' } }, required: ['a'], additionalProperties: false } } },
      })
      .finalChatCompletion()
  ).choices[0]!.message;
  t.equal(message.content, 'Let me search once more.', 'the text that went out');
  t.match(message.refusal ?? '', new RegExp(EXCERPT_FIRST_LINE.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')), 'then the excerpt, as a refusal');
  t.equal((message as { parsed?: unknown }).parsed, null, 'and nothing parsed, nothing thrown');
});
