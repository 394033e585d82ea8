// Replays the recorded llama-server exchanges (fixtures/llamacpp) at the double and compares
// status, shape and token counts with what the real server answered.
import t from 'tap';
import { readFileSync } from 'node:fs';
import { request } from 'undici';
import { startLlamaCppDouble, type LlamaCppDouble } from './llamacpp.js';
import { CHAT_TEMPLATE } from './llamacpp-template.js';

const FIXTURES = new URL('../../../shared/fixtures/llamacpp/', import.meta.url);
const fixture = (name: string): string => readFileSync(new URL(name, FIXTURES), 'utf8');
const json = (name: string): unknown => JSON.parse(fixture(name));

/** A value from JSON on the wire, walked by a dotted path (`choices.0.message.content`). */
function at(v: unknown, path: string): unknown {
  return path
    .split('.')
    .reduce<unknown>((o, k) => (o !== null && typeof o === 'object' ? (o as Record<string, unknown>)[k] : undefined), v);
}

async function call(d: LlamaCppDouble, method: 'GET' | 'POST', path: string, body?: unknown) {
  const res = await request(d.url + path, {
    method,
    headers: body === undefined ? {} : { 'content-type': 'application/json' },
    body: body === undefined ? undefined : typeof body === 'string' ? body : JSON.stringify(body),
  });
  const text = await res.body.text();
  return { status: res.statusCode, headers: res.headers, text, json: (): unknown => JSON.parse(text) };
}

async function started(t: { teardown(fn: () => unknown): void }, opts = {}): Promise<LlamaCppDouble> {
  const d = await startLlamaCppDouble(opts);
  t.teardown(() => d.close());
  return d;
}

t.test('apply-template renders byte for byte as recorded', async (t) => {
  const d = await started(t);
  for (const name of ['apply-template', 'apply-template-turn1', 'apply-template-tools', 'apply-template-tool-call-history']) {
    const res = await call(d, 'POST', '/apply-template', json(`${name}.request.json`));
    t.equal(res.status, 200, name);
    t.equal(at(res.json(), 'prompt'), at(json(`${name}.response.json`), 'prompt'), name);
  }
  t.equal(at(json('props.response.json'), 'chat_template'), CHAT_TEMPLATE, 'the template text');
});

t.test('tokenize answers as recorded', async (t) => {
  const d = await started(t);
  for (const name of ['tokenize', 'tokenize-ids', 'tokenize-no-parse-special', 'tokenize-turn1-prompt', 'error-tokenize-missing-content']) {
    const res = await call(d, 'POST', '/tokenize', json(`${name}.request.json`));
    t.equal(res.status, 200, name);
    t.same(res.json(), json(`${name}.response.json`), name);
  }
  t.equal(at(json('tokenize-turn1-prompt.response.json'), 'tokens.length'), 34);
});

t.test('chat prompt counts equal the recorded usage.prompt_tokens', async (t) => {
  const d = await started(t);
  const expected: Record<string, number> = {
    'chat-nonstream': 34,
    'chat-second-turn': 69,
    'chat-tools': 208,
    'chat-other-conversation': 39,
    'chat-third-turn-after-interleave': 102,
    'error-unknown-model': 34,
    'error-bad-role': 4,
  };
  for (const [name, prompt] of Object.entries(expected)) {
    const res = await call(d, 'POST', '/v1/chat/completions', json(`${name}.request.json`));
    t.equal(res.status, 200, name);
    const body = res.json();
    const recorded = json(`${name}.response.json`);
    t.equal(at(body, 'usage.prompt_tokens'), prompt, `${name} prompt_tokens`);
    t.equal(at(body, 'usage.prompt_tokens'), at(recorded, 'usage.prompt_tokens'));
    t.equal(at(body, 'usage.completion_tokens'), at(recorded, 'usage.completion_tokens'), `${name} completion_tokens`);
    t.equal(at(body, 'object'), 'chat.completion');
    t.equal(at(body, 'model'), 'tiny.gguf');
    t.equal(at(body, 'choices.0.finish_reason'), 'length');
    t.same(Object.keys(at(body, 'timings') as object).slice(0, 2), ['cache_n', 'prompt_n']);
    t.equal(Number(at(body, 'timings.cache_n')) + Number(at(body, 'timings.prompt_n')), prompt);
    t.equal(at(body, 'usage.prompt_tokens_details.cached_tokens'), at(body, 'timings.cache_n'));
  }
  const input = await call(d, 'POST', '/v1/chat/completions/input_tokens', json('chat-input-tokens.request.json'));
  t.same(input.json(), json('chat-input-tokens.response.json'));
});

