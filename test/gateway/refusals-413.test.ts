// Size refusals (SPEC §6, §11): exact codes, messages and figures, through the real HTTP path and
// through /v1/admission (the same envelope), in the fixed order — and nothing reaches the upstream.

import t, { type Test } from 'tap';
import { get_encoding } from '@dqbd/tiktoken';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream, llamaUpstream, metricValue } from '../helpers/gateway.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';

const o200k = get_encoding('o200k_base');
const tokens = (s: string) => o200k.encode_ordinary(s).length;

type Envelope = { error: Record<string, unknown> };

async function setup(t: Test, limits: Record<string, number>, upstreamExtra: Record<string, unknown> = {}) {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, upstreamExtra)], limits });
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: typeof body === 'string' ? body : JSON.stringify(body) });
    return { status: res.status, headers: res.headers, body: (await res.json()) as Envelope & Record<string, unknown> };
  };
  /** The real request and the admission verdict for it must agree exactly. */
  const both = async (endpoint: string, request: Record<string, unknown>) => {
    const real = await post(endpoint, request);
    const plan = await post('/v1/admission', { endpoint, request });
    t.equal(plan.status, 200, 'admission itself answers 200');
    const verdict = plan.body.verdict as { admit: boolean; status: number; error: Envelope };
    t.equal(verdict.admit, false);
    t.equal(verdict.status, real.status, 'same status');
    t.same(verdict.error, real.body, 'same envelope');
    t.equal(real.headers.get('x-should-retry'), 'false');
    return real;
  };
  return { upstream, gw, post, both };
}

t.test('too_many_rows', async (t) => {
  const { upstream, both, post } = await setup(t, { maxRows: 4 });
  const res = await both('/v1/completions', { model: 'gpt-4o', prompt: ['a', 'b', 'c', 'd', 'e'], max_tokens: 1 });
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'too_many_rows');
  t.equal(res.body.error.message, 'too many rows: 5, the limit is 4');
  t.equal(res.body.error.rows, 5);
  t.equal(res.body.error.limit, 4);
  t.equal(upstream.requests.length, 0, 'the upstream received nothing');
  const plan = await post('/v1/admission', { endpoint: '/v1/completions', request: { model: 'gpt-4o', prompt: ['a', 'b', 'c', 'd', 'e'] } });
  t.equal(plan.body.rows, 5, 'the refused plan still shows its rows');
  t.equal((plan.body.row_tokens as number[]).length, 5);
  t.equal((plan.body.limits as Record<string, number>).maxRows, 4);
});

t.test('row_too_large names the row and its tokens', async (t) => {
  const { upstream, both, gw } = await setup(t, { maxRowTokens: 40 });
  const big = ' word'.repeat(45);
  const res = await both('/v1/embeddings', { model: 'gpt-4o', input: ['short', big] });
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'row_too_large');
  t.equal(res.body.error.message, `too many tokens: one row has ${tokens(big)} tokens, the limit is 40 per row`);
  t.equal(res.body.error.row_index, 1);
  t.equal(res.body.error.row_tokens, tokens(big));
  t.equal(res.body.error.count_method, 'tiktoken:o200k_base');
  t.equal(upstream.requests.length, 0);
  t.equal(await metricValue(gw.registry, 'tollgate_refusals_total', { reason: 'row_too_large' }), 1, 'the real refusal is counted; the admission plan is not a refusal');
});

t.test('request_tokens_exceeded sums the rows', async (t) => {
  const { upstream, both } = await setup(t, { maxRowTokens: 100, maxRequestTokens: 150 });
  const row = ' word'.repeat(60);
  const res = await both('/v1/embeddings', { model: 'gpt-4o', input: [row, row, row] });
  const sum = 3 * tokens(row);
  t.equal(res.body.error.code, 'request_tokens_exceeded');
  t.equal(res.body.error.message, `too many tokens: the rows add up to ${sum} tokens, the limit is 150`);
  t.equal(res.body.error.sum_tokens, sum);
  t.equal(upstream.requests.length, 0);
});

t.test('context_window_exceeded: prompt alone, and prompt plus explicit max_tokens', async (t) => {
  const { upstream, both, post } = await setup(t, {}, { contextWindow: 64 });
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: ' word'.repeat(30) }] };
  const planned = await post('/v1/admission', { endpoint: '/v1/chat/completions', request });
  const prompt = (planned.body.row_tokens as number[])[0];
  t.ok(prompt > 30 && prompt < 64);

  const over = await both('/v1/chat/completions', { ...request, max_tokens: 30 });
  t.equal(over.body.error.code, 'context_window_exceeded');
  t.equal(
    over.body.error.message,
    `request too large: the prompt needs ${prompt} tokens and max_tokens asks for 30 more, more than the model's context window of 64 tokens`,
  );
  t.equal(over.body.error.context_window, 64);
  t.equal(over.body.error.allowance, 30);

  const tooLong = await both('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: ' word'.repeat(80) }] });
  t.match(tooLong.body.error.message, /^request too large: the prompt needs \d+ tokens, more than the model's context window of 64 tokens$/);

  // Without max_tokens the allowance is clamped to the room left, and the request goes.
  const fits = await post('/v1/chat/completions', request);
  t.equal(fits.status, 200);
  t.equal(upstream.requests.length, 1);
  t.equal(upstream.requests[0].body?.max_tokens, 64 - prompt, 'allowance clamped to the window');
});

