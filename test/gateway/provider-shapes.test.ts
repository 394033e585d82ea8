// What providers other than OpenAI write, metered and relayed as faithfully as OpenAI's own shapes
// (SPEC §2.6, §4, §7): reasoning under `reasoning` (OpenRouter, Groq, vLLM), refusals, legacy
// `function_call` deltas, reasoning counted beside `completion_tokens` (xAI), data split over
// several `data:` lines, Azure's id-less first chunk, keep-alive comments, and choices past `n`.
// The upstream is a scripted HTTP server: each test writes its bytes as a provider would.

import t, { type Test } from 'tap';
import { createServer, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import OpenAI from 'openai';
import { startGateway, openaiUpstream, type TestGateway } from '../helpers/gateway.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import type { LedgerRow } from '../../metering/ledger.js';

type Json = Record<string, unknown>;
/**
 * What the scripted upstream writes for the request it got: its pieces, a few ms apart, then it
 * ends the response (or resets the connection, or holds it open).
 */
type Script = (body: Json) => { stream: boolean; pieces: string[]; then?: 'end' | 'reset' | 'hold'; status?: number; type?: string; headers?: Record<string, string> };

const o200k = new TiktokenCounter('o200k_base');
const ID = { id: 'chatcmpl-abc', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o-mini' };
const chunk = (delta: Json, extra: Json = {}, index = 0) => `data: ${JSON.stringify({ ...ID, choices: [{ index, delta, finish_reason: null }], ...extra })}\n\n`;
const finish = (reason = 'stop', index = 0) => `data: ${JSON.stringify({ ...ID, choices: [{ index, delta: {}, finish_reason: reason }] })}\n\n`;
const DONE = 'data: [DONE]\n\n';

async function scripted(t: Test, script: Script, config: Json = {}, upstream: Json = {}): Promise<{ gw: TestGateway; sent: Json[] }> {
  const sent: Json[] = [];
  const server: Server = createServer((req, res) => {
    let text = '';
    req.on('data', (c: Buffer) => (text += c.toString()));
    req.on('end', async () => {
      const body = JSON.parse(text) as Json;
      sent.push(body);
      const { stream, pieces, then = 'end', status = 200, type, headers = {} } = script(body);
      res.writeHead(status, { 'content-type': type ?? (stream ? 'text/event-stream' : 'application/json'), ...headers });
      for (const piece of pieces) {
        if (res.destroyed) return;
        res.write(piece);
        await new Promise((r) => setTimeout(r, 2));
      }
      if (then === 'end') res.end();
      else if (then === 'reset') res.socket?.resetAndDestroy();
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { billing: 'local', ...upstream })], ...config });
  return { gw, sent };
}

async function rows(gw: TestGateway): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const r of gw.ledger.exportRows(null, null)) out.push(r);
  return out;
}

async function post(gw: TestGateway, body: Json): Promise<{ text: string; headers: Headers }> {
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
  return { text: await res.text(), headers: res.headers };
}

/** The data events of a stream, parsed (each must be one `data: ` line of JSON, or [DONE]). */
function dataEvents(t: Test, text: string): Json[] {
  const events: Json[] = [];
  for (const event of text.split('\n\n')) {
    if (!event.startsWith('data: ') || event === 'data: [DONE]') continue;
    t.notOk(event.includes('\n'), 'a data event is one line');
    events.push(JSON.parse(event.slice(6)) as Json);
  }
  return events;
}

const ask = (extra: Json = {}) => ({ model: 'gpt-4o-mini', messages: [{ role: 'user' as const, content: 'Think first.' }], max_tokens: 20, ...extra });

for (const field of ['reasoning', 'refusal'] as const) {
  t.test(`a stream of \`${field}\` deltas is metered: cut at the allowance, every token counted`, async (t) => {
    const { gw } = await scripted(t, () => ({ stream: true, pieces: [...Array.from({ length: 200 }, () => chunk({ [field]: ' lorem' })), finish(), DONE] }));
    const { text } = await post(gw, ask({ stream: true }));
    const events = dataEvents(t, text);
    const written = events.map((e) => ((e.choices as Json[])[0]?.delta as Json | undefined)?.[field] ?? '').join('');
    t.equal(o200k.countOutput(written as string), 20, 'no more than the allowance reached the client');
    t.equal((events.at(-1)!.choices as Json[])[0]!.finish_reason, 'length', 'ended by the gateway');
    const [row] = await rows(gw);
    t.match(row, { generated_tokens: 20, output_method: 'tiktoken:o200k_base' });
  });
}

t.test('legacy `function_call` deltas are metered like tool calls', async (t) => {
  const { gw } = await scripted(t, () => ({
    stream: true,
    pieces: [chunk({ role: 'assistant', function_call: { name: 'lookup', arguments: '' } }), ...Array.from({ length: 100 }, () => chunk({ function_call: { arguments: ' lorem' } })), finish('function_call'), DONE],
  }));
  const { text } = await post(gw, ask({ stream: true, functions: [{ name: 'lookup', parameters: { type: 'object', properties: {} } }] }));
  const events = dataEvents(t, text);
  t.equal((events.at(-1)!.choices as Json[])[0]!.finish_reason, 'length');
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, 20);
});

t.test('custom tool call deltas are metered like function calls (regression: uncounted, never cut)', async (t) => {
  const call = (input: string, first = false) => ({ tool_calls: [{ index: 0, ...(first ? { id: 'call_1', type: 'custom' } : {}), custom: { ...(first ? { name: 'run_sql' } : {}), input } }] });
  const { gw } = await scripted(t, () => ({
    stream: true,
    pieces: [chunk({ role: 'assistant', ...call('', true) }), ...Array.from({ length: 100 }, () => chunk(call(' lorem'))), finish('tool_calls'), DONE],
  }));
  const { text } = await post(gw, ask({ stream: true, tools: [{ type: 'custom', custom: { name: 'run_sql', description: 'Run a query' } }] }));
  const events = dataEvents(t, text);
  t.equal((events.at(-1)!.choices as Json[])[0]!.finish_reason, 'length', 'cut at the allowance');
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, 20);
});

