import t from 'tap';
import { get_encoding } from '@dqbd/tiktoken';
import { encodingForModel, MESSAGES_PER_TURN, TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { countBounded, MAX_PIECE } from '../../metering/tokenizers/bounded-encode.js';
import { TokenCache } from '../../metering/token-cache.js';
import type { ChatMessage, ToolDefinition } from '../../metering/types.js';
import type { CountPool } from '../../metering/tokenizers/count-pool.js';

// The OpenAI cookbook "How to count tokens with tiktoken": its six example messages and its
// get_current_weather tool example, with the counts the API itself reported.
const COOKBOOK_MESSAGES: ChatMessage[] = [
  {
    role: 'system',
    content: 'You are a helpful, pattern-following assistant that translates corporate jargon into plain English.',
  },
  { role: 'system', name: 'example_user', content: 'New synergies will help drive top-line growth.' },
  { role: 'system', name: 'example_assistant', content: 'Things working well together will increase revenue.' },
  {
    role: 'system',
    name: 'example_user',
    content: "Let's circle back when we have more bandwidth to touch base on opportunities for increased leverage.",
  },
  { role: 'system', name: 'example_assistant', content: "Let's talk later when we're less busy about how to do better." },
  { role: 'user', content: "This late pivot means we don't have time to boil the ocean for the client deliverable." },
];

const WEATHER_TOOLS: ToolDefinition[] = [
  {
    type: 'function',
    function: {
      name: 'get_current_weather',
      description: 'Get the current weather in a given location',
      parameters: {
        type: 'object',
        properties: {
          location: { type: 'string', description: 'The city and state, e.g. San Francisco, CA' },
          unit: { type: 'string', description: 'The unit of temperature to return', enum: ['celsius', 'fahrenheit'] },
        },
        required: ['location'],
      },
    },
  },
];
const WEATHER_MESSAGES: ChatMessage[] = [
  { role: 'system', content: 'You are a helpful assistant that can answer to questions about the weather.' },
  { role: 'user', content: "What's the weather like in San Francisco?" },
];

function counterFor(model: string, cache = new TokenCache()): TiktokenCounter {
  const c = TiktokenCounter.forModel(model, { cache });
  if (c === null) throw new Error(`no counter for ${model}`);
  return c;
}

t.test('encoding is chosen by model-name prefix', async (t) => {
  const cases: Array<[string, string | null]> = [
    ['gpt-4o', 'o200k_base'],
    ['gpt-4o-mini-2024-07-18', 'o200k_base'],
    ['chatgpt-4o-latest', 'o200k_base'],
    ['gpt-4.1-nano', 'o200k_base'],
    ['gpt-4.5-preview', 'o200k_base'],
    ['gpt-5-mini', 'o200k_base'],
    ['o1-preview', 'o200k_base'],
    ['o3-mini', 'o200k_base'],
    ['o4-mini-2025-04-16', 'o200k_base'],
    ['gpt-oss-120b', 'o200k_base'],
    ['openai/gpt-4o', 'o200k_base'],
    ['gpt-4-0613', 'cl100k_base'],
    ['gpt-4-turbo', 'cl100k_base'],
    ['gpt-3.5-turbo-0125', 'cl100k_base'],
    ['text-embedding-3-small', 'cl100k_base'],
    ['text-embedding-ada-002', 'cl100k_base'],
    ['llama-3.1-8b', null],
    ['claude-3-5-sonnet', null],
    ['tiny', null],
  ];
  for (const [model, enc] of cases) t.equal(encodingForModel(model), enc, model);
});

t.test('cookbook example messages: 129 on gpt-4/3.5, 124 on gpt-4o', async (t) => {
  for (const [model, expected] of [
    ['gpt-4-0613', 129],
    ['gpt-3.5-turbo-0125', 129],
    ['gpt-4o', 124],
    ['gpt-4o-mini', 124],
  ] as const) {
    const c = await counterFor(model).countChat({ model, messages: COOKBOOK_MESSAGES });
    t.equal(c.tokens, expected, model);
    t.equal(c.upperBound, false);
    t.match(c.method, /^tiktoken:(o200k|cl100k)_base$/);
  }
});

t.test('cookbook tool example: 105 on gpt-4/3.5, 101 on gpt-4o family', async (t) => {
  for (const [model, expected] of [
    ['gpt-4', 105],
    ['gpt-3.5-turbo', 105],
    ['gpt-4o', 101],
    ['gpt-4o-mini', 101],
  ] as const) {
    const c = await counterFor(model).countChat({ model, messages: WEATHER_MESSAGES, tools: WEATHER_TOOLS });
    t.equal(c.tokens, expected, model);
  }
});

t.test('enum items that are not strings are counted as the JSON the client wrote, never a throw', async (t) => {
  const model = 'gpt-4o';
  const tools = (items: unknown[]): ToolDefinition[] => [
    { type: 'function', function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'string', enum: items } } } } },
  ];
  const counter = counterFor(model);
  const odd = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tools([{ toString: 1 }, 7, null]) });
  const written = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tools(['{"toString":1}', '7', 'null']) });
  t.equal(odd.tokens, written.tokens);
  t.equal(odd.method, 'tiktoken:o200k_base');
});