t.test('admission of a request refused only for its max_tokens still says the largest max_tokens the window admits', async (t) => {
  const { post } = await setup(t, {}, { contextWindow: 64 });
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: ' word'.repeat(30) }], max_tokens: 1000 };
  const planned = await post('/v1/admission', { endpoint: '/v1/chat/completions', request });
  t.equal(planned.status, 200);
  t.match(planned.body.verdict, { admit: false, status: 413, error: { error: { code: 'context_window_exceeded' } } });
  const prompt = (planned.body.row_tokens as number[])[0]!;
  const most = planned.body.max_affordable_allowance as number;
  t.equal(most, 64 - prompt, 'the window less the prompt');
  t.ok(planned.body.charge && planned.body.budgets, 'the plan is shown, not nulls');
  t.equal((await post('/v1/chat/completions', { ...request, max_tokens: most })).status, 200, 'the figure is admitted');
  t.equal((await post('/v1/chat/completions', { ...request, max_tokens: most + 1 })).status, 413, 'one more is not');
});

t.test('body_too_large counts bytes exactly, before parsing', async (t) => {
  const { upstream, post } = await setup(t, { maxBodyBytes: 1000 });
  const body = `{"model":"gpt-4o","x":"${'a'.repeat(1000 - 24)}"}`;
  t.equal(Buffer.byteLength(body), 1001);
  const res = await post('/v1/chat/completions', body);
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'body_too_large');
  t.equal(res.body.error.message, 'request body has 1001 bytes, the limit is 1000');
  const exact = await post('/v1/chat/completions', body.replace('aa', 'a'));
  t.equal(exact.status, 400, 'at the limit the body is parsed (and then found invalid)');
  t.equal(upstream.requests.length, 0);
});

t.test('the first failing check answers (order of SPEC §11)', async (t) => {
  const { both } = await setup(t, { maxRows: 2, maxRowTokens: 5 });
  const res = await both('/v1/completions', { model: 'gpt-4o', prompt: [' word'.repeat(20), 'b', 'c'] });
  t.equal(res.body.error.code, 'too_many_rows', 'rows before row size');
});

t.test('bad input is a 400 naming the field, and changes nothing', async (t) => {
  const { upstream, post, gw } = await setup(t, {});
  const notJson = await post('/v1/chat/completions', '{"model": "gpt-4o", ');
  t.equal(notJson.status, 400);
  t.equal(notJson.body.error.code, 'invalid_json');
  const wrongType = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'x' }], max_tokens: 'sixteen' });
  t.equal(wrongType.status, 400);
  t.equal(wrongType.body.error.param, 'max_tokens');
  const admission = await post('/v1/admission', { endpoint: '/v1/chat/completions', request: { model: 'gpt-4o', messages: 'nope' } });
  t.equal(admission.status, 200);
  t.equal((admission.body.verdict as { status: number }).status, 400);
  const noEndpoint = await post('/v1/admission', { request: {} });
  t.equal(noEndpoint.status, 400);
  t.equal(upstream.requests.length, 0);
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows.length, 0, 'no ledger rows');
});