t.test('a non-streamed answer without usage counts its reasoning, refusal and function call', async (t) => {
  const message = { role: 'assistant', content: 'Yes.', reasoning: ' lorem lorem lorem', refusal: ' ipsum ipsum', function_call: { name: 'lookup', arguments: '{"q":"x"}' } };
  const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify({ ...ID, object: 'chat.completion', choices: [{ index: 0, message, finish_reason: 'stop' }] })] }));
  await post(gw, ask({ max_tokens: 50 }));
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, o200k.countOutput('Yes. lorem lorem lorem ipsum ipsumlookup{"q":"x"}'));
  t.equal(row.output_method, 'tiktoken:o200k_base');
});

t.test('reasoning a provider reports beside completion_tokens (its total says so) is output, charged', async (t) => {
  const usage = (reasoning: number, total: number) => ({ prompt_tokens: 12, completion_tokens: 5, total_tokens: total, completion_tokens_details: { reasoning_tokens: reasoning } });
  let answer = usage(30, 47);
  const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify({ ...ID, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'a b c d e' }, finish_reason: 'stop' }], usage: answer })] }));
  const first = await post(gw, ask({ max_tokens: 50 }));
  // OpenAI's way: reasoning inside completion_tokens (total = prompt + completion) — taken as is.
  answer = usage(3, 17);
  const second = await post(gw, ask({ max_tokens: 50 }));
  const [a, b] = await rows(gw);
  t.match(a, { generated_tokens: 35, output_method: 'provider' }, 'xAI: 5 + 30');
  t.match(b, { generated_tokens: 5, output_method: 'provider' }, 'OpenAI: 5, its 3 reasoning tokens among them');
  t.equal(Number(first.headers.get('x-tollgate-refund-tokens')), 15);
  t.equal(Number(second.headers.get('x-tollgate-refund-tokens')), 45);
});

t.test('data split over several `data:` lines reaches the SDK as valid events', async (t) => {
  const split = (delta: Json, reason: string | null = null) => {
    const json = JSON.stringify({ ...ID, choices: [{ index: 0, delta, finish_reason: reason }] }, null, 1);
    return `${json.split('\n').map((line) => `data: ${line}`).join('\n')}\n\n`;
  };
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [split({ role: 'assistant', content: '' }), split({ content: 'Hello' }), split({ content: ' there' }), split({}, 'stop'), DONE] }));
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const final = await client.chat.completions.stream(ask()).finalChatCompletion();
  t.equal(final.choices[0]!.message.content, 'Hello there');
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, 2);
});

t.test("Azure's first chunk (prompt filter results, an empty id) does not become the stream's id", async (t) => {
  const azureFirst = `data: ${JSON.stringify({ choices: [], created: 0, id: '', model: '', object: '', prompt_filter_results: [{ prompt_index: 0, content_filter_results: {} }] })}\n\n`;
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [azureFirst, chunk({ role: 'assistant', content: '' }), ...Array.from({ length: 40 }, () => chunk({ content: ' lorem' })), finish(), DONE] }));
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const final = await client.chat.completions.stream({ ...ask(), stream_options: { include_usage: true } }).finalChatCompletion();
  t.equal(final.id, ID.id);
  t.equal(final.choices[0]!.finish_reason, 'length', 'cut at the allowance by the gateway');
  t.match(final.usage, { completion_tokens: 20 }, "the gateway's usage chunk is merged into the answer");
});