t.test('the simulated prefix cache reuses at most n − 1 tokens of the previous prompt', async (t) => {
  const d = await started(t);
  const turn1 = json('chat-nonstream.request.json') as Record<string, unknown>;
  const a = (await call(d, 'POST', '/v1/chat/completions', turn1)).json();
  t.equal(at(a, 'usage.prompt_tokens_details.cached_tokens'), 0);
  const b = (await call(d, 'POST', '/v1/chat/completions', turn1)).json();
  t.equal(at(b, 'usage.prompt_tokens_details.cached_tokens'), 33, 'identical prompt: 33 of 34, as recorded in chat-stream');
  const other = (await call(d, 'POST', '/v1/chat/completions', json('chat-other-conversation.request.json'))).json();
  t.equal(at(other, 'usage.prompt_tokens_details.cached_tokens'), 6, 'only <|im_start|>system\\nYou are a is shared, as recorded');
});

t.test('chat stream: role chunk, one chunk per token, finish chunk, usage chunk, [DONE]', async (t) => {
  const d = await started(t);
  const res = await call(d, 'POST', '/v1/chat/completions', json('chat-stream.request.json'));
  t.equal(res.status, 200);
  t.match(res.headers['content-type'], /text\/event-stream/);
  const events = res.text.split('\n\n').filter((e) => e.length > 0).map((e) => e.replace(/^data: /, ''));
  t.equal(events[events.length - 1], '[DONE]');
  const chunks = events.slice(0, -1).map((e) => JSON.parse(e) as unknown);
  t.same(at(chunks[0], 'choices.0.delta'), { role: 'assistant', content: null });
  const content = chunks.filter((c) => typeof at(c, 'choices.0.delta.content') === 'string');
  t.equal(content.length, 16);
  const finish = chunks[chunks.length - 2];
  t.equal(at(finish, 'choices.0.finish_reason'), 'length');
  t.equal(at(finish, 'usage'), undefined);
  const last = chunks[chunks.length - 1];
  t.same(at(last, 'choices'), []);
  t.equal(at(last, 'usage.prompt_tokens'), 34);
  t.equal(at(last, 'usage.completion_tokens'), 16);
  t.ok(at(last, 'timings'));
  // Generated text re-tokenizes to the reported count.
  t.equal(d.tokenize(content.map((c) => at(c, 'choices.0.delta.content')).join('')).length, 16);

  const plain = await call(d, 'POST', '/v1/chat/completions', json('chat-stream-no-include-usage.request.json'));
  t.notMatch(plain.text, /"usage"/);
  t.match(plain.text, /"timings"/);
});

t.test('completions: prompt arrays report row 0 only; streams carry usage on the finish chunk', async (t) => {
  const d = await started(t);
  const one = (await call(d, 'POST', '/v1/completions', json('v1-completions.request.json'))).json();
  t.equal(at(one, 'usage.prompt_tokens'), 41);
  t.equal(at(one, 'object'), 'text_completion');
  const arr = (await call(d, 'POST', '/v1/completions', json('v1-completions-prompt-array.request.json'))).json();
  t.equal(at(arr, 'choices.length'), 2);
  t.same(
    { ...(at(arr, 'usage') as object), prompt_tokens_details: null },
    { ...(at(json('v1-completions-prompt-array.response.json'), 'usage') as object), prompt_tokens_details: null },
  );
  t.equal(at(arr, 'usage.prompt_tokens'), 4);
  const stream = await call(d, 'POST', '/v1/completions', json('v1-completions-stream.request.json'));
  const events = stream.text.split('\n\n').filter(Boolean);
  t.equal(events[events.length - 1], 'data: [DONE]');
  const finish = JSON.parse(events[events.length - 2].slice(6)) as unknown;
  t.equal(at(finish, 'choices.0.finish_reason'), 'length');
  t.equal(at(finish, 'usage.prompt_tokens'), 41);
  t.equal(at(finish, 'usage.completion_tokens'), 8);
});

t.test('embeddings usage sums the rows and echoes the model', async (t) => {
  const d = await started(t);
  const res = (await call(d, 'POST', '/v1/embeddings', json('emb-v1-embeddings.request.json'))).json();
  t.same(at(res, 'usage'), at(json('emb-v1-embeddings.response.json'), 'usage'));
  t.equal(at(res, 'model'), 'tiny');
  t.equal(at(res, 'data.length'), 2);
  t.equal(at(res, 'data.0.embedding.length'), 64);
  const single = (await call(d, 'POST', '/v1/embeddings', json('emb-v1-embeddings-single.request.json'))).json();
  t.equal(at(single, 'usage.prompt_tokens'), 2);
  const big = await call(d, 'POST', '/v1/embeddings', { input: 'hello '.repeat(600) });
  t.equal(big.status, 500);
  t.equal(at(big.json(), 'error.type'), 'server_error');
});