t.test('a compressed body, or a content-type that is no media type, is a 400 saying which header', async (t) => {
  const { upstream, gw } = await setup(t, {});
  const { gzipSync } = await import('node:zlib');
  const body = JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'q' }] });
  const send = async (headers: Record<string, string>, payload: string | Uint8Array) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers, body: payload as BodyInit });
    return { status: res.status, retry: res.headers.get('x-should-retry'), body: (await res.json()) as Envelope };
  };
  for (const [headers, payload] of [
    [{ 'content-type': 'application/json', 'content-encoding': 'gzip' }, new Uint8Array(gzipSync(body))],
    [{ 'content-type': 'application/json', 'content-encoding': 'br' }, body],
  ] as const) {
    const r = await send(headers, payload);
    t.equal(r.status, 400, headers['content-encoding']);
    t.match(r.body.error, { code: 'invalid_request', param: 'content-encoding', message: `content-encoding: "${headers['content-encoding']}" is not supported: send the body uncompressed` });
    t.equal(r.retry, 'false');
  }
  t.equal((await send({ 'content-type': 'application/json', 'content-encoding': 'identity' }, body)).status, 200, 'identity is no encoding');
  const odd = await send({ 'content-type': 'application/json, text/plain' }, body);
  t.equal(odd.status, 400);
  t.match(odd.body.error, { code: 'invalid_request', param: 'content-type', message: /content-type: "application\/json, text\/plain" cannot be read as a media type/ });
  t.equal(upstream.requests.length, 1, 'only the identity request reached the upstream');
  // The size comes first (SPEC §11): a compressed body over the limit is a 413.
  const small = await setup(t, { maxBodyBytes: 100 });
  // Chunked, so its size is known only once it is read.
  const chunked = new ReadableStream<Uint8Array>({ start: (c) => (c.enqueue(new TextEncoder().encode('x'.repeat(200))), c.close()) });
  const big = await fetch(`${small.gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-encoding': 'gzip' }, body: chunked, duplex: 'half' } as RequestInit);
  t.equal(big.status, 413);
});

t.test('admission applies the body limit to the request inside, with the real request envelope', async (t) => {
  const { both, post } = await setup(t, { maxBodyBytes: 1000 });
  const sized = (bytes: number) => {
    const request = { model: 'gpt-4o', messages: [{ role: 'user', content: '' }] };
    request.messages[0]!.content = 'a'.repeat(bytes - JSON.stringify(request).length);
    return request;
  };
  // 1. a request of exactly the limit fits, although its wrapper is larger
  const fits = sized(1000);
  t.equal(JSON.stringify(fits).length, 1000);
  const ok = await post('/v1/admission', { endpoint: '/v1/chat/completions', request: fits });
  t.equal(ok.status, 200);
  t.equal((ok.body.verdict as { admit: boolean }).admit, true);
  // 2. one byte more: the verdict is the real request's 413, figures and all
  const res = await both('/v1/chat/completions', sized(1001));
  t.equal(res.body.error.code, 'body_too_large');
  t.equal(res.body.error.message, 'request body has 1001 bytes, the limit is 1000');
});

t.test('a plan refused before planning finished keeps the plan shape: unknown figures are null', async (t) => {
  const { post } = await setup(t, {});
  const res = await post('/v1/admission', { endpoint: '/v1/chat/completions', request: { model: 'no-such-model', messages: [{ role: 'user', content: 'hi' }] } });
  t.equal(res.status, 200);
  t.equal((res.body.verdict as { status: number }).status, 404);
  for (const field of ['rows', 'row_tokens', 'longest_row', 'sum_tokens', 'count_method', 'shared_prefix_tokens', 'charge', 'cost_usd', 'budgets', 'mode', 'max_affordable_allowance']) {
    t.ok(field in res.body, `${field} present`);
    t.equal(res.body[field], null, `${field} is null`);
  }
  t.ok(res.body.limits, 'the limits are known');
});

t.test('an admission body too large even for its wrapper: 413 that says which limits', async (t) => {
  const { post } = await setup(t, { maxBodyBytes: 1000 });
  const res = await post('/v1/admission', { endpoint: '/v1/chat/completions', request: { model: 'gpt-4o', messages: [{ role: 'user', content: 'a'.repeat(70_000) }] } });
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'body_too_large');
  t.match(res.body.error.message, /the limit is 66536 \(1000 for the request inside, 65536 for the admission wrapper\)$/);
});

t.test('a row refused on an upper bound is counted exactly first: a large minified JSON tool result fits', async (t) => {
  const { upstream, post } = await setup(t, {});
  // ~80 KB of minified JSON: past the 64 KiB counted exactly on the first pass, so that pass gives
  // an upper bound over maxRowTokens (36,864) while the true count is well under it.
  const items = [];
  for (let i = 0; items.join(',').length < 80_000; i++) {
    items.push(JSON.stringify({ id: i, name: `item-${i}`, price: (i * 7919) % 100_000 / 100, tags: ['a', 'bb'], url: `https://example.com/items/${i}?q=${i * 7}` }));
  }
  const json = `[${items.join(',')}]`;
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: json }], max_tokens: 16 };
  const exact = tokens(json);
  t.ok(exact < 36_864, `exact ${exact} fits`);

  const plan = await post('/v1/admission', { endpoint: '/v1/chat/completions', request });
  t.match(plan.body, { count_method: 'tiktoken:o200k_base', count_is_upper_bound: false, verdict: { admit: true } });
  // 3 per message + "user" (1) + the content + 3 to prime the reply.
  t.equal(plan.body.sum_tokens, exact + 7);
  const real = await post('/v1/chat/completions', request);
  t.equal(real.status, 200);
  t.equal(Number(real.headers.get('x-tollgate-reserved-tokens')) - 16, exact + 7, 'the exact prompt was reserved, with the 16 tokens of output');
  t.equal(upstream.requests.length, 1);
});

