// The stream relay's fast path (server/pipeline/sse-content-chunk.ts): the common content chunk is
// recognised from its text, and whatever it recognises must be exactly what parsing would find.

import t from 'tap';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { contentChunk } from '../../server/pipeline/sse-content-chunk.js';

type Json = Record<string, unknown>;
const fixtures = join(import.meta.dirname, '../../../shared/fixtures/llamacpp');

/** What parsing says: the text of a one-choice, index-0, content-only, unfinished chunk, or null. */
function parsedContent(data: string): string | null {
  const v = JSON.parse(data) as Json;
  if (v.usage !== undefined && v.usage !== null) return null;
  if (v.timings !== undefined) return null;
  const choices = v.choices as Json[] | undefined;
  if (!Array.isArray(choices) || choices.length !== 1) return null;
  const c = choices[0]!;
  const delta = c.delta as Json | undefined;
  if (c.index !== 0 || c.finish_reason !== null || !delta || Object.keys(delta).join() !== 'content' || typeof delta.content !== 'string') return null;
  return delta.content;
}

const openai = (content: unknown, extra: Json = {}, choice: Json = {}) =>
  JSON.stringify({ id: 'chatcmpl-1', object: 'chat.completion.chunk', created: 1, model: 'gpt-4o', system_fingerprint: 'fp', choices: [{ index: 0, delta: { content }, logprobs: null, finish_reason: null, ...choice }], ...extra });

t.test('OpenAI content chunks, with and without the usage placeholder', async (t) => {
  const plain = openai(' Hello');
  t.same(contentChunk(plain), { text: ' Hello', withoutUsage: plain, escapedElsewhere: false });
  const withNull = openai(' Hello', { usage: null });
  const c = contentChunk(withNull);
  t.equal(c?.text, ' Hello');
  t.same(JSON.parse(c!.withoutUsage), JSON.parse(plain), 'the same chunk without "usage": null');
  const noLogprobs = JSON.stringify({ id: 'x', object: 'chat.completion.chunk', created: 1, model: 'm', choices: [{ index: 0, delta: { content: 'a' }, finish_reason: null }] });
  t.equal(contentChunk(noLogprobs)?.text, 'a');
});

t.test('escaped text comes out as parsing gives it', async (t) => {
  for (const text of ['say "hi"', 'back\\slash', 'two\nlines\ttab', 'café', 'emoji 🎉 here', '</script>', '', ' ', '\u0000\u001f', '"choices":[{"index":0}]']) {
    const data = openai(text, { usage: null });
    t.equal(contentChunk(data)?.text, text, JSON.stringify(text));
    t.equal(parsedContent(data), text);
  }
  // Written with \u escapes by the server, as some do.
  t.equal(contentChunk('{"id":"x","choices":[{"index":0,"delta":{"content":"caf\\u00e9 \\ud83c\\udf89"},"finish_reason":null}]}')?.text, 'café 🎉');
});

t.test('everything else goes the full way', async (t) => {
  const others = [
    openai('a', {}, { index: 1 }),
    openai('a', {}, { finish_reason: 'stop' }),
    openai(null),
    JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { role: 'assistant', content: 'a' }, finish_reason: null }] }),
    JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { reasoning_content: 'hm' }, finish_reason: null }] }),
    JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { tool_calls: [{ index: 0, function: { arguments: '{}' } }] }, finish_reason: null }] }),
    JSON.stringify({ id: 'x', choices: [{ index: 0, delta: { content: 'a' }, finish_reason: null }, { index: 1, delta: { content: 'b' }, finish_reason: null }] }),
    JSON.stringify({ id: 'x', usage: { prompt_tokens: 1 }, choices: [{ index: 0, delta: { content: 'a' }, finish_reason: null }] }),
    JSON.stringify({ choices: [{ finish_reason: null, index: 0, delta: { content: 'a' } }], id: 'x', timings: { prompt_n: 1 } }),
    openai('a', { usage: { prompt_tokens: 1, completion_tokens: 1, total_tokens: 2 } }),
  ];
  for (const data of others) t.equal(contentChunk(data), null, data);
});

t.test('the recorded llama.cpp stream: every content chunk recognised, each as parsing reads it', async (t) => {
  const events = readFileSync(join(fixtures, 'chat-stream.response.sse'), 'utf8')
    .split('\n\n')
    .map((e) => e.replace(/^data: /, ''))
    .filter((e) => e.startsWith('{'));
  let recognised = 0;
  for (const data of events) {
    const fast = contentChunk(data);
    const parsed = parsedContent(data);
    if (fast !== null) {
      recognised++;
      t.equal(fast.text, parsed, 'the same text');
      t.equal(fast.withoutUsage, data);
    } else {
      t.equal(parsed, null, `only chunks that are not plain content go the full way: ${data.slice(0, 80)}`);
    }
  }
  t.ok(recognised >= 10, `${recognised} of ${events.length} events`);
});

