// The gateway in front of a llama.cpp server (the double built from the recorded fixtures):
// pre-counts equal the server's own prompt_tokens, the turn-1 → turn-2 charge is reported beside the
// server's prompt_n with the divergence metric, and a 3-row prompt array counts as 3 rows even
// though llama.cpp's usage reports row 0 only.

import t from 'tap';
import { readFileSync } from 'node:fs';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, llamaUpstream, metricValue } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';
import { HOUR_MS, steppableWallClock } from '../helpers/wall-clock.js';

const fixtures = new URL('../../../shared/fixtures/llamacpp/', import.meta.url);
const fixture = (name: string) => JSON.parse(readFileSync(new URL(name, fixtures), 'utf8')) as Record<string, unknown>;

type Json = Record<string, unknown>;

t.test('turn 1 → turn 2 of the recorded conversation', async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const post = (body: Json) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'recorded' }, body: JSON.stringify(body) });

  const turn1 = fixture('chat-nonstream.request.json');
  const r1 = await post(turn1);
  const b1 = (await r1.json()) as { usage: { prompt_tokens: number }; choices: Array<{ message: { content: string } }> };
  t.equal(r1.status, 200);
  t.equal(b1.usage.prompt_tokens, 34, 'the server read 34 prompt tokens');
  t.equal(Number(r1.headers.get('x-tollgate-reserved-tokens')) - 16, 34, 'pre-count 34 + allowance 16');
  t.equal(r1.headers.get('x-tollgate-count-method'), 'llamacpp');

  const turn2 = fixture('chat-second-turn.request.json');
  const r2 = await post(turn2);
  const b2 = (await r2.json()) as { usage: { prompt_tokens: number }; timings: { prompt_n: number; cache_n: number } };
  t.equal(b2.usage.prompt_tokens, 69);
  const shared = Number(r2.headers.get('x-tollgate-shared-prefix-tokens'));
  // The system and user messages of turn 1, rendered whole ("…France?<|im_end|>\n"): 30 of turn
  // 1's 34 tokens; the reply priming "<|im_start|>assistant\n" (4 tokens) is not a message.
  t.equal(shared, 30, 'system + user message shared, reply priming excluded');
  const reserved = Number(r2.headers.get('x-tollgate-reserved-tokens'));
  t.equal(reserved - 16, 69 - (shared - 16), 'charge = 69 − (shared − 16)');

  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  const second = rows[1];
  t.equal(second.prompt_charge, 69 - (shared - 16));
  t.equal(second.upstream_prompt_tokens, 69);
  t.equal(second.upstream_prompt_n, b2.timings.prompt_n, "the server's own evaluated count is recorded");
  t.equal(second.upstream_cache_n, b2.timings.cache_n);
  const observed = await metricValue(gw.registry, 'tollgate_charge_divergence_tokens');
  t.equal(observed, 34 - rows[0].upstream_prompt_n! + second.prompt_charge - b2.timings.prompt_n, 'divergence = Σ(charge − prompt_n)');
});

t.test('a template that prints the date: the next day, the earlier messages are read again, and not credited', async (t) => {
  let today = '29 Nov 2026';
  const llama = await startLlamaCppDouble({ systemPreamble: () => `Cutting Knowledge Date: December 2023\nToday Date: ${today}\n\n` });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const headers = { 'content-type': 'application/json', 'x-tollgate-conversation': 'dated' };
  const post = (body: Json) => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
  const plan = async (request: Json) =>
    (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })).json()) as { row_tokens: number[]; shared_prefix_tokens: number };

  // The same day: each turn shares the one before.
  t.equal((await post(fixture('chat-nonstream.request.json'))).status, 200);
  const turn2 = fixture('chat-second-turn.request.json') as Json & { messages: Json[] };
  const r2 = await post(turn2);
  t.ok(Number(r2.headers.get('x-tollgate-shared-prefix-tokens')) > 30, `the same day, turn 1's messages are shared (${r2.headers.get('x-tollgate-shared-prefix-tokens')})`);
  const reply = ((await r2.json()) as { choices: Array<{ message: Json }> }).choices[0]!.message;
  const turn3 = { ...turn2, messages: [...turn2.messages, { role: 'assistant', content: reply.content }, { role: 'user', content: 'And of Italy?' }] };
  const sameDay = await plan(turn3);
  t.ok(sameDay.shared_prefix_tokens > 60, `and turn 2's (${sameDay.shared_prefix_tokens})`);

  today = '30 Nov 2026';
  const nextDay = await plan(turn3);
  t.same(nextDay.row_tokens, sameDay.row_tokens, 'the new date counts the same');
  t.equal(nextDay.shared_prefix_tokens, 0, 'but renders other tokens before the first message: nothing shared');
  const r3 = await post(turn3);
  t.equal(r3.headers.get('x-tollgate-shared-prefix-tokens'), '0');
  const b3 = (await r3.json()) as { timings: { cache_n: number } };
  t.ok(b3.timings.cache_n < 16, `the server itself reused only what precedes the date (${b3.timings.cache_n} tokens)`);
});