t.test('errors are the recorded envelopes', async (t) => {
  const d = await started(t);
  for (const name of ['error-context-overflow-chat', 'error-context-overflow-chat-stream', 'error-missing-messages', 'chat-n2', 'error-wrong-type-max-tokens', 'error-context-overflow-v1-completions']) {
    const path = name.includes('v1-completions') ? '/v1/completions' : '/v1/chat/completions';
    const res = await call(d, 'POST', path, json(`${name}.request.json`));
    const recorded = json(`${name}.response.json`);
    t.equal(res.status, at(recorded, 'error.code'), name);
    t.same(res.json(), recorded, name);
    t.equal(res.headers.connection, 'close');
  }
  const malformed = await call(d, 'POST', '/v1/chat/completions', fixture('error-malformed-json.request.txt'));
  t.equal(malformed.status, 500);
  t.equal(at(malformed.json(), 'error.type'), 'server_error');
  const unknown = await call(d, 'GET', '/v1/nope');
  t.same(unknown.json(), json('error-unknown-endpoint.response.json'));
  t.equal(unknown.status, 404);
  const max = (await call(d, 'POST', '/v1/chat/completions', json('error-max-tokens-exceeds-remaining.request.json'))).json();
  t.equal(at(max, 'usage.prompt_tokens'), 4000);
  t.equal(at(max, 'usage.completion_tokens'), 96, 'generation stops when the context is full');
});

t.test('discovery endpoints and the requests log', async (t) => {
  const d = await started(t, { nCtx: 2048, slots: 2 });
  t.same((await call(d, 'GET', '/health')).json(), { status: 'ok' });
  const props = (await call(d, 'GET', '/props')).json();
  t.equal(at(props, 'default_generation_settings.n_ctx'), 2048);
  t.equal(at(props, 'total_slots'), 2);
  t.equal(at(props, 'n_ctx'), undefined);
  t.equal(at((await call(d, 'GET', '/v1/models')).json(), 'data.0.meta.n_ctx'), 2048);
  const n2 = (await call(d, 'POST', '/v1/chat/completions', json('p2-chat-n2.request.json'))).json();
  t.equal(at(n2, 'choices.length'), 2);
  t.equal(at(n2, 'usage.completion_tokens'), 8, 'usage counts choice 0 only, as recorded');
  const over = await call(d, 'POST', '/v1/chat/completions', json('p2-error-context-overflow-3000.request.json'));
  t.equal(at(over.json(), 'error.n_ctx'), 2048);
  t.same(d.requests.map((r) => `${r.method} ${r.path}`), ['GET /health', 'GET /props', 'GET /v1/models', 'POST /v1/chat/completions', 'POST /v1/chat/completions']);
  t.equal((d.requests[3].body as { n: number }).n, 2);
});

t.test('knobs: completionTokens, ignoreMaxTokens, toolCalls, failWith, dropMidStream', async (t) => {
  const turn1 = json('chat-nonstream.request.json') as Record<string, unknown>;
  const few = await started(t, { completionTokens: 5 });
  const a = (await call(few, 'POST', '/v1/chat/completions', turn1)).json();
  t.equal(at(a, 'usage.completion_tokens'), 5);
  t.equal(at(a, 'choices.0.finish_reason'), 'stop');

  const greedy = await started(t, { ignoreMaxTokens: true, completionTokens: 40 });
  const b = (await call(greedy, 'POST', '/v1/chat/completions', { ...turn1, max_tokens: 4 })).json();
  t.equal(at(b, 'usage.completion_tokens'), 40);

  const tools = await started(t, { toolCalls: { name: 'get_weather', arguments: '{"city": "Paris"}' } });
  const c = (await call(tools, 'POST', '/v1/chat/completions', turn1)).json();
  t.equal(at(c, 'choices.0.finish_reason'), 'tool_calls');
  t.equal(at(c, 'choices.0.message.tool_calls.0.function.name'), 'get_weather');
  t.ok(Number(at(c, 'usage.completion_tokens')) > 5);
  const cs = await call(tools, 'POST', '/v1/chat/completions', { ...turn1, stream: true });
  t.match(cs.text, /"tool_calls":\[\{"index":0,"id":"call_double_0"/);

  const failing = await started(t, { failWith: { status: 503, body: { error: { code: 503, message: 'Loading model', type: 'unavailable_error' } } } });
  const f = await call(failing, 'POST', '/v1/chat/completions', turn1);
  t.equal(f.status, 503);
  t.equal((await call(failing, 'POST', '/tokenize', { content: 'hi' })).status, 200, 'counting still works');

  const dropping = await started(t, { dropMidStream: 3 });
  await t.rejects(call(dropping, 'POST', '/v1/chat/completions', { ...turn1, stream: true }));
  await t.rejects(call(dropping, 'POST', '/v1/chat/completions', turn1));
});