t.test('a request past the second count\'s budget (1 MiB of text) is refused on its first count', async (t) => {
  const { upstream, post } = await setup(t, {});
  // Three tool results of ~450 KB: each within the per-text budget, together past the request's.
  const result = (k: number) => {
    const items = [];
    for (let i = 0; items.length * 60 < 450_000; i++) items.push(JSON.stringify({ id: i, name: `item-${k}-${i}`, url: `https://example.com/${k}/${i}` }));
    return `[${items.join(',')}]`;
  };
  const request = { model: 'gpt-4o', messages: [0, 1, 2].map((k) => ({ role: 'user', content: result(k) })), max_tokens: 16 };
  const res = await post('/v1/chat/completions', request);
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'row_too_large');
  t.match(res.body.error.count_method, /upper-bound/, 'not counted a second time: the work per request stays bounded');
  t.equal(upstream.requests.length, 0);
});

t.test('a pathological row is still refused on its upper bound, quickly', async (t) => {
  const { upstream, both } = await setup(t, {});
  // One pre-token of 400,000 characters: quadratic for tiktoken (minutes), never counted exactly.
  const res = await both('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'x'.repeat(400_000) }], max_tokens: 16 });
  t.equal(res.status, 413);
  t.equal(res.body.error.code, 'row_too_large');
  t.match(res.body.error.count_method, /upper-bound/);
  t.equal(upstream.requests.length, 0);
});

t.test('malformed tool calls, text parts, allowances and nesting are 400s naming the field, before anything is written', async (t) => {
  const { upstream, post, gw } = await setup(t, {});
  const chat = (extra: Record<string, unknown>, messages: unknown[] = [{ role: 'user', content: 'q' }]) => ({ model: 'gpt-4o', max_tokens: 4, messages, ...extra });
  const cases: Array<[string, unknown, string]> = [
    ['a null tool call', chat({}, [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [null] }]), 'messages[1].tool_calls[0]'],
    ['a tool call without a function', chat({}, [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function' }] }]), 'messages[1].tool_calls[0].function.name'],
    ['arguments that are not text', chat({}, [{ role: 'user', content: 'q' }, { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 's', arguments: { q: 1 } } }] }]), 'messages[1].tool_calls[0].function.arguments'],
    ['a text part whose text is a number', chat({}, [{ role: 'user', content: [{ type: 'text', text: 5 }] }]), 'messages[0].content[0].text'],
    ['max_tokens past 2^31 − 1', chat({ max_tokens: 1e300 }), 'max_tokens'],
    ['n past 128', chat({ n: 129 }), 'n'],
    // Fields planning reads (regression: a wrong type was hashed, counted or priced as it came, and
    // forwarded; an image part of `image_url: 5` was reserved as the largest image there is).
    ['an image part whose image_url is a number', chat({}, [{ role: 'user', content: [{ type: 'image_url', image_url: 5 }] }]), 'messages[0].content[0].image_url'],
    ['an image part without a url', chat({}, [{ role: 'user', content: [{ type: 'image_url', image_url: { detail: 'low' } }] }]), 'messages[0].content[0].image_url.url'],
    ['an image detail that is not text', chat({}, [{ role: 'user', content: [{ type: 'image_url', image_url: { url: 'https://x/y.png', detail: 1 } }] }]), 'messages[0].content[0].image_url.detail'],
    ['a tool_choice that is a number', chat({ tools: [{ type: 'function', function: { name: 'f' } }], tool_choice: 5 }), 'tool_choice'],
    ['parallel_tool_calls that is text', chat({ parallel_tool_calls: 'yes' }), 'parallel_tool_calls'],
    ['a response_format that is a number', chat({ response_format: 5 }), 'response_format'],
    ['a response_format type that is a number', chat({ response_format: { type: 1 } }), 'response_format.type'],
    ['a json_schema that is text', chat({ response_format: { type: 'json_schema', json_schema: 'x' } }), 'response_format.json_schema'],
    ['a tool whose parameters are text', chat({ tools: [{ type: 'function', function: { name: 'f', parameters: '{}' } }] }), 'tools[0].function.parameters'],
    ['a legacy function whose parameters are a list', chat({ functions: [{ name: 'f', parameters: [] }] }), 'functions[0].parameters'],
    ['a prediction that is text', chat({ prediction: 'abc' }), 'prediction'],
    ['a prediction without content', chat({ prediction: { type: 'content' } }), 'prediction.content'],
    ['a prediction part that is no text', chat({ prediction: { type: 'content', content: [{ type: 'text', text: 1 }] } }), 'prediction.content[0].text'],
    ['modalities that are not a list of names', chat({ modalities: 'audio' }), 'modalities'],
    ['audio parameters that are text', chat({ audio: 'alloy' }), 'audio'],
  ];
  for (const [what, request, param] of cases) {
    const real = await post('/v1/chat/completions', request);
    t.equal(real.status, 400, `${what}: 400`);
    t.equal(real.body.error.param, param, `${what}: names ${param}`);
    const plan = await post('/v1/admission', { endpoint: '/v1/chat/completions', request });
    t.equal(plan.status, 200, `${what}: admission answers`);
    t.same((plan.body.verdict as { error: unknown }).error, real.body, `${what}: with the same verdict`);
  }
  t.match((await post('/v1/chat/completions', chat({ max_tokens: 1e300 }))).body.error.message, /must be an integer from 1 to 2147483647/);
  // The bare URL some servers take for an image is no malformed part: it goes (counted as an image).
  const bare = await post('/v1/chat/completions', chat({}, [{ role: 'user', content: [{ type: 'image_url', image_url: 'https://example.com/a.png' }] }]));
  t.equal(bare.status, 200, 'image_url as a bare URL');
  // Structured-output shapes one server or another takes (llama.cpp all four) are its to answer, not
  // the gateway's to refuse (regression: every one was a 400).
  for (const format of [{}, 'json_object', { type: 'json_schema' }, { type: 'json_object', schema: { type: 'object' } }, { type: 'json_schema', json_schema: { name: 's', schema: { type: 'object' } } }]) {
    const res = await post('/v1/chat/completions', chat({ response_format: format }));
    t.equal(res.status, 200, `response_format ${JSON.stringify(format)} goes`);
    t.same((upstream.requests.at(-1)?.body as Record<string, unknown> | undefined)?.response_format, format, 'as it was sent');
  }
  for (const [path, body, param] of [
    ['/v1/completions', { model: 'gpt-4o', prompt: [[]] }, 'prompt[0]'],
    ['/v1/completions', { model: 'gpt-4o', prompt: 'a', suffix: 5 }, 'suffix'],
    // A row of the wrong shape is named as an empty one is (regression: the whole array).
    ['/v1/completions', { model: 'gpt-4o', prompt: ['a', 5] }, 'prompt[1]'],
    ['/v1/embeddings', { model: 'gpt-4o', input: [[1.5]] }, 'input[0]'],
    ['/v1/embeddings', { model: 'gpt-4o', input: [[1, 2], []] }, 'input[1]'],
    // One prompt of token ids with a bad id names that id, not the valid one before it (regression:
    // prompt[0] every time); an empty string has no element 0.
    ['/v1/completions', { model: 'gpt-4o', prompt: [15339, -1] }, 'prompt[1]'],
    ['/v1/completions', { model: 'gpt-4o', prompt: [15339, 'hello'] }, 'prompt[1]'],
    ['/v1/embeddings', { model: 'gpt-4o', input: [1, 2, 3.5] }, 'input[2]'],
    ['/v1/embeddings', { model: 'gpt-4o', input: '' }, 'input'],
  ] as const) {
    const res = await post(path, body);
    t.equal(res.status, 400, `${path}: ${param} is a 400`);
    t.equal(res.body.error.param, param);
    const plan = await post('/v1/admission', { endpoint: path, request: body });
    t.same((plan.body.verdict as { error: unknown }).error, res.body, `${path}: admission gives the same verdict`);
  }

  // 5,000 levels inside a content part, and 100,000 in a field the gateway never reads.
  const deepPart = `{"model":"gpt-4o","messages":[{"role":"user","content":[{"type":"text","text":"q","x":${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}}]}]}`;
  const deepField = `{"model":"gpt-4o","messages":[{"role":"user","content":"q"}],"metadata":${'['.repeat(100_000)}${']'.repeat(100_000)}}`;
  for (const body of [deepPart, deepField]) {
    const res = await post('/v1/chat/completions', body);
    t.equal(res.status, 400);
    t.equal(res.body.error.code, 'invalid_json');
    t.equal(res.body.error.message, 'request body nests objects and arrays deeper than 128 levels');
  }
  // 128 levels are fine.
  const fine = await post('/v1/chat/completions', `{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"q"}],"metadata":${'['.repeat(126)}${']'.repeat(126)}}`);
  t.equal(fine.status, 200, 'nesting at the limit goes through');
  // Admission answers for the same requests as they would be answered, its wrapper one level more.
  const wrapped = (request: string) => post('/v1/admission', `{"endpoint":"/v1/chat/completions","request":${request}}`);
  // The request object and 127 arrays are 128 levels: the limit itself; one more is past it.
  const atLimit = (arrays: number) => `{"model":"gpt-4o","max_tokens":4,"messages":[{"role":"user","content":"q"}],"metadata":${'['.repeat(arrays)}${']'.repeat(arrays)}}`;
  t.equal((await post('/v1/chat/completions', atLimit(128))).status, 400, 'the real request one level past the limit');
  const fineAdmission = await wrapped(atLimit(127));
  t.equal(fineAdmission.status, 200);
  t.match(fineAdmission.body.verdict, { admit: true, status: 200 }, 'admission admits the request nested to the limit');
  const deepAdmission = await wrapped(atLimit(128));
  t.equal(deepAdmission.status, 200, 'a request one level too deep: admission answers 200 with its verdict');
  t.match(deepAdmission.body.verdict, { admit: false, status: 400, error: { error: { code: 'invalid_json', message: 'request body nests objects and arrays deeper than 128 levels' } } });
  const deepest = await post('/v1/admission', `{"endpoint":"/v1/chat/completions","request":${deepField}}`);
  t.equal(deepest.status, 200, '100,000 levels inside admission: still its verdict, not a crash');
  t.match(deepest.body.verdict, { status: 400, error: { error: { code: 'invalid_json' } } });

  // The bare image URL, the five response formats and the nesting at the limit.
  t.equal(upstream.requests.length, 7, 'only the requests within bounds reached the upstream');
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows.length, 7, 'and only they have ledger rows');
});