t.test('nested parameters count like top-level ones: an object\'s properties and an array\'s items (regression: only the top level)', async (t) => {
  const model = 'gpt-4o';
  const counter = counterFor(model);
  const enc = get_encoding('o200k_base');
  t.teardown(() => enc.free());
  const tokens = (text: string) => enc.encode_ordinary(text).length;
  const fields: Record<string, unknown> = {};
  for (let i = 0; i < 15; i++) fields[`field_${i}`] = { type: 'string', description: `The customer's answer to question ${i} of the intake form.` };
  const tool = (parameters: Record<string, unknown>): ToolDefinition[] => [{ type: 'function', function: { name: 'save', description: 'Save the form', parameters } }];
  const flat = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tool({ type: 'object', properties: { form: { type: 'object', description: 'The form' } } }) });
  const nested = await counter.countChat({
    model,
    messages: WEATHER_MESSAGES,
    tools: tool({ type: 'object', properties: { form: { type: 'object', description: 'The form', properties: fields } } }),
  });
  // Each nested property: the cookbook's 3 for a key, and its key:type:description; 3 to open them.
  let expected = 3;
  for (const [key, f] of Object.entries(fields)) expected += 3 + tokens(`${key}:string:${(f as { description: string }).description.replace(/\.$/, '')}`);
  t.equal(nested.tokens - flat.tokens, expected);
  const list = await counter.countChat({
    model,
    messages: WEATHER_MESSAGES,
    tools: tool({ type: 'object', properties: { form: { type: 'object', description: 'The form' }, rows: { type: 'array', items: { type: 'object', properties: fields } } } }),
  });
  const listFlat = await counter.countChat({
    model,
    messages: WEATHER_MESSAGES,
    tools: tool({ type: 'object', properties: { form: { type: 'object', description: 'The form' }, rows: { type: 'array' } } }),
  });
  t.equal(list.tokens - listFlat.tokens, expected, "an array's items' properties too");
  const items = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tool({ type: 'object', properties: { unit: { type: 'array', items: { enum: ['celsius', 'fahrenheit'] } } } }) });
  const noItems = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tool({ type: 'object', properties: { unit: { type: 'array' } } }) });
  t.equal(items.tokens - noItems.tokens, -3 + 2 * 3 + tokens('celsius') + tokens('fahrenheit'), "an array's enum items, as the cookbook counts an enum");
  let deep: Record<string, unknown> = { type: 'string' };
  // As deep as a body may nest (server/body.ts MAX_JSON_DEPTH): counted to a bounded depth.
  for (let i = 0; i < 60; i++) deep = { type: 'object', properties: { x: deep } };
  const bounded = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: tool(deep) });
  t.ok(bounded.tokens > flat.tokens && bounded.tokens < flat.tokens + 32 * 10, 'a schema nested 60 deep is counted 32 levels in');
});