t.test('pre-counts equal the recorded prompt_tokens', async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  for (const name of ['chat-nonstream', 'chat-second-turn', 'chat-tools', 'chat-other-conversation', 'chat-third-turn-after-interleave']) {
    const request = fixture(`${name}.request.json`);
    const recorded = fixture(`${name}.response.json`) as { usage: { prompt_tokens: number } };
    const res = await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) });
    const plan = (await res.json()) as { row_tokens: number[]; count_method: string };
    t.equal(plan.row_tokens[0], recorded.usage.prompt_tokens, `${name}: ${recorded.usage.prompt_tokens}`);
    t.equal(plan.count_method, 'llamacpp');
  }
});

t.test('a prompt array of 3 rows is 3 rows, whatever llama.cpp usage says', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 4 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const body = { model: 'tiny', prompt: ['The quick brown fox', 'jumps over the lazy dog and', 'runs'], max_tokens: 4 };
  const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/completions', request: body }) })).json()) as Json;
  t.equal(plan.rows, 3);
  t.equal((plan.row_tokens as number[]).length, 3);
  t.equal((plan.charge as Json).allowance, 12, 'allowance = 4 × 3 rows');
  const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  const out = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number }; choices: unknown[] };
  t.equal(out.choices.length, 3);
  // llama.cpp's own usage counts row 0 alone; an outside audit found it passed on to the client.
  t.match(out.usage, { prompt_tokens: plan.sum_tokens, completion_tokens: 12, total_tokens: (plan.sum_tokens as number) + 12 }, "the gateway's figures for every row");
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows[0].rows, 3);
  t.equal(rows[0].prompt_tokens, plan.sum_tokens);
  t.equal(rows[0].generated_tokens, 12, 'the gateway counted every row’s output itself');
});

t.test('a llama.cpp chat answer with n > 1 gives the client the figures of every choice', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 4, slots: 3 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hello there' }], n: 3, max_tokens: 4 }) });
  const out = (await res.json()) as { usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number }; choices: unknown[] };
  t.equal(out.choices.length, 3);
  const charged = Number(res.headers.get('x-tollgate-charge-tokens'));
  t.equal(out.usage.completion_tokens, 12, 'every choice: 3 × 4');
  t.equal(out.usage.total_tokens, out.usage.prompt_tokens + 12);
  t.ok(charged <= out.usage.total_tokens, `the charge (${charged}) is within what the usage says was read and written`);
});