t.test('a conversation id must be printable ASCII of at most 256 characters; one that long reaches its spend route', async (t) => {
  const { gw } = await setup(t, {});
  const send = (id: string) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': id },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: [{ role: 'user', content: 'q' }] }),
    });
  const tooLong = await send('c'.repeat(257));
  t.equal(tooLong.status, 400);
  const body = (await tooLong.json()) as Envelope;
  t.equal(body.error.param, 'x-tollgate-conversation');
  t.equal(body.error.message, 'x-tollgate-conversation: must be at most 256 printable ASCII characters');
  t.equal((await send('caf\u00e9')).status, 400, 'a byte past ASCII is refused too');
  const longest = `conv:${'x'.repeat(251)}`;
  t.equal((await send(longest)).status, 200);
  const spend = await fetch(`${gw.url}/v1/conversations/${encodeURIComponent(longest)}/spend`);
  t.equal(spend.status, 200, 'the spend route takes the longest id');
  t.equal(((await spend.json()) as { conversation: string }).conversation, longest);
});

t.test('a prompt exactly the window: refused as leaving no room to generate; an embedding row that size fits', async (t) => {
  const { post } = await setup(t, {}, { contextWindow: 64 });
  // Find a text of exactly 64 tokens as the gateway counts a chat prompt (the template adds some).
  const count = async (request: Record<string, unknown>, endpoint = '/v1/chat/completions') =>
    (await post('/v1/admission', { endpoint, request })).body as unknown as { row_tokens: number[] | null; verdict: { error: Envelope | null } };
  let words = 40;
  let planned = await count({ model: 'gpt-4o', messages: [{ role: 'user', content: ' word'.repeat(words) }] });
  words += 64 - (planned.row_tokens?.[0] ?? 0);
  const request = { model: 'gpt-4o', messages: [{ role: 'user', content: ' word'.repeat(words) }] };
  planned = await count(request);
  t.equal(planned.row_tokens?.[0], 64);
  const res = await post('/v1/chat/completions', request);
  t.equal(res.status, 413);
  t.equal(res.body.error.message, "request too large: the prompt needs 64 tokens and 1 more to generate, more than the model's context window of 64 tokens");

  const input = ' word'.repeat(64 - tokens(' word'.repeat(64)) + 64);
  t.equal(tokens(input), 64);
  const embedded = await post('/v1/embeddings', { model: 'gpt-4o', input });
  t.equal(embedded.status, 200, 'an embedding row may fill the window: nothing is generated after it');
  const over = await post('/v1/embeddings', { model: 'gpt-4o', input: `${input} word` });
  t.equal(over.status, 413);
});