t.test('prefix[k] = tools + first k messages, tokens = prefix[n] + 3', async (t) => {
  const model = 'gpt-4o';
  const counter = counterFor(model);
  const withTools = await counter.countChat({ model, messages: WEATHER_MESSAGES, tools: WEATHER_TOOLS });
  const noTools = await counter.countChat({ model, messages: WEATHER_MESSAGES });
  const toolsShare = withTools.prefix[0];
  t.ok(toolsShare > 0);
  t.equal(noTools.prefix[0], 0);
  t.equal(withTools.prefix.length, WEATHER_MESSAGES.length + 1);
  t.same(
    withTools.prefix.map((p) => p - toolsShare),
    noTools.prefix,
  );
  t.equal(withTools.tokens, withTools.prefix[2] + 3);
  // Each message's share: 3 + role + content, as the cookbook counts it.
  const enc = get_encoding('o200k_base');
  t.teardown(() => enc.free());
  const first = 3 + enc.encode('system').length + enc.encode(WEATHER_MESSAGES[0].content as string).length;
  t.equal(noTools.prefix[1], first);
});

t.test('per-message cache: turn N tokenizes only the messages it added', async (t) => {
  const cache = new TokenCache();
  const model = 'gpt-4o';
  const counter = counterFor(model, cache);
  const turn1: ChatMessage[] = [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'Name a prime.' },
  ];
  await counter.countChat({ model, messages: turn1 });
  t.equal(cache.stats().misses, 2);
  t.equal(cache.stats().hits, 0);
  const turn2 = [...turn1, { role: 'assistant', content: 'Seven.' }, { role: 'user', content: 'Another.' }];
  const c2 = await counter.countChat({ model, messages: turn2 });
  // 1. the two old messages are hits, 2. only the two new ones are counted.
  t.equal(cache.stats().hits, 2);
  t.equal(cache.stats().misses, 4);
  // Key order does not matter: the same message is the same entry.
  await counter.countChat({ model, messages: [{ content: 'Be brief.', role: 'system' }] });
  t.equal(cache.stats().hits, 3);
  // And cached counts equal fresh ones.
  const fresh = await counterFor(model).countChat({ model, messages: turn2 });
  t.same(c2, fresh);
});

// Regression (audit: 200,000 `{"role":"user","content":""}` messages froze the process): a message
// repeated within one request is looked up, counted and cached once, not once per copy.
t.test('a message repeated within a request is looked up and cached once per distinct message', async (t) => {
  const model = 'gpt-4o';
  const empty = (): ChatMessage => ({ role: 'user', content: '' });
  const messages: ChatMessage[] = [
    { role: 'system', content: 'Be brief.' },
    ...Array.from({ length: 5000 }, empty),
    { content: '', role: 'user' }, // the same message under canonical rules: key order does not matter
    { role: 'user', content: 'Name a prime.' },
    ...Array.from({ length: 5000 }, empty),
  ];
  for (const sync of [false, true]) {
    const cache = new TokenCache();
    const counter = counterFor(model, cache);
    const c = sync ? counter.countChatSync({ model, messages }) : await counter.countChat({ model, messages });
    // 1. Three distinct messages: three look-ups (all misses), three entries.
    t.same({ misses: cache.stats().misses, hits: cache.stats().hits, entries: cache.stats().entries }, { misses: 3, hits: 0, entries: 3 }, `sync=${sync}`);
    // 2. The count and every step of the prefix are what each message costs on its own.
    const reference = counterFor(model);
    let sum = 0;
    const steps = messages.map((m) => (sum += reference.countChatSync({ model, messages: [m] }).tokens - 3));
    t.same(c.prefix, [0, ...steps], 'prefix steps');
    t.equal(c.tokens, sum + 3);
  }
});