t.test("an upstream's keep-alive comments go on at once; another Tollgate's closing figures do not", async (t) => {
  let release: () => void = () => {};
  const held = new Promise<void>((r) => (release = r));
  const server: Server = createServer((req, res) => {
    req.resume();
    req.on('end', async () => {
      res.writeHead(200, { 'content-type': 'text/event-stream' });
      res.write(': OPENROUTER PROCESSING\n\n');
      await held;
      res.end(`${chunk({ content: 'Hi' })}: tollgate {"charge_tokens":1}\n\n${finish()}${DONE}`);
    });
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => { server.closeAllConnections(); server.close(() => r()); }));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(server.address() as AddressInfo).port}`, { billing: 'local' })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask({ stream: true })) });
  t.equal(res.status, 200, 'the head came while the provider was still queueing');
  const reader = res.body!.getReader();
  const first = new TextDecoder().decode((await reader.read()).value);
  t.equal(first, ': OPENROUTER PROCESSING\n\n', 'its comment, as it came');
  release();
  let rest = '';
  for (let r = await reader.read(); !r.done; r = await reader.read()) rest += new TextDecoder().decode(r.value);
  t.equal(rest.match(/^: tollgate /gm)?.length, 1, "one closing comment: this gateway's");
  t.notMatch(rest, /"charge_tokens":1\}/);
});

t.test('a choice past n has no allowance: not passed on, not charged', async (t) => {
  const { gw } = await scripted(t, () => ({
    stream: true,
    pieces: [chunk({ content: 'one' }), chunk({ content: 'two' }, {}, 1), chunk({ content: ' more' }), finish('stop', 1), finish(), DONE],
  }));
  const { text } = await post(gw, ask({ stream: true }));
  const indexes = dataEvents(t, text).flatMap((e) => (e.choices as Json[]).map((c) => c.index));
  t.same([...new Set(indexes)], [0], 'choice 0 only');
  t.notMatch(text, /"two"/);
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, 2);
});

// Where OpenAI writes `"finish_reason": null`, some servers write "" (SGLang, Ollama in 2024) or
// "null" (KoboldCpp), and Gemini behind some proxies "stop", in every chunk. Regression: the first
// chunk was taken for the choice's end and the rest of the answer dropped (and not counted).
for (const reason of ['', 'null', 'stop']) {
  t.test(`a finish_reason of ${JSON.stringify(reason)} in every chunk does not cut the answer`, async (t) => {
    const words = Array.from({ length: 30 }, (_, i) => ` word${i}`);
    const { gw } = await scripted(t, () => ({
      stream: true,
      pieces: [...words.map((w) => `data: ${JSON.stringify({ ...ID, choices: [{ index: 0, delta: { content: w }, finish_reason: reason }] })}\n\n`), finish(), DONE],
    }));
    const { text } = await post(gw, ask({ stream: true, max_tokens: 200 }));
    const written = dataEvents(t, text).map((e) => ((e.choices as Json[])[0]?.delta as Json | undefined)?.content ?? '').join('');
    t.equal(written, words.join(''), 'every word reached the client');
    const [row] = await rows(gw);
    t.match(row, { status: 200, generated_tokens: o200k.countOutput(words.join('')), output_method: 'tiktoken:o200k_base' }, 'and every word was counted');
  });
}

// Every choice finished and the usage came: what the upstream does before `[DONE]` cannot take the
// answer away. Regression: a reset there was an `upstream_lost` error event (the SDKs throw on it),
// and a connection held open kept the client waiting for the upstream's whole timeout.
for (const then of ['reset', 'hold'] as const) {
  t.test(`an upstream that finishes, sends its usage, then ${then === 'reset' ? 'resets the connection' : 'holds it open'} without [DONE]: a whole answer`, async (t) => {
    const usage = `data: ${JSON.stringify({ ...ID, choices: [], usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } })}\n\n`;
    const { gw } = await scripted(t, () => ({ stream: true, pieces: [chunk({ content: 'Hello' }), chunk({ content: ' there' }), finish(), usage], then }));
    const { text } = await post(gw, ask({ stream: true }));
    t.notMatch(text, /"error"/, 'no error event');
    t.match(text, /data: \[DONE\]\n\n$/, 'the stream ends as a whole one does');
    const [row] = await rows(gw);
    t.match(row, { status: 200, generated_tokens: 2, output_method: 'provider' });
  });
}

t.test('an upstream that finishes without usage, then resets the connection: a whole answer', async (t) => {
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [chunk({ content: 'Hello' }), finish()], then: 'reset' }));
  const { text } = await post(gw, ask({ stream: true }));
  t.notMatch(text, /"error"/);
  const [row] = await rows(gw);
  t.match(row, { status: 200, generated_tokens: 1 });
});

// Servers that do not write OpenAI's error envelope: vLLM and Mistral put its fields at the top
// level (`"object": "error"`; Mistral's message can be an object), LM Studio and TGI write
// `{"error": "text"}`. Regression: their errors reached the client as one quoted JSON string, and
// in a 200 they passed for answers and were charged.
const VLLM_ERROR = { object: 'error', message: "This model's maximum context length is 4096 tokens.", type: 'BadRequestError', param: null, code: 400 };
t.test('an error at the top level of the body (vLLM) reaches the client in the OpenAI envelope', async (t) => {
  const { gw } = await scripted(t, () => ({ stream: false, status: 400, pieces: [JSON.stringify(VLLM_ERROR)] }));
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask()) });
  t.equal(res.status, 400);
  t.same(await res.json(), { error: { message: VLLM_ERROR.message, type: 'BadRequestError', param: null, code: 'BadRequestError' } });
  const mistral = { object: 'error', message: { detail: [{ type: 'extra_forbidden', loc: ['body', 'foo'] }] }, type: 'invalid_request_error', param: null, code: null };
  const { gw: gw2 } = await scripted(t, () => ({ stream: false, status: 422, pieces: [JSON.stringify(mistral)] }));
  const res2 = await fetch(`${gw2.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask()) });
  t.same(await res2.json(), { error: { message: JSON.stringify(mistral.message), type: 'invalid_request_error', param: null, code: null } }, "Mistral's details, as text");
  const { gw: gw3 } = await scripted(t, () => ({ stream: false, status: 502, type: 'text/html', pieces: ['<html>Bad Gateway</html>'] }));
  const res3 = await fetch(`${gw3.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask()) });
  t.match(await res3.json(), { error: { message: '<html>Bad Gateway</html>', type: 'upstream_error', code: 'upstream_error', upstream: 'openai' } }, 'a page, named with its upstream');
});

for (const [name, body] of [
  ['{"error": "text"} (LM Studio)', { error: 'Unexpected endpoint or method. (POST /chat/completions)' }],
  ['a top-level error object (vLLM)', { ...VLLM_ERROR, message: 'engine dead' }],
] as const) {
  t.test(`a 200 whose body is ${name} is a failure, refunded whole`, async (t) => {
    const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify(body)] }));
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask()) });
    t.equal(res.status, 502);
    t.match(await res.json(), { error: { code: 'upstream_bad_response' } });
    const [row] = await rows(gw);
    t.match(row, { status: 502, charge_tokens: 0 });
  });
}

for (const [name, event] of [
  ['a top-level error object (vLLM)', { ...VLLM_ERROR, message: 'engine dead' }],
  ['{"error": "text"} (TGI)', { error: 'Request failed during generation: out of memory', error_type: 'generation' }],
] as const) {
  t.test(`a stream that breaks off with ${name} ends in an error event, charged what was generated`, async (t) => {
    const { gw } = await scripted(t, () => ({ stream: true, pieces: [chunk({ content: 'Hello' }), chunk({ content: ' there' }), `data: ${JSON.stringify(event)}\n\n`, DONE] }));
    const { text } = await post(gw, ask({ stream: true }));
    const last = dataEvents(t, text).at(-1)!;
    t.match(last, { error: { message: 'message' in event ? event.message : event.error } }, 'the client is told, in the envelope');
    // As a non-streamed request's error would say it (the README's error table).
    t.match(last, 'message' in event ? { error: { type: 'BadRequestError', code: 'BadRequestError', param: null } } : { error: { type: 'upstream_error', code: 'upstream_error', upstream: 'openai' } });
    const [row] = await rows(gw);
    t.match(row, { status: 502, generated_tokens: 2 });
  });
}

// OpenRouter says a failure in a chunk that also finishes the choice with "error". Regression (in
// this session's own change): a chunk with choices was no error, and the failure passed for an
// answer — charged its prompt, the head moved, a final answer without its excerpt.
t.test("OpenRouter's error chunk (beside a choice finished with \"error\") before any output: an error event, refunded whole", async (t) => {
  const failure = { ...ID, error: { code: 502, message: 'Provider disconnected' }, choices: [{ index: 0, delta: { content: '' }, finish_reason: 'error' }] };
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [`data: ${JSON.stringify(failure)}\n\n`, DONE] }));
  const { text } = await post(gw, ask({ stream: true }));
  t.match(dataEvents(t, text).at(-1), { error: { message: 'Provider disconnected', type: 'upstream_error', upstream: 'openai' } });
  const [row] = await rows(gw);
  t.match(row, { status: 502, charge_tokens: 0 });
});

t.test("OpenRouter's error beside a choice finished with \"error\", not streamed: a failure, refunded whole", async (t) => {
  const failure = { ...ID, object: 'chat.completion', error: { code: 502, message: 'Provider disconnected' }, choices: [{ index: 0, message: { role: 'assistant', content: '' }, finish_reason: 'error' }] };
  const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify(failure)] }));
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask()) });
  t.equal(res.status, 502);
  t.match(await res.json(), { error: { code: 'upstream_bad_response', message: /Provider disconnected/ } });
  const [row] = await rows(gw);
  t.match(row, { status: 502, charge_tokens: 0 });
});

t.test('an `event: error` reaches the client in the envelope every other upstream error gets', async (t) => {
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [chunk({ content: 'Hi' }), `event: error\ndata: ${JSON.stringify({ error: 'boom', error_type: 'overloaded' })}\n\n`] }));
  const { text } = await post(gw, ask({ stream: true }));
  t.match(dataEvents(t, text).at(-1), { error: { message: 'boom', type: 'upstream_error', code: 'upstream_error', param: null, upstream: 'openai' } });
});

// A server that names a finish in every chunk: none of its finishes says the answer is whole.
t.test('a server that names a finish in every chunk and then drops the connection: the answer was broken off', async (t) => {
  const stop = (w: string) => `data: ${JSON.stringify({ ...ID, choices: [{ index: 0, delta: { content: w }, finish_reason: 'stop' }] })}\n\n`;
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [stop('Hello'), stop(' there'), stop(' friend')], then: 'reset' }));
  const { text } = await post(gw, ask({ stream: true }));
  t.match(dataEvents(t, text).at(-1), { error: { code: 'upstream_lost' } }, 'the client is told');
  const [row] = await rows(gw);
  t.match(row, { status: 502, generated_tokens: 3 });
  const usage = `data: ${JSON.stringify({ ...ID, choices: [], usage: { prompt_tokens: 9, completion_tokens: 2, total_tokens: 11 } })}\n\n`;
  const { gw: gw2 } = await scripted(t, () => ({ stream: true, pieces: [stop('Hello'), stop(' there'), usage, stop(' friend'), DONE] }));
  const { text: text2 } = await post(gw2, ask({ stream: true }));
  const written = dataEvents(t, text2).map((e) => ((e.choices as Json[])[0]?.delta as Json | undefined)?.content ?? '').join('');
  t.equal(written, 'Hello there friend', 'a usage chunk in the middle does not end it');
});

// Regression: a provider's usage was taken over the gateway's own exact count of what it relayed,
// even when it said 0 (a figure sent early in the stream and never brought up to date).
t.test('a provider that reports fewer output tokens than visibly streamed is not taken at its word', async (t) => {
  const early = `data: ${JSON.stringify({ ...ID, choices: [{ index: 0, delta: { role: 'assistant', content: '' }, finish_reason: null }], usage: { prompt_tokens: 9, completion_tokens: 0, total_tokens: 9 } })}\n\n`;
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [early, ...Array.from({ length: 10 }, () => chunk({ content: ' word' })), finish(), DONE] }));
  await post(gw, ask({ stream: true }));
  const [row] = await rows(gw);
  t.match(row, { generated_tokens: 10, output_method: 'tiktoken:o200k_base' });
});

// Regression: a whole (not streamed) answer took the provider's completion_tokens unchecked: one
// that said 0 (or half) for a paragraph made the answer free (or half price), where the same answer
// streamed was counted.
t.test('a whole answer whose provider reports fewer output tokens than it wrote is counted by the gateway, as a stream is', async (t) => {
  const content = ' word'.repeat(15);
  const answer = (completion: number) => ({ ...ID, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage: { prompt_tokens: 9, completion_tokens: completion, total_tokens: 9 + completion } });
  const streamed = (completion: number) => [chunk({ role: 'assistant', content }), finish(), `data: ${JSON.stringify({ ...ID, choices: [], usage: answer(completion).usage })}\n\n`, DONE];
  let completion = 0;
  const { gw } = await scripted(t, (body) => ({ stream: body.stream === true, pieces: body.stream === true ? streamed(completion) : [JSON.stringify(answer(completion))] }));
  for (const [reported, stream] of [[0, false], [10, false], [10, true]] as const) {
    completion = reported;
    const { headers } = await post(gw, ask({ stream }));
    const row = (await rows(gw)).at(-1)!;
    const label = `${reported} reported, ${stream ? 'streamed' : 'whole'}`;
    t.match(row, { generated_tokens: 15, output_method: 'tiktoken:o200k_base', upstream_completion_tokens: reported }, `${label}: the count of what came`);
    if (!stream) t.equal(headers.get('x-tollgate-refund-tokens'), '5', `${label}: the refund is what was not written`);
  }
  // A figure above the count is the provider's (it may hold reasoning the answer does not show).
  completion = 18;
  await post(gw, ask());
  t.match((await rows(gw)).at(-1), { generated_tokens: 18, output_method: 'provider' });
});

// Regression: a whole answer passed on, and counted, choices past the n the request asked for (a
// stream's were dropped): they had no allowance. Dropped, they are not paid for either: the
// provider's figure covers them, so the gateway's count of what was passed on is taken.
t.test('more choices than asked for: those past n are not passed on, counted or paid for', async (t) => {
  const choice = (index: number, content: string) => ({ index, message: { role: 'assistant', content }, finish_reason: 'stop' });
  const usage = { prompt_tokens: 9, completion_tokens: 35, total_tokens: 44 };
  let choices = [choice(0, ' one'.repeat(5)), choice(1, ' two'.repeat(30))];
  const streamed = [chunk({ role: 'assistant', content: ' one'.repeat(5) }), chunk({ role: 'assistant', content: ' two'.repeat(30) }, {}, 1), finish(), finish('stop', 1), `data: ${JSON.stringify({ ...ID, choices: [], usage })}\n\n`, DONE];
  const { gw } = await scripted(t, (body) => ({ stream: body.stream === true, pieces: body.stream === true ? streamed : [JSON.stringify({ ...ID, object: 'chat.completion', choices, usage })] }));
  const { text } = await post(gw, ask());
  t.same((JSON.parse(text) as { choices: Json[] }).choices.map((c) => c.index), [0], 'only the choice asked for');
  t.match((await rows(gw)).at(-1), { generated_tokens: 5, output_method: 'tiktoken:o200k_base', upstream_completion_tokens: 35 }, 'only it counted, and paid for');
  const stream = await post(gw, ask({ stream: true }));
  t.notOk(stream.text.includes(' two'), 'a stream passes on only the choice asked for');
  t.match((await rows(gw)).at(-1), { generated_tokens: 5, output_method: 'tiktoken:o200k_base' }, 'and is paid for it alone');
  // As many choices as asked, however numbered (a server counting from 1), are the answer.
  choices = [choice(1, ' one'.repeat(5))];
  const { text: numbered } = await post(gw, ask());
  t.same((JSON.parse(numbered) as { choices: Json[] }).choices.map((c) => c.index), [1], 'one choice, kept');
});

// The byte estimate is no bound: an outside review sent a rule of 4,000 dashes that the provider
// said was 96 tokens, and a first version of the check above charged the whole allowance for it.
// A whole answer's texts are counted in the order a model writes them and a stream's meter reads
// them: reasoning, then content ("ing" + "Let me think" is 4 tokens, "Let me think" + "ing" 3).
t.test('a whole answer with reasoning is counted as the same answer streamed', async (t) => {
  const usage = { prompt_tokens: 9, completion_tokens: 0, total_tokens: 9 };
  const streamed = [chunk({ role: 'assistant', reasoning_content: 'Let me think' }), chunk({ content: 'ing' }), finish(), `data: ${JSON.stringify({ ...ID, choices: [], usage })}\n\n`, DONE];
  const whole = { ...ID, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ing', reasoning_content: 'Let me think' }, finish_reason: 'stop' }], usage };
  const { gw } = await scripted(t, (body) => ({ stream: body.stream === true, pieces: body.stream === true ? streamed : [JSON.stringify(whole)] }));
  await post(gw, ask({ stream: true }));
  await post(gw, ask());
  t.same((await rows(gw)).map((r) => r.generated_tokens), [3, 3]);
});

t.test('a model counted by the byte estimate: a provider figure of 0 for text that came is not taken; any other is', async (t) => {
  let content = ' internationalization'.repeat(4); // 84 bytes: an estimate of 21 tokens
  let completion = 0;
  const answer = () => ({ ...ID, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content }, finish_reason: 'stop' }], usage: { prompt_tokens: 9, completion_tokens: completion, total_tokens: 9 + completion } });
  const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify(answer())] }), {}, { models: ['*'] });
  for (const [reported, generated, method] of [[0, 20, 'estimate:bytes'], [3, 3, 'provider']] as const) {
    completion = reported;
    await post(gw, { ...ask(), model: 'mistral-large' });
    t.match((await rows(gw)).at(-1), { generated_tokens: generated, output_method: method }, `${reported} reported`);
  }
  content = '-'.repeat(4000);
  completion = 96;
  await post(gw, { ...ask(), model: 'mistral-large', max_tokens: 1000 });
  t.match((await rows(gw)).at(-1), { generated_tokens: 96, output_method: 'provider' }, '4,000 dashes the provider says are 96 tokens');
});

// Regression (twentieth session): a stream whose upstream sent no usage got a usage chunk of byte
// estimates, unlabelled, where a client (or its framework) takes usage for the provider's metering.
t.test("the gateway's own figures in a usage chunk say how each was counted: an estimate is labelled one", async (t) => {
  const { gw } = await scripted(t, () => ({ stream: true, pieces: [chunk({ content: 'Bonjour à tous' }), finish(), DONE] }), {}, { models: ['*'] });
  const estimated = dataEvents(t, (await post(gw, { ...ask({ stream: true, stream_options: { include_usage: true } }), model: 'mistral-large' })).text);
  const usage = estimated.find((e) => e.usage)?.usage as Json;
  t.match(usage, { count_method: 'estimate:bytes', output_method: 'estimate:bytes' }, 'no tokenizer here: both are estimates, and say so');
  t.equal(usage.total_tokens, (usage.prompt_tokens as number) + (usage.completion_tokens as number));
  const counted = dataEvents(t, (await post(gw, ask({ stream: true, stream_options: { include_usage: true } }))).text);
  t.match(counted.find((e) => e.usage)?.usage, { count_method: 'tiktoken:o200k_base', output_method: 'tiktoken:o200k_base' }, "gpt-4o-mini: the gateway's exact counts, labelled");
  const row = (await rows(gw)).at(-1)!;
  t.equal(row.output_method, 'tiktoken:o200k_base', 'as the ledger labels them');
});

t.test("DeepSeek's cache hits (prompt_cache_hit_tokens) are the cached tokens", async (t) => {
  const answer = { ...ID, object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', content: 'ok' }, finish_reason: 'stop' }], usage: { prompt_tokens: 1000, completion_tokens: 1, total_tokens: 1001, prompt_cache_hit_tokens: 900, prompt_cache_miss_tokens: 100 } };
  const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify(answer)] }));
  await post(gw, ask());
  const [row] = await rows(gw);
  t.match(row, { upstream_prompt_tokens: 1000, upstream_cached_tokens: 900 });
});

// Regression: the usage vLLM writes in every chunk for a client that asked for it
// (`stream_options.continuous_usage_stats`) was taken out of every chunk but the last.
t.test('usage in every chunk reaches a client that asked for usage; not one that did not', async (t) => {
  const running = (n: number) => ({ prompt_tokens: 9, completion_tokens: n, total_tokens: 9 + n });
  const { gw, sent } = await scripted(t, () => ({
    stream: true,
    pieces: [1, 2, 3].map((n) => chunk({ content: ' word' }, { usage: running(n) })).concat(finish(), `data: ${JSON.stringify({ ...ID, choices: [], usage: running(3) })}\n\n`, DONE),
  }));
  const { text } = await post(gw, ask({ stream: true, stream_options: { include_usage: true, continuous_usage_stats: true } }));
  t.same(sent[0]!.stream_options, { include_usage: true, continuous_usage_stats: true }, 'the option reached the server');
  const events = dataEvents(t, text).filter((e) => (e.choices as Json[]).length > 0 && ((e.choices as Json[])[0]!.delta as Json).content);
  t.same(events.map((e) => e.usage), [running(1), running(2), running(3)]);
  const { text: plain } = await post(gw, ask({ stream: true }));
  t.notMatch(plain, /"usage"/, 'a client that did not ask gets none');
});

// Regression: a stream request that a server answered with a whole completion (some do not stream
// every request) was a 502, refunded whole — though the answer had been generated and paid for.
for (const includeUsage of [false, true]) {
  t.test(`a stream request answered with a whole completion reaches the client as a stream${includeUsage ? ', usage and all' : ''}`, async (t) => {
    const call = { id: 'call_1', type: 'function', function: { name: 'search', arguments: '{"q":"tolls"}' } };
    const answer = {
      ...ID,
      object: 'chat.completion',
      choices: [{ index: 0, message: { role: 'assistant', content: 'Let me look.', tool_calls: [call] }, finish_reason: 'tool_calls' }],
      // A tool call costs the model more than its text (OpenAI counts its framing too).
      usage: { prompt_tokens: 12, completion_tokens: 19, total_tokens: 31 },
    };
    const { gw } = await scripted(t, () => ({ stream: false, pieces: [JSON.stringify(answer)] }));
    const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
    const stream = await client.chat.completions.create({
      ...ask({ tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }] }),
      stream: true,
      ...(includeUsage ? { stream_options: { include_usage: true } } : {}),
    } as never);
    let content = '';
    let args = '';
    let finish: unknown = null;
    let usage: unknown = null;
    for await (const chunk of stream as unknown as AsyncIterable<{ choices: Array<{ delta: { content?: string; tool_calls?: Array<{ function?: { arguments?: string } }> }; finish_reason: unknown }>; usage?: unknown }>) {
      for (const c of chunk.choices) {
        content += c.delta.content ?? '';
        args += c.delta.tool_calls?.map((x) => x.function?.arguments ?? '').join('') ?? '';
        finish = c.finish_reason ?? finish;
      }
      if (chunk.usage) usage = chunk.usage;
    }
    t.equal(content, 'Let me look.');
    t.equal(args, '{"q":"tolls"}', 'the tool call, indexed as a stream gives it');
    t.equal(finish, 'tool_calls');
    t.same(usage, includeUsage ? answer.usage : null);
    const [row] = await rows(gw);
    t.match(row, { status: 200, generated_tokens: 19, output_method: 'provider' }, 'charged what it generated');
  });
}

// Regression: a redirect (an http:// baseUrl the server moves to https://) reached a stream client
// as a 200 with an error event about "no events", and a plain one as "not JSON".
for (const stream of [false, true]) {
  t.test(`a redirect is not followed, and says where it points (${stream ? 'stream' : 'plain'})`, async (t) => {
    const location = 'http://10.1.2.3:8000/v1/chat/completions?sig=secret-signature';
    const { gw } = await scripted(t, () => ({ stream, status: 301, type: 'text/html', headers: { location }, pieces: [] }));
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(ask({ stream })) });
    t.equal(res.status, 502);
    const body = await res.text();
    t.match(JSON.parse(body), { error: { code: 'upstream_bad_response', message: /redirected the request \(301\).*baseUrl.*the gateway's log says where/ } });
    t.notMatch(body, /10\.1\.2\.3|secret-signature/, 'where it points stays out of the answer: an internal address, a signature');
    const [row] = await rows(gw);
    t.match(row, { status: 502, charge_tokens: 0 });
  });
}

for (const [name, after] of [
  ['then proposes a tool', [chunk({ tool_calls: [{ index: 0, id: 'c2', type: 'function', function: { name: 'search', arguments: '{}' } }] }), finish('tool_calls')]],
  ['then writes nothing', [chunk({ content: '' }), finish()]],
] as const) {
  t.test(`a streamed final turn that reasons ${name} is no answer: the excerpt, with its header`, async (t) => {
    const { gw } = await scripted(t, () => ({ stream: true, pieces: [...Array.from({ length: 5 }, () => chunk({ reasoning_content: ' thinking' })), ...after, DONE] }), { runs: { maxToolRounds: 1 } });
    const messages = [
      { role: 'user', content: 'Find it.' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'found: it is here' },
    ];
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, max_tokens: 50, messages, tools: [{ type: 'function', function: { name: 'search' } }] }),
    });
    t.match(res.headers.get('x-tollgate-notice') ?? '', /finishing-the-answer/);
    t.equal(res.headers.get('x-tollgate-fallback'), 'evidence-excerpt', 'reasoning did not pass for the answer');
    const text = await res.text();
    t.match(text, /found: it is here/);
    t.notMatch(text, /"tool_calls"/);
  });
}

// An outside audit: the audio tokens OpenAI reports within a turn's usage were priced at the text
// rates; gpt-audio's own ($32 and $64 per Mtok) are in the catalogue.
t.test("a turn's audio tokens are priced at the model's audio rates", async (t) => {
  const usage = {
    prompt_tokens: 112,
    completion_tokens: 50,
    total_tokens: 162,
    prompt_tokens_details: { cached_tokens: 0, audio_tokens: 100 },
    completion_tokens_details: { reasoning_tokens: 0, audio_tokens: 40 },
  };
  const answer = { ...ID, object: 'chat.completion', model: 'gpt-audio', choices: [{ index: 0, message: { role: 'assistant', content: 'Heard.' }, finish_reason: 'stop' }], usage };
  const upstream = createServer((_req, res) => res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify(answer)));
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`)] });
  const { headers } = await post(gw, { ...ask(), model: 'gpt-audio', max_tokens: 60 });
  const [row] = await rows(gw);
  const expected = (12 * 2.5 + 100 * 32 + 10 * 10 + 40 * 64) / 1e6;
  t.ok(Math.abs(row!.cost_usd! - expected) < 1e-12, `${row!.cost_usd} against ${expected}`);
  t.equal(Number(headers.get('x-tollgate-cost-usd')), row!.cost_usd);
});