t.test('more messages than the limits can hold at 3 tokens each: refused on that lower bound, before counting', async (t) => {
  const { both, post, upstream } = await setup(t, {});
  const messages = Array.from({ length: 20_000 }, () => ({ role: 'user', content: '' }));
  const real = await both('/v1/chat/completions', { model: 'gpt-4o', messages });
  t.equal(real.status, 413);
  t.same(real.body.error, {
    message: 'too many tokens: one row has at least 60003 tokens, the limit is 36864 per row (a lower bound: 20000 messages at 3 tokens each, before what they say)',
    type: 'invalid_request_error',
    param: null,
    code: 'row_too_large',
    row_index: 0,
    row_tokens: 60003,
    limit: 36864,
    count_method: 'tiktoken:o200k_base:lower-bound',
  });
  // Below the bound, the request is counted as ever: 9,000 empty messages (4 tokens each, with their role) fit.
  const fits = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: messages.slice(0, 9_000) });
  t.equal(fits.status, 200);
  t.equal(upstream.requests.length, 1, 'only the request that fits reached the model');
});

// Regression (nineteenth session): the message floor refused requests of a few dozen messages — with
// a lower bound where the exact figure was cheap to have, and with `context_window_exceeded` where
// counting found the row too large, the check SPEC §11 puts first.
t.test('a request of ordinary length is counted before it is refused: exact figures, in the order of the checks', async (t) => {
  const { both } = await setup(t, { maxRowTokens: 100 }, { contextWindow: 64 });
  // 21 messages put the floor (66) past the window; the count finds the row past its limit first.
  const long = [{ role: 'user', content: ' word'.repeat(200) }, ...Array.from({ length: 20 }, () => ({ role: 'user', content: 'hello' }))];
  const first = await both('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: long });
  t.equal(first.body.error.code, 'row_too_large');
  t.equal(first.body.error.count_method, 'tiktoken:o200k_base');
  // 40 short messages: their exact count, not "at least" 123.
  const many = await both('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: Array.from({ length: 40 }, () => ({ role: 'user', content: 'hello' })) });
  t.equal(many.body.error.message, 'too many tokens: one row has 203 tokens, the limit is 100 per row');
  t.equal(many.body.error.row_tokens, 203);
});

t.test('far too many rows (past 4 × the limit) are refused on their number alone: no row is counted first', async (t) => {
  // A llama.cpp upstream counts each row with its /tokenize: a request refused for its rows must
  // not have sent any (six million inputs were counted, one by one, before the 413).
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)], limits: { maxRows: 8 } });
  const embed = (rows: number) =>
    fetch(`${gw.url}/v1/embeddings`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'local-model', input: Array.from({ length: rows }, (_, i) => `row ${i}`) }),
    });
  const tokenized = () => llama.requests.filter((r) => r.path === '/tokenize').length;
  const res = await embed(33);
  t.equal(res.status, 413);
  t.same(((await res.json()) as Envelope).error, { message: 'too many rows: 33, the limit is 8', type: 'invalid_request_error', param: null, code: 'too_many_rows', rows: 33, limit: 8 });
  t.equal(tokenized(), 0, 'no row was counted');
  // Just past the limit, the rows are counted first (a refused plan shows each row's tokens).
  const near = await embed(32);
  t.equal(near.status, 413);
  t.ok(tokenized() > 0);
  // Eight rows are counted and served.
  t.equal((await embed(8)).status, 200);
});

