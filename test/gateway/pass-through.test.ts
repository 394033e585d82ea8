// The foundation: the official openai SDK talks to the gateway as if it were OpenAI, and the
// upstream sees the allowance made explicit, its own key, and none of the client's credentials.

import t from 'tap';
import OpenAI from 'openai';
import { request as httpRequest } from 'node:http';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';

t.test('chat, non-streamed, through the openai SDK', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] }, { env: { DOUBLE_KEY: 'sk-upstream' } });
  t.equal(gw.ledger.kind, process.env.TOLLGATE_TEST_STORE === 'postgres' ? 'postgres' : 'sqlite', 'the ledger this suite runs on');
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-anything' });
  const { data, response } = await client.chat.completions
    .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say hi' }], max_tokens: 20 })
    .withResponse();
  t.equal(data.choices[0].message.content, ' hi hi hi hi hi');
  // 1. the upstream got its own key, not the client's, and an explicit allowance
  const seen = upstream.requests.at(-1)!;
  t.equal(seen.headers.authorization, 'Bearer sk-upstream');
  t.equal(seen.headers['accept-encoding'], 'identity', 'and is asked for a body the gateway can read as it comes (not compressed)');
  t.equal(seen.body?.max_tokens, 20);
  // 2. charge headers: reserved = prompt charge + allowance; refund = allowance − generated
  const reserved = Number(response.headers.get('x-tollgate-reserved-tokens'));
  const charge = Number(response.headers.get('x-tollgate-charge-tokens'));
  const refund = Number(response.headers.get('x-tollgate-refund-tokens'));
  t.equal(refund, 15);
  t.equal(charge + refund, reserved);
  t.ok(response.headers.get('x-tollgate-conversation'));
});

// Regression (an outside audit of SPEC §2): nothing of the client's headers reached the upstream,
// where SPEC §2 drops its credentials and the hop-by-hop headers. Those that describe the client
// and its call go on; those that could choose the route, the account or the cache do not.
t.test("the client's descriptive headers reach the upstream; its credentials, routing, hop-by-hop headers and the gateway's own do not", async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] }, { env: { DOUBLE_KEY: 'sk-upstream' } });
  const client = new OpenAI({
    baseURL: `${gw.url}/v1`,
    apiKey: 'tg-anything',
    organization: 'org-client',
    project: 'proj-client',
    defaultHeaders: { 'openai-beta': 'assistants=v2', 'x-title': 'My agent', 'http-referer': 'https://example.test', 'x-tollgate-conversation': 'c-headers', 'api-key': 'client-azure-key', 'x-goog-user-project': 'client-project', 'x-portkey-config': 'pc-other', cookie: 'session=secret', 'x-request-id': 'client-id', 'if-none-match': '"etag"', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01' },
  });
  await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say hi' }], max_tokens: 5 });
  const seen = upstream.requests.at(-1)!.headers;
  t.match(seen, { 'openai-beta': 'assistants=v2', 'x-title': 'My agent', 'http-referer': 'https://example.test', traceparent: '00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01', authorization: 'Bearer sk-upstream', 'accept-encoding': 'identity' }, "passed on, beside the gateway's own");
  t.match(String(seen['user-agent']), /^OpenAI\/JS/, "the SDK's user agent");
  t.ok(Object.keys(seen).some((name) => name.startsWith('x-stainless-')), "the SDK's x-stainless-* headers");
  for (const name of ['openai-organization', 'openai-project', 'api-key', 'x-goog-user-project', 'x-portkey-config', 'cookie', 'x-tollgate-conversation', 'if-none-match']) t.equal(seen[name], undefined, `${name} stays behind`);
  t.not(seen['x-request-id'], 'client-id', "the request id is the gateway's");
  // Hop-by-hop headers, and one the client's `connection` names (fetch will not send these).
  const body = JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say hi' }], max_tokens: 5 });
  const { port } = new URL(gw.url);
  await new Promise<void>((resolve, reject) => {
    const req = httpRequest(
      { port, method: 'POST', path: '/v1/chat/completions', headers: { 'content-type': 'application/json', 'content-length': Buffer.byteLength(body), connection: 'keep-alive, x-hop', 'keep-alive': 'timeout=5', 'x-hop': '1', te: 'trailers', 'x-title': 'kept' }, agent: false },
      (res) => res.resume().on('end', resolve),
    );
    req.on('error', reject);
    req.end(body);
  });
  const raw = upstream.requests.at(-1)!.headers;
  t.equal(raw['x-title'], 'kept');
  for (const name of ['keep-alive', 'x-hop', 'te']) t.equal(raw[name], undefined, `${name} stays behind`);
});