// An upstream that answers as OpenAI does: in audio (700 audio tokens) only when the request asked
// for it with `modalities`, in 700 tokens of text otherwise.
async function audioUpstream(t: Test): Promise<string> {
  const upstream = createServer((req, res) => {
    let raw = '';
    req.on('data', (c: Buffer) => (raw += c));
    req.on('end', () => {
      const audio = ((JSON.parse(raw) as { modalities?: string[] }).modalities ?? []).includes('audio');
      const usage = { prompt_tokens: 10, completion_tokens: 700, total_tokens: 710, completion_tokens_details: { audio_tokens: audio ? 700 : 0 } };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...ID, object: 'chat.completion', model: 'gpt-audio', choices: [{ index: 0, message: { role: 'assistant', content: 'x' }, finish_reason: 'length' }], usage }));
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
  return `http://127.0.0.1:${(upstream.address() as AddressInfo).port}`;
}

// A review: audio output was priced at its audio rate, but admission reserved the text rate, so a
// $0.05 budget let one gpt-audio turn spend $0.26.
t.test('a request that asks for audio is reserved at the audio output rate where it is dearer: a money limit holds', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream(await audioUpstream(t))], auth: { keys: [{ key: 'tg-audio', tenant: 'audio', monthlyBudgetUsd: 0.05 }] } });
  const body = { ...ask(), model: 'gpt-audio', max_tokens: 4000, modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'wav' } };
  const headers = { 'content-type': 'application/json', authorization: 'Bearer tg-audio' };
  const refused = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(body) });
  t.equal(refused.status, 402, '4,000 tokens at $64/M is past $0.05');
  t.equal(((await refused.json()) as { error: { code: string } }).error.code, 'monthly_budget_reached');
  const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { max_affordable_allowance: number };
  t.ok(plan.max_affordable_allowance < 782, `at most $0.05 / $64 per Mtok of output: ${plan.max_affordable_allowance}`);
  t.match((plan as unknown as { cost_usd: { price: Json } }).cost_usd.price, { output_mtok: 10, input_audio_mtok: 32, output_audio_mtok: 64 }, 'the plan shows the rates its worst case used');
  const over = await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: { ...body, max_tokens: plan.max_affordable_allowance + 1 } }) });
  t.equal(((await over.json()) as { verdict: { status: number } }).verdict.status, 402, 'one more is not');
  const fits = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify({ ...body, max_tokens: plan.max_affordable_allowance }) });
  t.equal(fits.status, 200, 'the figure admission gives is admitted');
});

