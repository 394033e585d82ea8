import t from 'tap';
import { Pool, request } from 'undici';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { fetchContextWindow, LlamaCppCounter, LlamaCppCountError } from '../../metering/tokenizers/llamacpp-counter.js';
import { TokenCache } from '../../metering/token-cache.js';
import type { ChatMessage, ToolDefinition } from '../../metering/types.js';

const SYSTEM: ChatMessage = { role: 'system', content: 'You are a terse assistant. Answer in one short sentence.' };
const USER: ChatMessage = { role: 'user', content: 'What is the capital of France?' };
const TOOLS: ToolDefinition[] = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Get the current weather for a city',
      parameters: { type: 'object', properties: { city: { type: 'string', description: 'City name' } }, required: ['city'] },
    },
  },
];

async function setup(t: { teardown(fn: () => unknown): void }, opts = {}) {
  const double = await startLlamaCppDouble(opts);
  const pool = new Pool(double.url);
  t.teardown(async () => {
    await pool.close();
    await double.close();
  });
  const counter = new LlamaCppCounter({ dispatcher: pool, baseUrl: double.url, cache: new TokenCache() });
  return { double, pool, counter };
}

t.test('chat count equals the server usage.prompt_tokens, in two calls', async (t) => {
  const { double, counter } = await setup(t);
  const c = await counter.countChat({ model: 'tiny', messages: [SYSTEM, USER] });
  t.equal(c.tokens, 34, 'as recorded: tokenize-turn1-prompt and chat-nonstream');
  t.equal(c.method, 'llamacpp');
  t.equal(c.upperBound, false);
  t.same(double.requests.map((r) => r.path), ['/apply-template', '/tokenize']);
  const withTools = await counter.countChat({ model: 'tiny', messages: [SYSTEM, USER], tools: TOOLS });
  t.equal(withTools.tokens, 208, 'as recorded: chat-tools');
  // The same prompt again is rendered, and its tokens are known: no second /tokenize.
  await counter.countChat({ model: 'tiny', messages: [SYSTEM, USER] });
  t.same(double.requests.slice(4).map((r) => r.path), ['/apply-template']);
  // And it matches what the server then reports.
  const res = await request(`${double.url}/v1/chat/completions`, { method: 'POST', body: JSON.stringify({ messages: [SYSTEM, USER], max_tokens: 2 }) });
  const usage = ((await res.body.json()) as { usage: { prompt_tokens: number } }).usage;
  t.equal(usage.prompt_tokens, c.tokens);
});

t.test("each count carries digests of its tokens, and a rendering that changed is counted again", async (t) => {
  let today = '29 Nov 2026';
  const { double, counter } = await setup(t, { systemPreamble: () => `Today Date: ${today}\n\n` });
  const prompt = { model: 'tiny', messages: [SYSTEM, USER] };
  const before = await counter.countChat(prompt);
  t.equal(before.prefixDigests?.length, before.prefix.length, 'one digest a boundary');
  t.same((await counter.countChat(prompt)).prefixDigests, before.prefixDigests, 'the same rendering: the same digests');
  today = '30 Nov 2026';
  const after = await counter.countChat(prompt);
  t.same(after.prefix, before.prefix, 'the new date counts the same');
  t.not(after.prefixDigests![0], before.prefixDigests![0], 'and its tokens differ from the first boundary on');
  t.equal(double.requests.filter((r) => r.path === '/tokenize').length, 2, 'tokenized again, not taken from the cache');
  // Digests cover exactly prefix[k] tokens: a count's digest equals one of the same leading ids.
  const { tokenDigests } = await import('../../metering/tokenizers/prompt-boundaries.js');
  t.same(tokenDigests([1, 2, 3], [0, 2, 3]), [tokenDigests([], [0])[0], tokenDigests([1, 2], [2])[0], tokenDigests([1, 2, 3, 4], [3])[0]]);
  t.not(tokenDigests([1, 2], [2])[0], tokenDigests([2, 1], [2])[0], 'order counts');
  // And the digest at any count (the charge's check of a previous request's boundaries) is the same.
  const { tokenDigestAt } = await import('../../metering/tokenizers/prompt-boundaries.js');
  const words = Int32Array.from([1, 2, 3]);
  t.same([0, 2, 3].map((n) => tokenDigestAt(words, n)), tokenDigests([1, 2, 3], [0, 2, 3]));
  t.equal(tokenDigestAt(words, 4), '', 'past the last id: no digest of another request can match');
  t.equal(after.digestAt!(after.prefix[1]!), after.prefixDigests![1], "a count's digestAt agrees with its own digests");
});