t.test('chat, streamed, through the openai SDK', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-anything' });
  const stream = await client.chat.completions.create({
    model: 'gpt-4o',
    messages: [{ role: 'user', content: 'Say hi' }],
    max_completion_tokens: 10,
    stream: true,
  });
  let text = '';
  let usageSeen = false;
  for await (const chunk of stream) {
    text += chunk.choices[0]?.delta?.content ?? '';
    if (chunk.usage) usageSeen = true;
  }
  t.equal(text, ' hi hi hi hi');
  t.notOk(usageSeen, 'no usage chunk unless the client asked');
  const seen = upstream.requests.at(-1)!;
  t.same(seen.body?.stream_options, { include_usage: true }, 'usage forced on upstream');
  t.equal(seen.body?.max_completion_tokens, 10);
});

// Regression: a chat request that named no allowance reached every OpenAI-compatible server with
// max_completion_tokens, which Mistral refuses (422) and Ollama ignores (generating on).
t.test('the allowance travels in the field the upstream reads', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, {
    upstreams: [openaiUpstream(upstream.url, { models: ['gpt-4o'] }), openaiUpstream(upstream.url, { name: 'ollama', models: ['gpt-4o-mini'], allowanceField: 'max_tokens' })],
  });
  const send = async (body: Record<string, unknown>) => {
    await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ messages: [{ role: 'user', content: 'Hi' }], ...body }) });
    const sent = upstream.requests.at(-1)!.body!;
    return { max_tokens: sent.max_tokens, max_completion_tokens: sent.max_completion_tokens };
  };
  t.same(await send({ model: 'gpt-4o' }), { max_tokens: 4096, max_completion_tokens: undefined }, 'named none: max_tokens, away from OpenAI itself');
  t.same(await send({ model: 'gpt-4o', max_completion_tokens: 9 }), { max_tokens: undefined, max_completion_tokens: 9 }, "else the client's own field");
  t.same(await send({ model: 'gpt-4o-mini', max_completion_tokens: 9 }), { max_tokens: 9, max_completion_tokens: undefined }, 'or the one the upstream is configured to read');
  const { allowanceFieldOf } = await import('../../server/pipeline/forward.js');
  const at = (origin: string, model = 'gpt-4o', kind: 'chat' | 'completions' = 'chat', allowanceField: string | null = null) =>
    allowanceFieldOf({ upstream: { origin, config: { kind: 'openai', allowanceField } }, valid: { kind, model, maxTokensField: null } } as never);
  t.equal(at('https://api.openai.com'), 'max_completion_tokens', 'OpenAI itself: every chat model reads it');
  for (const host of ['https://eu.api.openai.com', 'https://my-east.openai.azure.com', 'https://res.cognitiveservices.azure.com', 'https://proj.services.ai.azure.com:443']) {
    t.equal(at(host), 'max_completion_tokens', host);
  }
  t.equal(at('https://api.mistral.ai'), 'max_tokens');
  t.equal(at('https://proj.services.ai.azure.com', 'Mistral-Large-2411'), 'max_tokens', "Foundry's other vendors read max_tokens");
  for (const model of ['o1', 'o3-mini', 'o4-mini-2025-04-16', 'gpt-5', 'gpt-5.1-codex']) {
    t.equal(at('https://gateway.example.test/v1', model), 'max_completion_tokens', `${model} behind a proxy: its reasoning models refuse max_tokens`);
  }
  t.equal(at('https://openrouter.ai/api/v1', 'openai/o3'), 'max_tokens', "a router's vendor-prefixed name takes max_tokens");
  t.equal(at('https://api.openai.com', 'gpt-3.5-turbo-instruct', 'completions'), 'max_tokens', 'completions have only max_tokens');
  t.equal(at('https://api.openai.com', 'gpt-3.5-turbo-instruct', 'completions', 'max_completion_tokens'), 'max_tokens', 'whatever the upstream is configured with');
});