// The sixteenth session's closing note: admission reserved every gpt-audio request at the
// audio rate, though OpenAI answers in text unless `modalities` asks for audio: a text-only request
// was refused at a sixth of the budget it needed.
t.test('a request that asks for text alone is reserved at the text output rate', async (t) => {
  const gw = await startGateway(t, { upstreams: [openaiUpstream(await audioUpstream(t))], auth: { keys: [{ key: 'tg-text', tenant: 'text', monthlyBudgetUsd: 0.05 }] } });
  const headers = { 'content-type': 'application/json', authorization: 'Bearer tg-text' };
  const plan = async (request: Record<string, unknown>) =>
    (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })).json()) as { max_affordable_allowance: number; cost_usd: { worst_case: number } };
  const text = { ...ask(), model: 'gpt-audio', max_tokens: 4000 };
  const textPlan = await plan(text);
  t.ok(textPlan.max_affordable_allowance > 4000, `at $10 per Mtok of output, $0.05 holds more than 4,000: ${textPlan.max_affordable_allowance}`);
  t.ok(textPlan.max_affordable_allowance < 5000, `and less than 5,000: ${textPlan.max_affordable_allowance}`);
  for (const asked of [{ modalities: ['text', 'audio'] }, { audio: { voice: 'alloy', format: 'wav' } }]) {
    const audioPlan = await plan({ ...text, ...asked });
    t.ok(audioPlan.max_affordable_allowance < 782, `${JSON.stringify(asked)}: at $64 per Mtok: ${audioPlan.max_affordable_allowance}`);
    t.ok(audioPlan.cost_usd.worst_case > textPlan.cost_usd.worst_case * 6, `${JSON.stringify(asked)}: reserved at the audio rate`);
  }
  t.equal((await plan({ ...text, modalities: ['text'] })).max_affordable_allowance, textPlan.max_affordable_allowance, 'modalities ["text"] is the default');
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: JSON.stringify(text) });
  t.equal(res.status, 200, '4,000 tokens at $10 per Mtok fit $0.05');
  const cost = Number(res.headers.get('x-tollgate-cost-usd'));
  t.ok(Math.abs(cost - (10 * 2.5 + 700 * 10) / 1e6) < 1e-12, `answered in text, priced at the text rates: ${cost}`);
});