// Regression (nineteenth session): a llama.cpp stream was metered a token a chunk, and its tool
// calls come in pieces of several tokens: with n = 2, a streamed call settled 16 tokens where the
// same answer whole settled 48 and the server says choice 0 alone wrote 45. And a whole answer's
// text was counted as a prompt is, with the start-of-text token a model with one would add.
t.test('llama.cpp tool calls are counted as the text they are, streamed or whole, never under choice 0 alone', async (t) => {
  const spec = { name: 'get_weather', arguments: '{"city": "Paris, France", "unit": "celsius", "days": 3}' };
  const llama = await startLlamaCppDouble({ toolCalls: spec, slots: 2 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const body = {
    model: 'tiny',
    messages: [{ role: 'user', content: 'Weather in Paris?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
    n: 2,
    max_tokens: 100,
  };
  const send = (extra: Json, conversation: string) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation }, body: JSON.stringify({ ...body, ...extra }) });
  await (await send({ stream: true, stream_options: { include_usage: true } }, 'streamed')).text();
  await (await send({}, 'whole')).json();
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  const streamed = rows.find((r) => r.conversation === 'streamed')!;
  const whole = rows.find((r) => r.conversation === 'whole')!;
  const callTokens = llama.tokenize(spec.name + spec.arguments).length;
  const firstChoice = llama.tokenize(`<tool_call>\n{"name": "${spec.name}", "arguments": ${spec.arguments}}\n</tool_call>`).length;
  t.equal(streamed.upstream_completion_tokens, firstChoice, "the server's figure: choice 0 alone, markup and all");
  // Choice 1 wrote the same call, in the same markup, which the server's parser held back from it
  // too: what choice 0's figure shows past its text, a call, is taken for choice 1's call.
  t.ok(callTokens < firstChoice);
  t.equal(whole.generated_tokens, 2 * firstChoice, "whole: choice 0 at the server's figure for it, choice 1's call with the same markup");
  t.equal(streamed.generated_tokens, whole.generated_tokens, 'streamed: the same, not a token a chunk');
  t.ok(streamed.generated_tokens! > 16, `${streamed.generated_tokens} tokens, not the 16 chunks`);
  // The answer's text was asked of /tokenize as output: no start-of-text token added.
  const counted = llama.requests.filter((r) => r.path === '/tokenize' && (r.body as Json).content === spec.name + spec.arguments);
  t.ok(counted.length > 0, 'the calls were counted with the server');
  t.ok(counted.every((r) => (r.body as Json).add_special === false), 'as generated text');
});

// Regression (twentieth session): the server's figure for choice 0 was a floor under the count of
// every choice together, so choice 1's tokens vanished under it: a floor under choice 0's own.
t.test("a llama.cpp figure for choice 0 alone is a floor under the gateway's count of that choice, not of every choice", async (t) => {
  // A short call: its text is a few tokens; the markup the server's parser held back is most of it.
  const llama = await startLlamaCppDouble({ toolCalls: { name: 'f', arguments: '{}' }, slots: 2 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'go' }], tools: [{ type: 'function', function: { name: 'f' } }], n: 2, max_tokens: 100, stream: true, stream_options: { include_usage: true } }),
  });
  await res.text();
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  const firstChoice = llama.tokenize('<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>').length;
  const callTokens = llama.tokenize('f{}').length;
  t.ok(2 * callTokens < firstChoice, 'the calls as text are less than choice 0 alone');
  t.equal(rows[0]!.generated_tokens, 2 * firstChoice, "choice 0 at the server's figure, choice 1's call with the markup choice 0's figure shows a call has");
  t.equal(rows[0]!.output_method, 'provider', "the server's figure was the larger for choice 0");
});

