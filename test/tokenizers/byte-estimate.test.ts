import t from 'tap';
import { Pool } from 'undici';
import { ByteEstimateCounter, estimateTokens } from '../../metering/tokenizers/byte-estimate.js';
import { createCounters } from '../../metering/tokenizers/index.js';
import { LlamaCppCounter } from '../../metering/tokenizers/llamacpp-counter.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';

t.test('ceil(UTF-8 bytes / 4), always labelled estimate:bytes', async (t) => {
  t.equal(estimateTokens(''), 0);
  t.equal(estimateTokens('abcd'), 1);
  t.equal(estimateTokens('abcde'), 2);
  t.equal(estimateTokens('héllo'), 2); // 6 bytes
  t.equal(estimateTokens('😀'), 1); // 4 bytes
  const c = new ByteEstimateCounter();
  t.same(await c.countText('abcdefgh'), { tokens: 2, method: 'estimate:bytes', upperBound: false });
  t.equal(c.countOutput('abcdefghi'), 3);
});

t.test('chat: per-message overhead on the JSON bytes, tools first, prefix and priming', async (t) => {
  const c = new ByteEstimateCounter();
  const m1 = { role: 'user', content: 'hi' }; // {"role":"user","content":"hi"} = 30 bytes → 8
  const tools = [{ type: 'function', function: { name: 'f' } }];
  const r = await c.countChat({ model: 'x', messages: [m1, m1], tools });
  const toolShare = estimateTokens(JSON.stringify(tools));
  t.same(r.prefix, [toolShare, toolShare + 11, toolShare + 22]);
  t.equal(r.tokens, toolShare + 25);
  t.equal(r.method, 'estimate:bytes');
});

t.test('createCounters: OpenAI names → tiktoken, llama.cpp upstreams → server, else estimate', async (t) => {
  const pool = new Pool('http://127.0.0.1:9');
  t.teardown(() => pool.close());
  const counters = createCounters();
  const openai = { kind: 'openai' as const, baseUrl: 'https://api.openai.com/v1', dispatcher: pool };
  const llama = { kind: 'llamacpp' as const, baseUrl: 'http://127.0.0.1:9', dispatcher: pool };
  const gpt = counters.counterFor(openai, 'gpt-4o-mini');
  t.type(gpt, TiktokenCounter);
  t.equal(gpt.method, 'tiktoken:o200k_base');
  t.equal(counters.counterFor(openai, 'openai/gpt-4o'), gpt, 'one counter per encoding');
  t.equal(counters.counterFor(openai, 'gpt-3.5-turbo').method, 'tiktoken:cl100k_base');
  t.type(counters.counterFor(llama, 'gpt-4o'), LlamaCppCounter, 'a llama.cpp server counts with its own vocabulary');
  t.equal(counters.counterFor(openai, 'mistral-large').method, 'estimate:bytes');
  t.equal(counters.fallback.method, 'estimate:bytes');
});

t.test('a structured-output schema is estimated with the tools, before the messages', async (t) => {
  const counter = new ByteEstimateCounter();
  const messages = [{ role: 'user', content: 'Extract the fields.' }];
  const format = { name: 'extraction', schema: { type: 'object', properties: { a: { type: 'string' } } } };
  const plain = await counter.countChat({ model: 'x', messages });
  const shaped = await counter.countChat({ model: 'x', messages, format });
  t.equal(shaped.prefix[0], Math.ceil(Buffer.byteLength(JSON.stringify(format)) / 4));
  t.equal(shaped.tokens - plain.tokens, shaped.prefix[0]);
});