// The sixteenth session's closing note: a streamed answer spoken in audio was metered on its text
// alone. A client that left before the usage chunk paid for the transcript's tokens (here 3), and
// was refunded the rest of the allowance, for audio it had heard.
t.test('audio the model spoke is charged: the whole allowance without the provider\'s figure, the provider\'s with it', async (t) => {
  const spoken = (transcript: string) => chunk({ audio: { id: 'audio_1', data: Buffer.alloc(960).toString('base64'), transcript } });
  const usage = { prompt_tokens: 9, completion_tokens: 14, total_tokens: 23, completion_tokens_details: { audio_tokens: 11 } };
  let mode: 'hold' | 'usage' | 'whole' = 'hold';
  const { gw } = await scripted(t, (body) => {
    if (mode === 'whole') {
      const message = { role: 'assistant', content: null, audio: { id: 'audio_1', data: Buffer.alloc(960).toString('base64'), expires_at: 1, transcript: 'Canberra.' } };
      return { stream: false, pieces: [JSON.stringify({ ...ID, object: 'chat.completion', choices: [{ index: 0, message, finish_reason: 'stop' }] })] };
    }
    const pieces = [chunk({ role: 'assistant', content: null }), spoken('Canberra'), spoken('.')];
    if (mode === 'hold') return { stream: true, pieces, then: 'hold' };
    const include = (body.stream_options as Json | undefined)?.include_usage === true;
    return { stream: true, pieces: [...pieces, finish(), ...(include ? [`data: ${JSON.stringify({ ...ID, choices: [], usage })}\n\n`] : []), DONE] };
  });
  const request = ask({ stream: true, max_tokens: 500, modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'pcm16' } });

  // The client leaves after the audio began, before any usage.
  const abort = new AbortController();
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(request), signal: abort.signal });
  const reader = res.body!.getReader();
  let seen = '';
  while (!seen.includes('"transcript":"."')) seen += new TextDecoder().decode((await reader.read()).value);
  abort.abort();
  let left: LedgerRow | undefined;
  for (let i = 0; i < 200 && left?.state !== 'settled'; i++) {
    await new Promise((r) => setTimeout(r, 10));
    left = (await rows(gw))[0];
  }
  t.match(left, { state: 'settled', status: 499, generated_tokens: 500, refund_tokens: 0, output_method: 'allowance:audio' }, 'left part way: the whole allowance');

  mode = 'usage';
  await post(gw, request);
  t.match((await rows(gw))[1], { generated_tokens: 14, output_method: 'provider' }, 'with the usage chunk: the provider\'s figure');

  mode = 'whole';
  await post(gw, { ...request, stream: false });
  t.match((await rows(gw))[2], { generated_tokens: 500, output_method: 'allowance:audio' }, 'a whole answer without usage: the whole allowance');
});