// Regression (audit: one request of 200,000 messages held the event loop for seconds): a long
// message list is counted over many event-loop turns, so other requests are served in between.
// Asserted by counting turns (a self-rearming setImmediate), not by timing.
t.test('a long message list is counted over many event-loop turns; a short one in one', async (t) => {
  const model = 'gpt-4o';
  const turnsDuring = async (messages: ChatMessage[]) => {
    let turns = 0;
    let counting = true;
    const tick = () => {
      if (!counting) return;
      turns++;
      setImmediate(tick);
    };
    setImmediate(tick);
    const counted = await counterFor(model).countChat({ model, messages });
    counting = false;
    return { turns, counted };
  };
  // 1. 20 × MESSAGES_PER_TURN distinct messages: other work runs at least once per 256 looked up.
  const many = Array.from({ length: 20 * MESSAGES_PER_TURN }, (_, i): ChatMessage => ({ role: 'user', content: `question ${i}` }));
  const long = await turnsDuring(many);
  t.ok(long.turns >= 19, `other work ran while counting (${long.turns} turns)`);
  t.same(long.counted, counterFor(model).countChatSync({ model, messages: many }), 'the same count as in one turn');
  // 2. A conversation's turn never waits for the event loop.
  const short = await turnsDuring(many.slice(0, MESSAGES_PER_TURN));
  t.equal(short.turns, 0, 'a list of up to MESSAGES_PER_TURN messages is counted without yielding');
});

// Regression (the audit's 50,000 assistant/tool pairs with distinct ids sent ~250,000 texts to the
// worker, nearly all the same five): distinct messages that share short texts (a role, a tool's
// name, the same result) have each such text counted once per request.
t.test('a short text shared by many messages is counted once; the sums are unchanged', async (t) => {
  const model = 'gpt-4o';
  const messages: ChatMessage[] = [{ role: 'user', content: 'go' }];
  for (let i = 0; i < 1000; i++) {
    messages.push({ role: 'assistant', content: null, tool_calls: [{ id: `call_${i}`, type: 'function', function: { name: 'lookup', arguments: '{"q":"x"}' } }] });
    messages.push({ role: 'tool', tool_call_id: `call_${i}`, content: 'ok' });
  }
  const long = 'word '.repeat(300); // over 1,024 characters: such texts are not compared
  messages.push({ role: 'user', content: long }, { role: 'user', content: long, name: 'other' });
  // A pool that records what it is asked to count (inlineBytes 0: every batch goes to it).
  const batches: string[][] = [];
  const pool = {
    count: async (encoding: 'o200k_base' | 'cl100k_base', texts: string[], budget?: number) => {
      batches.push(texts);
      return texts.map((text) => countBounded(encoding, text, budget));
    },
  } as unknown as CountPool;
  const counter = TiktokenCounter.forModel(model, { cache: new TokenCache(), pool, inlineBytes: 0 })!;
  const c = await counter.countChat({ model, messages });
  t.equal(batches.length, 1);
  t.same(batches[0], ['user', 'go', 'assistant', 'lookup', '{"q":"x"}', 'tool', 'ok', long, long, 'other'], 'each short text once, in order of first use');
  t.same(c, counterFor(model).countChatSync({ model, messages }), 'the same count and prefix as counted one by one');
});

t.test('special-token text in user content is plain text, not an exception', async (t) => {
  const model = 'gpt-4o';
  const c = await counterFor(model).countText('before <|endoftext|> after');
  t.ok(c.tokens > 3);
  t.equal(c.method, 'tiktoken:o200k_base');
});