t.test('prefix[k] never exceeds the tokens the next turn really shares', async (t) => {
  const { double, counter } = await setup(t);
  const turn1 = [SYSTEM, USER];
  const reply: ChatMessage = { role: 'assistant', content: 'Paris.' };
  const turn2 = [...turn1, reply, { role: 'user', content: 'And what river flows through it?' }];
  const c1 = await counter.countChat({ model: 'tiny', messages: turn1 });
  const c2 = await counter.countChat({ model: 'tiny', messages: turn2 });
  t.equal(c1.prefix.length, 3);
  t.equal(c2.prefix.length, 5);
  // 1. monotone, 2. below the whole prompt, 3. the two turns agree on the messages they share.
  for (let k = 1; k < c2.prefix.length; k++) t.ok(c2.prefix[k] >= c2.prefix[k - 1]);
  t.ok(c2.prefix[4] < c2.tokens);
  t.equal(c1.prefix[2], c2.prefix[2]);
  // 4. the shared prefix is at most the token LCP of the two rendered prompts.
  const p1 = double.tokenize('<|im_start|>system\nYou are a terse assistant. Answer in one short sentence.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n');
  t.equal(p1.length, 34);
  t.ok(c2.prefix[2] <= 34);
  // A shared message counts whole, its closing "<|im_end|>\n" too (SPEC §4, §11): the system
  // message ends at token 18, the user message at 30; only the reply priming
  // "<|im_start|>assistant\n" (tokens 30–33) is left out.
  t.equal(c1.prefix[1], 18);
  t.equal(c1.prefix[2], 30);
  t.same(p1.slice(16, 18), [50258, 198], 'tokens 16 and 17: <|im_end|> and the line end');
  t.equal(c2.prefix[3], c2.prefix[2] + 4 + double.tokenize('Paris.').length + 2, "the reply: its opening, its text, and its closing");
});

t.test("a message's closing mark counts with it when the template writes one, and only then", async (t) => {
  const { pastClosing } = await import('../../metering/tokenizers/prompt-boundaries.js');
  const at = (prompt: string, after: string) => prompt.indexOf(after) + after.length;
  // [template, rendered prompt, the text the message ends with, where its rendering ends]
  const cases: Array<[string, string, string, string]> = [
    ['ChatML', '<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n', 'Hi', '<|im_end|>\n'],
    ['Llama 3', '<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n', 'Hi', '<|eot_id|>'],
    ['Gemma', '<start_of_turn>user\nHi<end_of_turn>\n<start_of_turn>model\n', 'Hi', '<end_of_turn>\n'],
    ['Zephyr', '<|user|>\nHi</s>\n<|assistant|>\n', 'Hi', '</s>\n'],
    ['the last message, with no reply priming after it', '<|im_start|>user\nHi<|im_end|>\n', 'Hi', '<|im_end|>\n'],
    // No closing mark: the offset stays.
    ['plain-text roles', 'USER: Hi ASSISTANT:', 'Hi', 'Hi'],
    ["the next role's opening, followed by its text, is not a closing", '<|user|>Hi<|assistant|>Hello', 'Hi', 'Hi'],
    ['GLM-4: no mark, and the reply priming after the last message is not one', '[gMASK]<sop><|user|>\nHi<|assistant|>\n', 'Hi', 'Hi'],
    ['a tool-call name ends inside JSON', '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call><|im_end|>', 'get_weather', 'get_weather'],
  ];
  for (const [name, prompt, text, end] of cases) t.equal(pastClosing(prompt, at(prompt, text)), at(prompt, end), name);
});