t.test('a tool offer with more parameters than the limits can hold at 3 tokens each: refused on that floor, before counting', async (t) => {
  const { both, post, upstream } = await setup(t, {});
  const properties = Object.fromEntries(Array.from({ length: 12_300 }, (_, i) => [`p${i}`, { type: 'string' }]));
  const tools = [{ type: 'function', function: { name: 'fill', parameters: { type: 'object', properties } } }];
  const real = await both('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools });
  t.equal(real.status, 413);
  t.same(real.body.error, {
    message: 'too many tokens: one row has at least 36906 tokens, the limit is 36864 per row (a lower bound: 1 messages and 12300 tool parameters and enum values (less one an enum) at 3 tokens each, before what they say)',
    type: 'invalid_request_error',
    param: null,
    code: 'row_too_large',
    row_index: 0,
    row_tokens: 36906,
    limit: 36864,
    count_method: 'tiktoken:o200k_base:lower-bound',
  });
  // Nested parameters count too (an object's properties, an array's items').
  const nested = { type: 'object', properties: { outer: { type: 'object', properties }, list: { type: 'array', items: { type: 'object', properties } } } };
  const deep = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: nested } }] });
  t.equal(deep.status, 413);
  t.equal(deep.body.error.count_method, 'tiktoken:o200k_base:lower-bound');
  t.equal(upstream.requests.length, 0);
  // A parameter with an empty enum (its own, or its items') may cost less than 3 tokens: no floor.
  const emptyEnums = Object.fromEntries(Array.from({ length: 12_300 }, (_, i) => [`p${i}`, { enum: [], items: { enum: [] } }]));
  const counted = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: emptyEnums } } }] });
  t.not(counted.body.error?.count_method, 'tiktoken:o200k_base:lower-bound', 'counted, not refused on the floor');
  // An enum's values count at 3 each (an enum −3): forty thousand of them are refused on the floor, uncounted.
  const manyValues = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { mode: { type: 'string', enum: Array.from({ length: 40_000 }, (_, i) => i) } } } } }] });
  t.equal(manyValues.status, 413);
  t.equal(manyValues.body.error.count_method, 'tiktoken:o200k_base:lower-bound');
  // Parameters with empty enums pull the floor down, as they pull the count down: 12,300 ordinary
  // parameters beside 6,000 with two empty enums each are counted, not refused on the floor.
  const mixed = { ...properties, ...Object.fromEntries(Array.from({ length: 6_000 }, (_, i) => [`e${i}`, { enum: [], items: { enum: [] } }])) };
  const pulled = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: mixed } } }] });
  t.not(pulled.body.error?.count_method, 'tiktoken:o200k_base:lower-bound');
  // A tool of another type is counted as its own kind, whatever `function` it carries beside.
  const custom = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'custom', custom: { name: 'x' }, function: { name: 'f', parameters: { type: 'object', properties } } }] });
  t.not(custom.body.error?.count_method, 'tiktoken:o200k_base:lower-bound');
  // A research round past its tools' floor goes as the tools-free final answer, as one past its count does.
  const round = await post('/v1/chat/completions', {
    model: 'gpt-4o',
    messages: [
      { role: 'user', content: 'look it up' },
      { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'fill', arguments: '{}' } }] },
      { role: 'tool', tool_call_id: 'c1', content: 'found it' },
    ],
    tools,
  });
  t.equal(round.status, 200, 'answered');
  t.match(round.headers.get('x-tollgate-notice'), /finishing-the-answer/);
  t.equal(upstream.requests.at(-1)?.body?.tools, undefined, 'sent without its tools');
});