t.test('audio the model spoke is priced at the audio output rate when its allowance is charged', async (t) => {
  const upstream = createServer((_req, res) => {
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.end(chunk({ role: 'assistant', audio: { id: 'audio_1', data: Buffer.alloc(960).toString('base64'), transcript: 'Hi.' } }) + finish() + DONE);
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`)] });
  const { text } = await post(gw, { ...ask({ stream: true, max_tokens: 1000, modalities: ['text', 'audio'], audio: { voice: 'alloy', format: 'pcm16' } }), model: 'gpt-audio' });
  t.match(text, /transcript/);
  const [row] = await rows(gw);
  t.match(row, { generated_tokens: 1000, output_method: 'allowance:audio' });
  t.ok(row!.cost_usd! >= (1000 * 64) / 1e6, `1,000 tokens at gpt-audio's $64 per Mtok of audio: ${row!.cost_usd}`);
  t.ok(row!.cost_usd! <= row!.worst_case_usd! + 1e-12, 'within what admission reserved');
});

// A review: audio in the answer to a request that did not ask for it (no OpenAI model does this,
// but an OpenAI-compatible server may), with no usage: the allowance charged was priced at the
// audio rate, 6.4 times what admission had reserved at the text rate — a $0.05 budget spent 5 times
// over in one turn, on the gateway's own figure.
t.test("audio no one asked for, with no usage: the allowance is charged within what admission reserved", async (t) => {
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const message = { role: 'assistant', content: null, audio: { id: 'audio_1', data: Buffer.alloc(960).toString('base64'), expires_at: 1, transcript: 'Canberra.' } };
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ ...ID, object: 'chat.completion', model: 'gpt-audio', choices: [{ index: 0, message, finish_reason: 'stop' }] }));
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`)], auth: { keys: [{ key: 'tg-unasked', tenant: 'unasked', monthlyBudgetUsd: 0.05 }] } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer tg-unasked' }, body: JSON.stringify({ model: 'gpt-audio', max_tokens: 4000, messages: [{ role: 'user', content: 'Capital of Australia?' }] }) });
  t.equal(res.status, 200);
  const [row] = await rows(gw);
  t.match(row, { generated_tokens: 4000, output_method: 'allowance:audio' }, 'the whole allowance');
  t.ok(row!.cost_usd! <= row!.worst_case_usd! + 1e-12, `at the text rate it was reserved at: ${row!.cost_usd} against ${row!.worst_case_usd}`);
  const month = await gw.ledger.tenantMonth('unasked', row!.time.slice(0, 7));
  t.ok(month.spentUsd <= 0.05, `the month is within its $0.05: ${month.spentUsd}`);
});