t.test('unknown model is a 404 model_not_found and reaches no upstream', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'claude-9', messages: [{ role: 'user', content: 'x' }] }),
  });
  t.equal(res.status, 404);
  const body = (await res.json()) as { error: { code: string; param: string } };
  t.equal(body.error.code, 'model_not_found');
  t.equal(body.error.param, 'model');
  t.equal(upstream.requests.length, 0);
});

t.test('a non-streamed answer reaches the client byte for byte as the upstream wrote it', async (t) => {
  const { createServer } = await import('node:http');
  // Spacing, key order and number forms a re-serialisation would change.
  const written =
    '{ "id": "chatcmpl-raw", "object": "chat.completion", "created": 1, "model": "gpt-4o-mini",\n' +
    '  "choices": [ { "index": 0, "message": { "role": "assistant", "content": "hi \\u00e9" }, "finish_reason": "stop" } ],\n' +
    '  "usage": { "prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11 }, "score": 1.50, "tiny": 1e-7 }';
  const server = createServer((req, res) => {
    req.resume();
    req.on('end', () => res.writeHead(200, { 'content-type': 'application/json' }).end(written));
  });
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.teardown(() => new Promise<void>((r) => server.close(() => r())));
  const port = (server.address() as { port: number }).port;
  const gw = await startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${port}`)] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Say hi' }], max_tokens: 20 }),
  });
  t.equal(res.status, 200);
  t.match(res.headers.get('content-type'), /^application\/json/);
  t.equal(await res.text(), written, 'not re-serialised');
  t.equal(res.headers.get('x-tollgate-refund-tokens'), '18', 'and still metered from its usage');
});

t.test('streamed chunks: "usage": null (there because the gateway asks for usage) reaches only a client that asked', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 6 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const stream = async (includeUsage: boolean) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, max_tokens: 20, messages: [{ role: 'user', content: 'Count.' }], ...(includeUsage ? { stream_options: { include_usage: true } } : {}) }),
    });
    const text = await res.text();
    const chunks = text.split('\n\n').filter((e) => e.startsWith('data: {')).map((e) => JSON.parse(e.slice(6)) as Record<string, unknown>);
    const content = chunks.filter((c) => ((c.choices as Array<{ delta?: { content?: string } }>)[0]?.delta?.content ?? '') !== '');
    const trailer = JSON.parse(/^: tollgate (.*)$/m.exec(text)![1]) as { charge_tokens: number; refund_tokens: number };
    return { chunks, content, trailer, reserved: Number(res.headers.get('x-tollgate-reserved-tokens')) };
  };
  t.equal(upstream.requests.length, 0);
  const quiet = await stream(false);
  t.match(upstream.requests.at(-1)?.body, { stream_options: { include_usage: true } }, 'the gateway asked the upstream for usage');
  t.equal(quiet.content.length, 6);
  t.equal(quiet.content.map((c) => (c.choices as Array<{ delta: { content: string } }>)[0]!.delta.content).join(''), ' hi'.repeat(6));
  t.ok(quiet.chunks.every((c) => !('usage' in c)), 'no chunk carries usage for a client that did not ask');
  // OpenAI's stream padding is the upstream's own: passed on as it came, with or without usage.
  t.ok(quiet.content.every((c) => typeof c.obfuscation === 'string' && Object.keys(c).at(-1) === 'obfuscation'), 'the padding stays, last');
  t.equal(quiet.trailer.refund_tokens, 14, '6 of 20 generated, counted from the chunks passed on');

  const asked = await stream(true);
  t.ok(asked.content.every((c) => 'usage' in c && c.usage === null), 'every content chunk as OpenAI sends it: "usage": null');
  t.ok(asked.content.every((c) => typeof c.obfuscation === 'string'), 'and its padding');
  t.match(asked.chunks.at(-1), { choices: [], usage: { completion_tokens: 6 } }, 'the figures last');
  t.same(asked.trailer, quiet.trailer);
});

t.test('a streamed tool call reaches a client that asked for usage as OpenAI wrote it, not re-serialised', async (t) => {
  const upstream = await startOpenAiDouble({ toolCalls: () => [{ name: 'get_weather', arguments: '{"city":"Oslo"}' }] });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }];
  const stream = async (includeUsage: boolean) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', stream: true, max_tokens: 20, tools, messages: [{ role: 'user', content: 'Weather in Oslo?' }], ...(includeUsage ? { stream_options: { include_usage: true } } : {}) }),
    });
    const events = (await res.text()).split('\n\n').filter((e) => e.startsWith('data: {') && e.includes('"tool_calls":['));
    t.equal(events.length, 1);
    return JSON.parse(events[0]!.slice(6)) as Record<string, unknown>;
  };
  const asked = await stream(true);
  // The member order is the upstream's (a re-serialised chunk had its metadata first, choices last).
  t.same(Object.keys(asked).slice(-3), ['choices', 'usage', 'obfuscation'], 'as written: "usage": null and the padding after the choices');
  t.equal(asked.usage, null);
  const quiet = await stream(false);
  t.notOk('usage' in quiet, 'a client that did not ask gets no usage member');
  t.match(quiet.choices, [{ delta: { tool_calls: [{ function: { name: 'get_weather', arguments: '{"city":"Oslo"}' } }] } }]);
});

t.test('a custom tool (not a function) is passed on as written and counted', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const tool = { type: 'custom' as const, custom: { name: 'code_exec', description: 'Runs Python code and returns what it prints' } };
  const messages = [{ role: 'user' as const, content: 'What is 2**100?' }];
  const done = await client.chat.completions.create({ model: 'gpt-5', messages, tools: [tool], max_completion_tokens: 20 });
  t.equal(done.choices[0]?.finish_reason, 'stop');
  t.same(upstream.requests.at(-1)!.body?.tools, [tool], 'the upstream sees the tool as the client wrote it');
  // The tool's name and description are counted, as a function's are.
  const plan = async (body: Record<string, unknown>) =>
    (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { sum_tokens: number };
  const withTool = await plan({ model: 'gpt-5', messages, tools: [tool] });
  const without = await plan({ model: 'gpt-5', messages });
  t.ok(withTool.sum_tokens > without.sum_tokens + 10, `${withTool.sum_tokens} > ${without.sum_tokens} + 10`);
  // A function tool still needs its name; a tool's type must be a string.
  const bad = async (tools: unknown) =>
    (await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-5', messages, tools }) })).json() as Promise<{ error: { param: string } }>;
  t.equal((await bad([{ type: 'function', function: {} }])).error.param, 'tools[0].function.name');
  t.equal((await bad([{ type: 7 }])).error.param, 'tools[0].type');
});

t.test('a legacy `functions` offer is counted and hashed as the tools it stands for', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const fn = { name: 'search', description: 'Search the company handbook for a policy and return the matching paragraphs', parameters: { type: 'object', properties: { q: { type: 'string', description: 'what to look for' } } } };
  const messages = [{ role: 'user', content: 'What is the travel policy?' }];
  const plan = async (body: Record<string, unknown>) =>
    (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { sum_tokens: number };
  const legacy = await plan({ model: 'gpt-4o', messages, functions: [fn] });
  const current = await plan({ model: 'gpt-4o', messages, tools: [{ type: 'function', function: fn }] });
  t.equal(legacy.sum_tokens, current.sum_tokens, 'the same prompt as the same offer in `tools`');
  // Sent beside `tools`, `functions` is forwarded too, and counted too.
  const both = await plan({ model: 'gpt-4o', messages, tools: [{ type: 'function', function: fn }], functions: [{ ...fn, name: 'lookup' }] });
  const twice = await plan({ model: 'gpt-4o', messages, tools: [{ type: 'function', function: fn }, { type: 'function', function: { ...fn, name: 'lookup' } }] });
  t.equal(both.sum_tokens, twice.sum_tokens, 'both offers counted');

  // A changed offer shares nothing with the turn before (SPEC §4).
  const send = (functions: unknown[], msgs: unknown[]) =>
    fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'legacy' },
      body: JSON.stringify({ model: 'gpt-4o', max_tokens: 4, messages: msgs, functions }),
    });
  t.equal((await send([fn], messages)).status, 200);
  const next = [...messages, { role: 'assistant', content: ' hi hi' }, { role: 'user', content: 'And for contractors?' }];
  const other = await send([{ ...fn, name: 'lookup' }], next);
  t.equal(other.status, 200);
  t.equal(other.headers.get('x-tollgate-shared-prefix-tokens'), '0', 'another functions offer: nothing shared');
  const bad = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o', messages, functions: [{}] }) });
  t.equal(((await bad.json()) as { error: { param: string } }).error.param, 'functions[0].name');
});