t.test('content parts, names and tool calls are counted; tool_call_id is not', async (t) => {
  const model = 'gpt-4o';
  const counter = counterFor(model);
  const plain = await counter.countChat({ model, messages: [{ role: 'user', content: 'hello there' }] });
  const parts = await counter.countChat({
    model,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'hello there' }] }],
  });
  t.equal(parts.tokens, plain.tokens);
  // An image is counted by its model's rule (image-tokens.ts, ADR 0022): a low-detail one exactly,
  // one without `detail` at the most it can cost.
  const withImage = (detail?: string) =>
    counter.countChat({
      model,
      messages: [{ role: 'user', content: [{ type: 'text', text: 'hello there' }, { type: 'image_url', image_url: { url: 'x', ...(detail ? { detail } : {}) } }] }],
    });
  t.match(await withImage('low'), { tokens: plain.tokens + 85, upperBound: false, method: 'tiktoken:o200k_base' });
  t.match(await withImage(), { tokens: plain.tokens + 1445, upperBound: true, method: 'tiktoken:o200k_base:upper-bound' });
  const a = await counter.countChat({ model, messages: [{ role: 'tool', content: '42', tool_call_id: 'call_1' }] });
  const b = await counter.countChat({ model, messages: [{ role: 'tool', content: '42', tool_call_id: 'call_999999999' }] });
  t.equal(a.tokens, b.tokens);
  const call = await counter.countChat({
    model,
    messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'get_weather', arguments: '{"city":"Paris"}' } }] }],
  });
  const noCall = await counter.countChat({ model, messages: [{ role: 'assistant', content: null }] });
  t.ok(call.tokens > noCall.tokens + 3);
});

t.test('an assistant history is read again whole: refusals, custom tool calls and legacy function calls count', async (t) => {
  const model = 'gpt-4o';
  const counter = counterFor(model);
  const enc = get_encoding('o200k_base');
  const tokens = (text: string) => enc.encode_ordinary(text).length;
  t.teardown(() => enc.free());
  const bare = (await counter.countChat({ model, messages: [{ role: 'assistant', content: null }] })).tokens;
  const refusal = "I'm sorry, but I can't help with planning that, as it would put other people at risk.";
  const refusalField = await counter.countChat({ model, messages: [{ role: 'assistant', content: null, refusal }] });
  t.equal(refusalField.tokens, bare + tokens(refusal), 'the refusal field, as text');
  const refusalPart = await counter.countChat({ model, messages: [{ role: 'assistant', content: [{ type: 'refusal', refusal }] }] });
  t.equal(refusalPart.tokens, bare + tokens(refusal), 'a refusal content part, as text');
  const input = 'SELECT name, total FROM orders WHERE total > 100 ORDER BY total DESC LIMIT 25';
  const custom = await counter.countChat({
    model,
    messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'custom', custom: { name: 'run_sql', input } }] }],
  });
  t.equal(custom.tokens, bare + 3 + tokens('run_sql') + tokens(input), 'a custom call: its name and input, with a call\'s framing');
  const args = '{"location":"San Francisco, CA","unit":"celsius","days":5}';
  const legacy = await counter.countChat({
    model,
    messages: [{ role: 'assistant', content: null, function_call: { name: 'get_current_weather', arguments: args } }],
  });
  t.equal(legacy.tokens, bare + 3 + tokens('get_current_weather') + tokens(args), 'a legacy function_call, like a tool call');
  const odd = await counter.countChat({
    model,
    messages: [{ role: 'assistant', content: null, function_call: { name: 7 }, tool_calls: [{ type: 'custom', custom: null }] }],
  });
  t.equal(odd.tokens, bare + 6, 'odd shapes count their framing and never throw');
});