t.test('an object with more than 256 fields in a message, or a request with more than 256, is a 400 naming it', async (t) => {
  const { post, upstream } = await setup(t, {});
  const many = (n: number) => Object.fromEntries(Array.from({ length: n }, (_, i) => [`f${i}`, 0]));
  const message = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }, { role: 'user', content: 'x', ...many(300) }] });
  t.equal(message.status, 400);
  t.same(message.body.error, { message: 'messages[1]: has more than 256 fields, the most an object of a message may have', type: 'invalid_request_error', param: 'messages[1]', code: 'invalid_request' });
  const part = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: [{ type: 'text', text: 'x', ...many(300) }] }] });
  t.equal(part.status, 400);
  t.equal(part.body.error.param, 'messages[0].content[0]');
  const top = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], ...many(300) });
  t.equal(top.status, 400);
  t.equal(top.body.error.message, 'the request has more than 256 fields, the most it may have');
  t.equal(upstream.requests.length, 0, 'nothing was sent');
  // Wide tools are bounded in all: 50,000 fields at any depth.
  const wide = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', $defs: many(60_000) } } }] });
  t.equal(wide.status, 400);
  t.equal(wide.body.error.message, 'the request has more than 50000 fields and array elements outside its messages and rows (at any depth), the most it may have');
  // Array elements count too: an enum of 60,000 values.
  const values = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi' }], response_format: { type: 'json_schema', json_schema: { name: 's', schema: { enum: Array.from({ length: 60_000 }, (_, i) => i) } } } });
  t.equal(values.status, 400);
  // Messages have a bound of their own, far larger: a million fields and array elements.
  const hoard = await post('/v1/chat/completions', { model: 'gpt-4o', messages: [{ role: 'user', content: 'hi', x: Array.from({ length: 1_000_001 }, () => []) }] });
  t.equal(hoard.status, 400);
  t.equal(hoard.body.error.message, 'messages: have more than 1000000 fields and array elements in all (at any depth), the most they may have');
  t.equal(upstream.requests.length, 0, 'nothing was sent');
  // A long agent run's messages are many fields, and not held to that bound: 6,000 tool rounds.
  const rounds = Array.from({ length: 6_000 }, (_, i) => [
    { role: 'assistant', content: null, tool_calls: [{ id: `c${i}`, type: 'function', function: { name: 'read', arguments: '{}' } }] },
    { role: 'tool', tool_call_id: `c${i}`, content: 'ok' },
  ]).flat();
  const long = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'go' }, ...rounds] });
  t.not(long.status, 400, `a long run is no field-count refusal (${long.status})`);
  // A schema of 3,000 described properties (OpenAI takes up to 5,000; more would not fit the row limit here) is no such request.
  const schema = Object.fromEntries(Array.from({ length: 3_000 }, (_, i) => [`p${i}`, { type: 'string', description: 'd' }]));
  const big = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'hi' }], tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object', properties: schema } } }] });
  t.equal(big.status, 200);
  // 256 of them still go (a provider's own fields pass through).
  const fits = await post('/v1/chat/completions', { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: 'x', ...many(254) }] });
  t.equal(fits.status, 200);
});

t.test('row shape errors: an empty string is named before an empty list of token ids, wherever they are', async (t) => {
  const { post } = await setup(t, {});
  const first = await post('/v1/embeddings', { model: 'text-embedding-3-small', input: [[], ''] });
  t.equal(first.status, 400);
  t.equal(first.body.error.message, 'input[1]: must not be empty');
  const second = await post('/v1/embeddings', { model: 'text-embedding-3-small', input: ['a', [], ''] });
  t.equal(second.body.error.message, 'input[2]: must not be empty');
  const tokens = await post('/v1/embeddings', { model: 'text-embedding-3-small', input: ['a', []] });
  t.equal(tokens.body.error.message, 'input[1]: must not be an empty list of token ids');
});

t.test('a model no tokenizer here knows is refused on the byte estimate, and the refusal says it is one', async (t) => {
  const { upstream, both } = await setup(t, { maxRowTokens: 8 }, { models: ['mystery-*'] });
  const res = await both('/v1/completions', { model: 'mystery-1', prompt: 'x'.repeat(44), max_tokens: 1 });
  t.equal(res.status, 413);
  t.same(res.body.error, {
    message: 'too many tokens: one row has about 11 tokens, the limit is 8 per row (an estimate, UTF-8 bytes ÷ 4: no tokenizer here knows this model)',
    type: 'invalid_request_error',
    param: null,
    code: 'row_too_large',
    row_index: 0,
    row_tokens: 11,
    limit: 8,
    count_method: 'estimate:bytes',
  });
  t.equal(upstream.requests.length, 0);
});