// Regression (twentieth session, a review): with no choice numbered 0 (a proxy that counts from 1),
// the server's figure was added whole on top of the count of every choice.
t.test("a llama.cpp answer with no choice numbered 0: the server's figure floors the whole count, not added to it", async (t) => {
  const { createServer } = await import('node:http');
  const llama = await startLlamaCppDouble({ completionTokens: 7, slots: 2 });
  t.teardown(llama.close);
  // Passes everything through, the choices of an answer renumbered from 1.
  const proxy = createServer((req, res) => {
    let body = '';
    req.on('data', (c: Buffer) => (body += c.toString('utf8')));
    req.on('end', async () => {
      const answer = await fetch(`${llama.url}${req.url}`, { method: req.method, headers: { 'content-type': 'application/json' }, body: req.method === 'GET' ? undefined : body });
      const text = await answer.text();
      let out = text;
      try {
        const json = JSON.parse(text) as Json;
        if (Array.isArray(json.choices)) out = JSON.stringify({ ...json, choices: (json.choices as Json[]).map((c) => ({ ...c, index: (c.index as number) + 1 })) });
      } catch {
        // not JSON: as it came
      }
      res.writeHead(answer.status, { 'content-type': answer.headers.get('content-type') ?? 'application/json' }).end(out);
    });
  });
  await new Promise<void>((resolve) => proxy.listen(0, '127.0.0.1', resolve));
  t.teardown(() => new Promise<void>((resolve) => proxy.close(() => resolve())));
  const port = (proxy.address() as { port: number }).port;
  const gw = await startGateway(t, { upstreams: [llamaUpstream(`http://127.0.0.1:${port}`)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', messages: [{ role: 'user', content: 'Hello there' }], n: 2, max_tokens: 20 }) });
  t.equal(res.status, 200);
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows[0]!.upstream_completion_tokens, 7, "the server's figure: one choice's");
  t.equal(rows[0]!.generated_tokens, 14, 'both choices as the gateway counted them, the figure not added on top');
});

// Regression (twentieth session): the count of an answer's text asked the server's /tokenize with no
// bound of its own, before the client had its answer (a stream's end, a whole answer's body): a
// server stuck on it held both for the upstream's timeoutMs, 10 minutes by default.
t.test("an answer waits on the server's /tokenize for its count only within a bound, then is counted without it", async (t) => {
  const llama = await startLlamaCppDouble({ toolCalls: { name: 'lookup', arguments: '{"q": "tides at Brest"}' }, slots: 2, stallGeneratedTokenize: true });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] }, { answerCountTimeoutMs: 300 });
  const body = { model: 'tiny', messages: [{ role: 'user', content: 'Tides?' }], tools: [{ type: 'function', function: { name: 'lookup' } }], n: 2, max_tokens: 100 };
  const send = (extra: Json, conversation: string) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conversation }, body: JSON.stringify({ ...body, ...extra }) });
  const streamed = await send({ stream: true, stream_options: { include_usage: true } }, 'streamed');
  t.equal(streamed.status, 200);
  t.match(await streamed.text(), /data: \[DONE\]/, 'the stream ended');
  const whole = await send({}, 'whole');
  t.equal(whole.status, 200);
  t.equal(((await whole.json()) as { choices: unknown[] }).choices.length, 2, 'the whole answer came');
  const asked = llama.requests.filter((r) => r.path === '/tokenize' && (r.body as Json).add_special === false);
  t.ok(asked.length >= 2, 'the server was asked, and never answered');
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  const firstChoice = llama.tokenize('<tool_call>\n{"name": "lookup", "arguments": {"q": "tides at Brest"}}\n</tool_call>').length;
  for (const conversation of ['streamed', 'whole']) {
    const row = rows.find((r) => r.conversation === conversation);
    t.equal(row?.status, 200, `${conversation}: settled`);
    t.ok(row!.generated_tokens! > firstChoice, `${conversation}: ${row!.generated_tokens} tokens, choice 0's ${firstChoice} and choice 1's counted without the server`);
  }
});