t.test('tool-call history: boundaries still found, conservative where text is re-serialised', async (t) => {
  const { counter } = await setup(t);
  const messages: ChatMessage[] = [
    SYSTEM,
    USER,
    { role: 'assistant', content: '', tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'get_weather', arguments: '{"city": "Paris"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"temp_c": 18}' },
  ];
  const c = await counter.countChat({ model: 'tiny', messages, tools: TOOLS });
  for (let k = 1; k < c.prefix.length; k++) t.ok(c.prefix[k] >= c.prefix[k - 1]);
  t.ok(c.prefix[4] > c.prefix[2], 'the tool result is found after the call');
  t.ok(c.prefix[4] < c.tokens);
});

t.test('remembered prompt counts are bounded by their messages, not only by their number', async (t) => {
  const { double, counter } = await setup(t, { nCtx: 1_000_000 });
  const long = (tag: string) => Array.from({ length: 40_000 }, (_, i) => ({ role: i % 2 ? 'assistant' : 'user', content: `${tag}${i % 7}` }) as ChatMessage);
  const tokenizes = () => double.requests.filter((r) => r.path === '/tokenize').length;
  const a = long('a');
  await counter.countChat({ model: 'tiny', messages: a });
  await counter.countChat({ model: 'tiny', messages: long('b') });
  const before = tokenizes();
  await counter.countChat({ model: 'tiny', messages: a });
  t.equal(tokenizes(), before + 1, 'the first long prompt was let go: its 40,000 boundaries and the next\'s pass 65,536');
  await counter.countChat({ model: 'tiny', messages: [SYSTEM, USER] });
  const small = tokenizes();
  await counter.countChat({ model: 'tiny', messages: [SYSTEM, USER] });
  t.equal(tokenizes(), small, 'a short prompt is still remembered');
});

t.test('text rows use /tokenize with add_special', async (t) => {
  const { double, counter } = await setup(t);
  const c = await counter.countText('First prompt row.');
  t.same(c, { tokens: 4, method: 'llamacpp', upperBound: false });
  t.same(double.requests[0].body, { content: 'First prompt row.', add_special: true });
  await counter.countText('First prompt row.');
  t.equal(double.requests.length, 1, 'cached by content hash');
});

t.test('context window is the per-slot n_ctx from /props, cached and refreshable', async (t) => {
  const { double, pool } = await setup(t, { nCtx: 2048 });
  t.equal(await fetchContextWindow(pool, double.url), 2048);
  t.equal(await fetchContextWindow(pool, double.url), 2048);
  t.equal(double.requests.length, 1);
  t.equal(await fetchContextWindow(pool, double.url, { refresh: true }), 2048);
  t.equal(double.requests.length, 2);
  // An OpenAI-style base URL ending in /v1 still reaches the native endpoint.
  t.equal(await fetchContextWindow(pool, `${double.url}/v1`), 2048);
});

t.test('a server that is down surfaces as a clear LlamaCppCountError', async (t) => {
  const { double, pool } = await setup(t);
  const url = double.url;
  await double.close();
  const counter = new LlamaCppCounter({ dispatcher: pool, baseUrl: url, cache: new TokenCache() });
  const err = await counter.countChat({ model: 'tiny', messages: [USER] }).then(
    () => null,
    (e: unknown) => e,
  );
  t.type(err, LlamaCppCountError);
  t.match((err as Error).message, /llama\.cpp POST \/apply-template at http:\/\/127\.0\.0\.1:\d+ failed/);
  await t.rejects(counter.countText('hi'), LlamaCppCountError);
});

t.test('a server error status is thrown with its status', async (t) => {
  const double = await startLlamaCppDouble();
  const pool = new Pool(double.url);
  t.teardown(async () => {
    await pool.close();
    await double.close();
  });
  const counter = new LlamaCppCounter({ dispatcher: pool, baseUrl: `${double.url}/nothing-here`, cache: new TokenCache() });
  await t.rejects(counter.countText('hi'), /answered 404/);
});