t.test('text JSON does not allow is not recognised (and does not throw): parsing the event decides', async (t) => {
  // A raw tab inside a string is not JSON; the full path passes such an event on as it came.
  const rawTab = '{"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"a\tb"},"finish_reason":null}]}';
  t.equal(contentChunk(rawTab), null);
  t.equal(contentChunk('{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a\u0001"}}],"id":"x"}'), null);
  // A string that never closes, and a bad escape.
  t.equal(contentChunk('{"id":"x","choices":[{"index":0,"delta":{"content":"abc'), null);
  t.equal(contentChunk('{"id":"x","choices":[{"index":0,"delta":{"content":"a\\qb"},"finish_reason":null}]}'), null);
  // An object among the members before the choices (figures of some kind): the full way.
  t.equal(contentChunk('{"id":"x","meta":{"k":1},"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}'), null);
});

t.test('events that only look like the common chunk go the full way', async (t) => {
  const cases = [
    // A key that ends in an escaped quote: the event has no `choices`.
    '{"\\"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]}',
    // Figures written with a space, or as an array, before the choices.
    '{"id":"x","usage": {"prompt_tokens":1},"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
    '{"id":"x","usage":[1],"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}',
    // llama.cpp layout: timings with a space, a second `choices`, and an event cut short.
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"id":"x","timings": {"prompt_n":1}}',
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],"choices":[]}',
    '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"a"}}],',
  ];
  for (const data of cases) t.equal(contentChunk(data), null, data);
});

t.test("OpenAI's chunks as it sends them today: service tier, padding after the usage placeholder", async (t) => {
  // The shape of a content chunk from the API with `include_usage` (the gateway asks for it) and
  // the default stream obfuscation: random padding in an `obfuscation` member, last.
  const real = (content: string, obfuscation: string, usage = true) =>
    JSON.stringify({
      id: 'chatcmpl-Cx1',
      object: 'chat.completion.chunk',
      created: 1764353027,
      model: 'gpt-4o-2024-08-06',
      service_tier: 'default',
      system_fingerprint: 'fp_7ee0a3b6b1',
      choices: [{ index: 0, delta: { content }, logprobs: null, finish_reason: null }],
      ...(usage ? { usage: null } : {}),
      obfuscation,
    });
  for (const text of [' Hello', 'say "hi"', 'café 🎉', '']) {
    for (const pad of ['RmYFV8ad65HP9F', '', 'a"b\\c']) {
      const data = real(text, pad);
      const c = contentChunk(data);
      t.equal(c?.text, text, `${JSON.stringify(text)} padded ${JSON.stringify(pad)}`);
      t.equal(parsedContent(data), text);
      // Without the usage placeholder, as a client that did not ask for usage gets it: the padding stays.
      t.equal(c?.withoutUsage, real(text, pad, false));
    }
  }
  t.equal(contentChunk(real('a', 'x', false))?.text, 'a', 'padding without the usage placeholder');
  // Anything else after the choices still goes the full way.
  const tail = (rest: string) => `{"id":"x","choices":[{"index":0,"delta":{"content":"a"},"logprobs":null,"finish_reason":null}]${rest}}`;
  for (const rest of [',"obfuscation":"x","usage":null', ',"obfuscation":"x","extra":1', ',"obfuscation":"x', ',"obfuscation":1', ',"usage":null,"usage":null']) {
    t.equal(contentChunk(tail(rest)), null, rest);
  }
});

t.test('a JSON escape outside the delta text is said, so a key spelled that way is read before it goes out', async (t) => {
  t.equal(contentChunk(openai('caf\u00e9 \\ "q"'))?.escapedElsewhere, false, 'escapes in the text are the text\'s');
  t.equal(contentChunk(openai('hi').replace('"fp"', '"\\u0066p"'))?.escapedElsewhere, true, 'in a member before the choices');
  const padded = openai('hi', { obfuscation: 'a\\u0062c' });
  t.equal(contentChunk(padded)?.escapedElsewhere, true, 'in the padding after them');
  const llama = '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"hi"}}],"created":1,"id":"\\u0063hat","model":"m","object":"chat.completion.chunk"}';
  t.equal(contentChunk(llama)?.escapedElsewhere, true, 'in a llama.cpp chunk\'s members');
});
