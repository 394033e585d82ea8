// /v1/completions and /v1/embeddings go through the same pipeline as chat (SPEC §2, §8, §11):
// the official SDK gets the upstream's answer, the allowance is made explicit, rows are counted,
// and `n: 2` is reserved and charged for both choices.

import t from 'tap';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, openaiUpstream, llamaUpstream, type TestGateway } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';

async function rows(gw: TestGateway): Promise<LedgerRow[]> {
  const out: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) out.push(row);
  return out;
}

t.test('completions, non-streamed and streamed, through the SDK', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });

  // 1. non-streamed
  const { data, response } = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Once upon a time', max_tokens: 12 }).withResponse();
  t.equal(data.choices[0].text, ' hi hi hi hi');
  t.equal(data.object, 'text_completion');
  const seen = upstream.requests.at(-1)!;
  t.equal(seen.path, '/v1/completions');
  t.equal(seen.body?.max_tokens, 12, 'allowance explicit');
  t.equal(seen.body?.prompt, 'Once upon a time');
  t.equal(response.headers.get('x-tollgate-refund-tokens'), '8', '12 reserved, 4 generated');

  // 2. streamed: usage forced on upstream, the client gets the text and [DONE]
  const stream = await client.completions.create({ model: 'gpt-3.5-turbo-instruct', prompt: 'Once upon a time', max_tokens: 12, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  t.equal(text, ' hi hi hi hi');
  t.same(upstream.requests.at(-1)!.body?.stream_options, { include_usage: true });

  // 3. a prompt array is one row per element, and the allowance is per row
  const res = await fetch(`${gw.url}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-3.5-turbo-instruct', prompt: ['a', 'b', 'c'], max_tokens: 5 }),
  });
  t.equal(res.status, 200);
  const all = await rows(gw);
  t.equal(all.length, 3);
  t.match(all[0], { endpoint: 'completions', rows: 1, allowance: 12, generated_tokens: 4, status: 200 });
  t.match(all[1], { endpoint: 'completions', rows: 1, allowance: 12, generated_tokens: 4, status: 200 });
  t.match(all[2], { endpoint: 'completions', rows: 3, allowance: 15 });
});

t.test('embeddings pass through: rows counted, no allowance, no max_tokens added', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { models: ['text-embedding-*'], billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });
  const { data, response } = await client.embeddings
    .create({ model: 'text-embedding-3-small', input: ['first row', 'second row'], encoding_format: 'float' })
    .withResponse();
  t.equal(data.data.length, 2);
  t.same(data.data[1].embedding, [0.1, 0.2, 0.3]);
  const seen = upstream.requests.at(-1)!;
  t.equal(seen.path, '/v1/embeddings');
  t.same(seen.body, { model: 'text-embedding-3-small', input: ['first row', 'second row'], encoding_format: 'float' }, 'forwarded as sent');
  t.equal(response.headers.get('x-tollgate-count-method'), 'tiktoken:cl100k_base');
  const [row] = await rows(gw);
  t.match(row, { endpoint: 'embeddings', rows: 2, allowance: 0, generated_tokens: 0, refund_tokens: 0, status: 200 });
  t.equal(row.prompt_tokens, 4, '"first row" + "second row": 2 + 2 tokens');
  t.equal(row.charge_tokens, row.prompt_charge);
  // The SDK's default asks for base64 (as OpenAI answers it, the float32 bytes): passed through, it
  // decodes to the same vector.
  const base64 = await client.embeddings.create({ model: 'text-embedding-3-small', input: 'third row' });
  t.equal(base64.data[0]!.embedding.length, 3);
  t.ok(base64.data[0]!.embedding.every((x, k) => Math.abs(x - [0.1, 0.2, 0.3][k]!) < 1e-6), 'the same vector, through base64');
});

t.test('embeddings through a llama.cpp upstream', async (t) => {
  const llama = await startLlamaCppDouble();
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const res = await fetch(`${gw.url}/v1/embeddings`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'tiny', input: ['one', 'two three'] }) });
  t.equal(res.status, 200);
  const body = (await res.json()) as { data: Array<{ embedding: number[] }>; usage: { prompt_tokens: number } };
  t.equal(body.data.length, 2);
  const [row] = await rows(gw);
  t.equal(row.rows, 2);
  t.equal(row.prompt_tokens, body.usage.prompt_tokens, 'the pre-count is the server’s own');
  t.equal(row.count_method, 'llamacpp');
});

t.test('n: 2 with the OpenAI double reserves and charges both choices', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any', maxRetries: 0 });

  // 1. chat, non-streamed: allowance 10 × 2, generated 3 × 2
  const { data, response } = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'two please' }], max_tokens: 10, n: 2 }).withResponse();
  t.equal(data.choices.length, 2);
  t.equal(upstream.requests.at(-1)!.body?.max_tokens, 10, 'per-choice allowance upstream');
  t.equal(upstream.requests.at(-1)!.body?.n, 2);
  t.equal(response.headers.get('x-tollgate-refund-tokens'), '14', '20 reserved − 6 generated');

  // 2. chat, streamed: both choices' tokens counted
  const stream = await client.chat.completions.create({ model: 'gpt-4o', messages: [{ role: 'user', content: 'two please' }], max_tokens: 10, n: 2, stream: true });
  const texts = ['', ''];
  for await (const chunk of stream) for (const c of chunk.choices) texts[c.index] += c.delta?.content ?? '';
  t.same(texts, [' hi hi hi', ' hi hi hi']);

  // 3. completions, n: 2
  const completion = await client.completions.create({ model: 'gpt-4o', prompt: 'two please', max_tokens: 10, n: 2 });
  t.equal(completion.choices.length, 2);

  const all = await rows(gw);
  t.equal(all.length, 3);
  for (const row of all) {
    t.equal(row.allowance, 20, `${row.endpoint}: allowance = max_tokens × n`);
    t.equal(row.generated_tokens, 6, `${row.endpoint}: both choices counted`);
    t.equal(row.charge_tokens, row.prompt_charge + 6);
    t.equal(row.refund_tokens, 14);
  }
});

t.test('n: 2 streamed: the gateway’s own meter counts both choices when the upstream reports no usage', async (t) => {
  // A stream lost before its usage chunk leaves only the gateway's count: 2 + 2 tokens streamed.
  const upstream = await startOpenAiDouble({ completionTokens: 10, dropAfterChunks: 4 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', messages: [{ role: 'user', content: 'two please' }], max_tokens: 10, n: 2, stream: true }),
  });
  const text = await res.text();
  t.ok(text.endsWith('data: [DONE]\n\n'));
  const [row] = await rows(gw);
  t.equal(row.generated_tokens, 4, 'two tokens of each choice');
  t.equal(row.refund_tokens, 16);
});