t.test('pathological runs are split: labelled upper bound, never below the exact count', async (t) => {
  const model = 'gpt-4o';
  const counter = counterFor(model);
  // Ordinary prose, even long, is never split.
  const prose = 'The quick brown fox jumps over the lazy dog. '.repeat(2000);
  const p = await counter.countText(prose);
  t.equal(p.upperBound, false);
  t.equal(p.method, 'tiktoken:o200k_base');
  // A run without whitespace longer than one piece is split.
  const run = 'x'.repeat(5000);
  const r = await counter.countText(`intro ${run} outro`);
  t.equal(r.upperBound, true);
  t.equal(r.method, 'tiktoken:o200k_base:upper-bound');
  const enc = get_encoding('o200k_base');
  t.teardown(() => enc.free());
  t.ok(r.tokens >= enc.encode_ordinary(`intro ${run} outro`).length, 'an upper bound');
  // A split in one message makes the chat count an upper bound too.
  const chat = await counter.countChat({ model, messages: [{ role: 'user', content: run }] });
  t.equal(chat.upperBound, true);
  t.equal(chat.method, 'tiktoken:o200k_base:upper-bound');
  // Long whitespace runs are quadratic too.
  t.equal(countBounded('o200k_base', ' '.repeat(MAX_PIECE * 3)).split, true);
  // Patterns whose pieces tokenize better than the whole stay upper bounds thanks to the slack.
  for (const v of ['abc'.repeat(2000), `aqqqqqqqq${'ab'.repeat(1409)}.`, 'x=' + '0'.repeat(3000), 'ab' + '-_'.repeat(900)]) {
    t.ok(countBounded('o200k_base', v).tokens >= enc.encode_ordinary(v).length, 'upper bound (o200k)');
  }
  // A surrogate pair at a cut is kept whole.
  const emoji = '😀'.repeat(MAX_PIECE);
  t.ok(countBounded('o200k_base', emoji).tokens >= enc.encode_ordinary(emoji).length);
});

t.test('a megabyte without spaces grows linearly (pieces are bounded)', async (t) => {
  // No timing assertion: the piece bound is what keeps it linear; check the count scales linearly.
  const small = countBounded('o200k_base', 'ab'.repeat(50_000));
  const big = countBounded('o200k_base', 'ab'.repeat(500_000));
  t.equal(small.split, true);
  // Ten times the input, ten times the count (within the per-cut slack of one piece's worth).
  t.ok(Math.abs(big.tokens - small.tokens * 10) <= 40, `${big.tokens} vs 10 × ${small.tokens}`);
});

t.test('countOutput counts generated text with the same encoder', async (t) => {
  const counter = counterFor('gpt-4o');
  const text = 'Paris is the capital of France.';
  t.equal(counter.countOutput(text), (await counter.countText(text)).tokens);
  t.equal(counter.countOutput(''), 0);
});

t.test('images count at the most their model can be billed, as an upper bound (regression: 85 each)', async (t) => {
  // The audit: gpt-4o with three `detail: high` images was counted 85 tokens each, the low-detail
  // figure, while OpenAI bills ~1,105 for a 2048 × 4096 image; admission under-reserved 6.7×.
  const model = 'gpt-4o';
  const counter = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
  const image = (detail: string) => ({ type: 'image_url', image_url: { url: 'https://example.com/page.png', detail } });
  const text = await counter.countChat({ model, messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare these pages.' }] }] });
  const three = await counter.countChat({
    model,
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare these pages.' }, image('high'), image('high'), image('high')] }],
  });
  // 1. Each at base + 8 tiles, 85 + 8 × 170: above the 1,105 a large image is really billed.
  t.equal(three.tokens, text.tokens + 3 * 1445);
  t.ok(three.tokens - text.tokens >= 3 * 1105);
  t.equal(three.upperBound, true);
  t.equal(three.method, 'tiktoken:o200k_base:upper-bound');
  t.equal(three.textUpperBound, false, 'the text itself is exact: no second count can help');
  t.same(three.images, { parts: 3, tokens: 3 * 1445, least: 3 * 255 });
  t.equal(three.prefix[1], three.tokens - 3, 'the message carries its images in the running prefix');
  // 2. The same message for gpt-4o-mini, on the same counter and cache (same encoding): its own figure.
  const mini = await counter.countChat({
    model: 'gpt-4o-mini',
    messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare these pages.' }, image('high'), image('high'), image('high')] }],
  });
  t.equal(mini.tokens, text.tokens + 3 * 48_169);
  // 3. Low detail is a flat figure: exact.
  const low = await counter.countChat({ model, messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare these pages.' }, image('low')] }] });
  t.match(low, { tokens: text.tokens + 85, upperBound: false, method: 'tiktoken:o200k_base', images: { parts: 1, tokens: 85, least: 85 } });
  t.same(counter.countChatSync({ model, messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare these pages.' }, image('high'), image('high'), image('high')] }] }), three);
});