t.test("a llama.cpp embeddings answer's usage, which counts every input, goes as the server wrote it", async (t) => {
  const llama = await startLlamaCppDouble({ embeddings: true });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const direct = (await (await fetch(`${llama.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', input: ['First input row.', 'Second, somewhat longer input row here.'] }) })).json()) as { usage: Json };
  const res = await fetch(`${gw.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', input: ['First input row.', 'Second, somewhat longer input row here.'] }) });
  t.equal(res.status, 200);
  t.same(((await res.json()) as { usage: Json }).usage, direct.usage, 'no completion_tokens added, no figure changed');
});

// An outside audit: llama.cpp writes a completion's usage and timings into its finishing chunk;
// passed on, the client had the usage twice (there and in the gateway's usage chunk), and for a
// prompt array the figures of row 0 alone.
t.test('a streamed llama.cpp completion gives its usage once, in the last chunk, with the figures of every row', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 4 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  for (const prompt of ['The quick brown fox', ['The quick brown fox', 'jumps over the lazy dog and']]) {
    const body = { model: 'tiny', prompt, max_tokens: 4, stream: true, stream_options: { include_usage: true } };
    const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/completions', request: body }) })).json()) as Json;
    const res = await fetch(`${gw.url}/v1/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    t.equal(res.status, 200);
    const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as Json);
    const withUsage = events.filter((e) => e.usage !== null && e.usage !== undefined);
    t.equal(withUsage.length, 1, `one chunk with usage (${JSON.stringify(prompt).length} bytes of prompt)`);
    t.same(withUsage[0]!.choices, [], 'the last, with no choices, as OpenAI sends it');
    t.ok(events.slice(0, -1).every((e) => e.usage === null || e.usage === undefined), 'no other chunk has figures');
    t.notOk(events.slice(0, -1).some((e) => 'timings' in e), 'the timings ride on the usage chunk alone');
    const rows = Array.isArray(prompt) ? prompt.length : 1;
    t.match(withUsage[0]!.usage, { prompt_tokens: plan.sum_tokens, completion_tokens: 4 * rows, total_tokens: (plan.sum_tokens as number) + 4 * rows }, 'the figures of every row');
  }
});

t.test('llama.cpp context overflow passes through, normalised, and refunds everything', async (t) => {
  const llama = await startLlamaCppDouble({ nCtx: 64 });
  t.teardown(llama.close);
  // The window is configured larger than the server's, so the server's own 400 is what answers.
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url, { contextWindow: 100000 })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', max_tokens: 4, messages: [{ role: 'user', content: ' word'.repeat(100) }] }) });
  t.equal(res.status, 400);
  const body = (await res.json()) as { error: Json };
  t.equal(body.error.code, 'exceed_context_size_error');
  t.equal(body.error.type, 'exceed_context_size_error');
  t.equal(body.error.param, null);
  t.equal(body.error.n_ctx, 64);
  t.equal(typeof body.error.n_prompt_tokens, 'number');
  t.equal(Number(res.headers.get('x-tollgate-charge-tokens')), 0);
});

t.test("llama.cpp's timings reach a streaming client where the server puts them", async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const events = async (request: Json) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(request) });
    t.equal(res.status, 200);
    return (await res.text())
      .split('\n\n')
      .filter((e) => e.startsWith('data: {'))
      .map((e) => JSON.parse(e.slice(6)) as Json & { choices: Array<{ finish_reason: string | null }> });
  };
  // With usage asked for: on the usage chunk (fixture chat-stream).
  const withUsage = await events(fixture('chat-stream.request.json'));
  const usageChunk = withUsage.at(-1)!;
  t.same(usageChunk.choices, []);
  t.ok(usageChunk.usage, 'the usage chunk');
  t.match(usageChunk.timings, { prompt_n: Number, cache_n: Number, predicted_n: Number }, 'carries the timings');
  // Without: on the finish chunk (fixture chat-stream-no-include-usage), and no usage chunk.
  const without = await events(fixture('chat-stream-no-include-usage.request.json'));
  const last = without.at(-1)!;
  t.equal(last.choices[0]?.finish_reason, 'length', 'the last chunk finishes the choice');
  t.match(last.timings, { prompt_n: Number, cache_n: Number, predicted_n: Number }, 'and carries the timings');
  t.notOk(without.some((e) => e.usage), 'no usage chunk the client did not ask for');
});

t.test("an embeddings input past llama.cpp's batch size: its 500 is passed on once, marked final, and the SDK does not retry it", async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 2 });
  const embeddingsCalls = () => llama.requests.filter((r) => r.path === '/v1/embeddings').length;
  let status: number | undefined;
  let message = '';
  try {
    await client.embeddings.create({ model: 'tiny', input: [Array.from({ length: 600 }, (_, i) => i % 100)] });
  } catch (err) {
    status = (err as { status?: number }).status;
    message = (err as Error).message;
  }
  t.equal(status, 500, "the server's own status");
  t.match(message, /too large to process/);
  t.equal(embeddingsCalls(), 1, 'one call reached the server: no retries');
});

t.test("the allowance reaches llama.cpp as max_tokens, the field it reads: a client's max_completion_tokens is renamed, its n_predict dropped", async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 40 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const chat = fixture('chat-nonstream.request.json');
  const { max_tokens: _omit, ...rest } = chat as Json & { max_tokens?: unknown };
  for (const [label, extra] of [
    ['max_completion_tokens', { max_completion_tokens: 4 }],
    ['n_predict beside max_tokens', { max_tokens: 4, n_predict: 50 }],
  ] as const) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...rest, ...extra }) });
    const body = (await res.json()) as { usage: { completion_tokens: number } };
    t.equal(res.status, 200, label);
    const sent = llama.requests.filter((r) => r.path === '/v1/chat/completions').at(-1)!.body as Json;
    t.equal(sent.max_tokens, 4, `${label}: forwarded as max_tokens`);
    t.notOk('max_completion_tokens' in sent || 'n_predict' in sent, `${label}: no other field that llama.cpp would read instead`);
    t.equal(body.usage.completion_tokens, 4, `${label}: the server wrote no more than the allowance`);
  }
});

t.test("a llama.cpp server started without --embeddings: its 501 is passed on once, marked final", async (t) => {
  const llama = await startLlamaCppDouble({ embeddings: false });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const { default: OpenAI } = await import('openai');
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 2 });
  const status = await client.embeddings.create({ model: 'tiny', input: 'hello' }).then(
    () => null,
    (err: { status?: number; code?: unknown }) => [err.status, err.code],
  );
  t.same(status, [501, 'not_supported_error'], "the server's own status, its type as the code");
  t.equal(llama.requests.filter((r) => r.path === '/v1/embeddings').length, 1, 'no retries');
});

t.test("the pre-count renders the template with the request's template fields, so it stays the server's own count", async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const tools = [{ type: 'function', function: { name: 'search', description: 'Search the web', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];
  const base = { ...fixture('chat-nonstream.request.json'), max_tokens: 4 };
  for (const [label, extra] of [
    ['tools with tool_choice "none"', { tools, tool_choice: 'none' }],
    ['add_generation_prompt false', { add_generation_prompt: false }],
  ] as const) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ ...base, ...extra }) });
    const body = (await res.json()) as { usage: { prompt_tokens: number } };
    t.equal(res.status, 200, label);
    t.equal(Number(res.headers.get('x-tollgate-reserved-tokens')) - 4, body.usage.prompt_tokens, `${label}: the pre-count is the server's prompt_tokens (${body.usage.prompt_tokens})`);
  }
});

t.test("a llama.cpp server's window is learnt again after a minute of this process, not by the wall clock (regression)", async (t) => {
  const wall = steppableWallClock(t);
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const post = () =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', max_tokens: 8, messages: [{ role: 'user', content: 'hi' }] }) });
  const props = () => llama.requests.filter((r) => r.path === '/props').length;
  t.equal((await post()).status, 200);
  const learnt = props();
  t.ok(learnt >= 1, 'the window was learnt from /props');
  // A step of the wall clock is no minute passing (one back would have kept the window for an hour).
  wall.step(HOUR_MS);
  t.equal((await post()).status, 200);
  t.equal(props(), learnt, 'not asked again');
});

// An audit (twenty-second session): a /tokenize that answered ids without their pieces (as no
// recording shows for the gateway's `add_special: true, with_pieces: true`) sent the count to the
// byte estimate, though the ids are the exact count.
t.test('a /tokenize that ignores with_pieces still counts exactly; nothing is taken as shared', async (t) => {
  const llama = await startLlamaCppDouble({ ignoreWithPieces: true, completionTokens: 4 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const messages: Json[] = [{ role: 'user', content: 'What is the capital of France?' }];
  const send = () =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'ids' }, body: JSON.stringify({ model: 'tiny', messages, max_tokens: 8 }) });
  const first = await send();
  const answer = (await first.json()) as { choices: Array<{ message: Json }>; usage: { prompt_tokens: number } };
  t.equal(first.headers.get('x-tollgate-count-method'), 'llamacpp', 'the ids are the exact count');
  t.equal(Number(first.headers.get('x-tollgate-reserved-tokens')), answer.usage.prompt_tokens + 8, "the server's own prompt figure, and the allowance");
  messages.push(answer.choices[0]!.message, { role: 'user', content: 'And of Spain?' });
  const second = await send();
  const usage = ((await second.json()) as { usage: { prompt_tokens: number } }).usage;
  t.equal(second.headers.get('x-tollgate-count-method'), 'llamacpp');
  t.equal(second.headers.get('x-tollgate-shared-prefix-tokens'), '0', 'where each message ends cannot be told: nothing shared');
  t.equal(Number(second.headers.get('x-tollgate-reserved-tokens')), usage.prompt_tokens + 8, 'charged in full');
});
