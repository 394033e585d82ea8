import t from 'tap';
import { StreamToolCallFilter, stripToolCallsFromCompletion } from '../../metering/runs/strip-tool-calls.js';
import { stripMarkup } from '../../metering/runs/tool-call-markup.js';

type Json = Record<string, unknown>;

function completion(message: Json, finish = 'stop'): Json {
  return { id: 'x', object: 'chat.completion', model: 'm', choices: [{ index: 0, message: { role: 'assistant', ...message }, finish_reason: finish }] };
}
const firstMessage = (body: unknown) => ((body as { choices: Array<{ message: Json }> }).choices[0]!.message);
const firstFinish = (body: unknown) => ((body as { choices: Array<{ finish_reason: string }> }).choices[0]!.finish_reason);

t.test('structured tool calls are removed and the finish reason becomes stop', async (t) => {
  const input = completion(
    { content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'search', arguments: '{}' } }] },
    'tool_calls',
  );
  const r = stripToolCallsFromCompletion(input);
  t.notOk('tool_calls' in firstMessage(r.body));
  t.equal(firstFinish(r.body), 'stop');
  t.same({ stripped: r.stripped, toolsProposed: r.toolsProposed, empty: r.empty }, { stripped: true, toolsProposed: true, empty: true });
  t.ok('tool_calls' in firstMessage(input), 'the input is not mutated');
});

t.test('markup in the text is removed; the answer around it stays', async (t) => {
  const r = stripToolCallsFromCompletion(
    completion({ content: 'Canberra is the capital [1].\n\n<tool_call>\n{"name":"search","arguments":{}}\n</tool_call>' }),
  );
  t.equal(firstMessage(r.body).content, 'Canberra is the capital [1].');
  t.equal(r.empty, false);
  t.equal(r.toolsProposed, true);
});

t.test('every markup form, closed or not', async (t) => {
  const cases: Array<[string, string]> = [
    ['a<tool_call>{"name":"f"}</tool_call>b', 'ab'],
    ['answer <tool_call>{"name":"f", "argu', 'answer '],
    ['x<|tool_call|>[{"name":"f"}]<|/tool_call|>y', 'xy'],
    ['x<|tool_call|>[{"name":"f"}]', 'x'],
    ['x [TOOL_CALLS][{"name":"f","arguments":{}}]', 'x '],
    ['x<|python_tag|>search.call(q="a")', 'x'],
    ['x<function=search>{"q":"a"}</function>y', 'xy'],
    ['x<|tool_calls_section_begin|>…<|tool_calls_section_end|>y', 'xy'],
    ['x<｜tool▁calls▁begin｜>…<｜tool▁calls▁end｜>y', 'xy'],
    ['x<|python_start|>search(q="a")<|python_end|>y', 'xy'],
    ['x<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"q":"a"}<|call|>y', 'xy'],
    ['x<|start|>assistant<|channel|>commentary to=functions.search <|constrain|>json<|message|>{"q":"a"}<|call|>y', 'xy'],
    ['x<|start|>assistant to=functions.search<|channel|>commentary json<|message|>{"q":"a"}<|call|>y', 'xy'],
    ['x<|channel|>analysis to=browser.search<|message|>{"q":"a"}<|call|>y', 'xy'],
    ['1 < 2 and <b>bold</b> stay', '1 < 2 and <b>bold</b> stay'],
    ['```json\n{"name":"search"}\n```', '```json\n{"name":"search"}\n```'],
  ];
  for (const [input, expected] of cases) t.equal(stripMarkup(input).text, expected, input);
  t.equal(stripMarkup('plain').found, false);
});

t.test('an answer of blanks and zero-width spaces is empty; a refusal is an answer', async (t) => {
  t.equal(stripToolCallsFromCompletion(completion({ content: ' \u200b\n\ufeff' })).empty, true);
  t.equal(stripToolCallsFromCompletion(completion({ content: null, refusal: 'I cannot help with that.' })).empty, false);
  const f = new StreamToolCallFilter();
  f.push(chunk({ content: '\u200b' }));
  t.equal(f.finish().visibleText, false, 'a zero-width space is not visible text');
  const g = new StreamToolCallFilter();
  g.push(chunk({ refusal: 'I cannot help with that.' }));
  t.equal(g.finish().visibleText, true, 'a refusal is');
});

// A final answer spoken in audio has no content, only audio and its transcript: it was taken for
// no answer, and replaced with the evidence excerpt.
t.test('an answer spoken in audio is an answer', async (t) => {
  const spoken = { content: null, audio: { id: 'audio_1', data: 'UklGRg==', expires_at: 1, transcript: 'Canberra.' } };
  t.equal(stripToolCallsFromCompletion(completion(spoken)).empty, false);
  t.equal(stripToolCallsFromCompletion(completion({ content: null, audio: { id: 'audio_1', data: 'UklGRg==', transcript: ' ' } })).empty, true, 'a blank transcript is not');
  const f = new StreamToolCallFilter();
  f.push(chunk({ audio: { id: 'audio_1', transcript: 'Canberra.' } }));
  t.equal(f.finish().visibleText, true);
});

t.test('with several choices, the ones that are no answer are named', async (t) => {
  const body = { choices: [
    { index: 0, message: { role: 'assistant', content: 'Canberra.' }, finish_reason: 'stop' },
    { index: 1, message: { role: 'assistant', content: null, tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{}' } }] }, finish_reason: 'tool_calls' },
    { index: 2, message: { role: 'assistant', content: ' ' }, finish_reason: 'stop' },
    { index: 3, message: { role: 'assistant', content: 'Canberra. <tool_call>{"name":"f"}</tool_call>' }, finish_reason: 'stop' },
  ] };
  const r = stripToolCallsFromCompletion(body);
  t.same(r.failed, [1, 2, 3], 'tools proposed, no text, text then markup');
  t.equal(r.empty, false);
});

t.test('an answer that was only markup is empty', async (t) => {
  const r = stripToolCallsFromCompletion(completion({ content: '  <tool_call>{"name":"f"}</tool_call>\n' }));
  t.equal(firstMessage(r.body).content, '');
  t.equal(r.empty, true);
});

t.test('a clean answer passes untouched', async (t) => {
  const input = completion({ content: 'Canberra.' });
  const r = stripToolCallsFromCompletion(input);
  t.same(r.body, input);
  t.same({ stripped: r.stripped, toolsProposed: r.toolsProposed, empty: r.empty }, { stripped: false, toolsProposed: false, empty: false });
});

const chunk = (delta: Json, finish: string | null = null, index = 0): Json => ({
  id: 's',
  object: 'chat.completion.chunk',
  created: 1,
  model: 'm',
  choices: [{ index, delta, finish_reason: finish }],
});
const contentOf = (c: Json | null) => (c === null ? '' : ((c.choices as Array<{ delta: Json }>).map((ch) => ch.delta.content ?? '').join('')));

t.test('stream: a <tool_call> split across chunks is removed, other text streams at once', async (t) => {
  const f = new StreamToolCallFilter();
  // 1. text without any tag start is forwarded whole, immediately.
  t.equal(contentOf(f.push(chunk({ role: 'assistant', content: '' }))), '');
  t.equal(contentOf(f.push(chunk({ content: 'The answer is 42. ' }))), 'The answer is 42. ');
  // 2. a possible tag start is held back…
  t.equal(contentOf(f.push(chunk({ content: 'More <tool' }))), 'More ');
  // 3. …and once it is a tag, everything up to the closing tag is dropped, across chunks.
  t.equal(f.push(chunk({ content: '_call>{"name":"search",' })), null);
  t.equal(f.push(chunk({ content: '"arguments":{}}</tool_' })), null);
  t.equal(contentOf(f.push(chunk({ content: 'call> Done.' }))), ' Done.');
  // 4. the finish chunk still arrives.
  const last = f.push(chunk({}, 'stop'));
  t.equal((last!.choices as Array<{ finish_reason: string }>)[0]!.finish_reason, 'stop');
  const summary = f.finish();
  t.equal(summary.chunk, null);
  t.same([summary.visibleText, summary.toolsProposed, summary.stripped], [true, true, true]);
});

t.test('stream: held text that never became a tag is released', async (t) => {
  const f = new StreamToolCallFilter();
  t.equal(contentOf(f.push(chunk({ content: 'a <tool' }))), 'a ');
  t.equal(contentOf(f.push(chunk({ content: 's> list' }))), '<tools> list', 'not a tool-call tag');
  t.equal(contentOf(f.push(chunk({ content: 'x <' }))), 'x ');
  t.equal(contentOf(f.push(chunk({}, 'stop'))), '<', 'released with the finish chunk');
  t.same([f.finish().toolsProposed], [false]);

  // A stream that ends without a finish chunk: finish() hands back what was held.
  const g = new StreamToolCallFilter();
  g.push(chunk({ content: 'end [TOOL' }));
  const summary = g.finish();
  t.equal(contentOf(summary.chunk), '[TOOL');
  t.equal(summary.chunk!.id, 's', 'built on the stream’s own id');
});

t.test('stream: structured tool-call deltas are dropped and the finish reason rewritten', async (t) => {
  const f = new StreamToolCallFilter();
  const first = f.push(chunk({ role: 'assistant', content: null, tool_calls: [{ index: 0, id: 'c', function: { name: 'search', arguments: '' } }] }));
  t.same((first!.choices as Array<{ delta: Json }>)[0]!.delta, { role: 'assistant', content: null }, 'role kept, call dropped');
  t.equal(f.push(chunk({ tool_calls: [{ index: 0, function: { arguments: '{"q":1}' } }] })), null, 'a call-only chunk is dropped');
  const end = f.push({ ...chunk({}, 'tool_calls'), usage: null });
  t.equal((end!.choices as Array<{ finish_reason: string }>)[0]!.finish_reason, 'stop');
  const usage = { id: 's', object: 'chat.completion.chunk', model: 'm', choices: [], usage: { prompt_tokens: 5, completion_tokens: 9 } };
  t.same(f.push(usage), usage, 'the usage chunk is forwarded');
  const summary = f.finish();
  t.same([summary.visibleText, summary.toolsProposed], [false, true], 'no answer: the caller falls back');
});

t.test('stream: an unterminated call at the end is dropped', async (t) => {
  const f = new StreamToolCallFilter();
  t.equal(contentOf(f.push(chunk({ content: 'Partial answer. [TOOL_CALLS][{"na' }))), 'Partial answer. ');
  t.equal(f.push(chunk({ content: 'me":"f"}]' })), null);
  t.equal(contentOf(f.push(chunk({}, 'stop'))), '');
  const summary = f.finish();
  t.same([summary.visibleText, summary.toolsProposed, summary.chunk], [true, true, null]);
});

t.test('stream: choices are filtered independently', async (t) => {
  const f = new StreamToolCallFilter();
  const both = { ...chunk({ content: 'one <tool_call>' }, null, 0), choices: [
    { index: 0, delta: { content: 'one <tool_call>' }, finish_reason: null },
    { index: 1, delta: { content: 'two' }, finish_reason: null },
  ] };
  const out = f.push(both);
  t.same((out!.choices as Array<{ index: number; delta: Json }>).map((c) => [c.index, c.delta.content]), [[0, 'one '], [1, 'two']]);
  const next = f.push({ ...both, choices: [
    { index: 0, delta: { content: '</tool_call> after' }, finish_reason: null },
    { index: 1, delta: { content: ' more' }, finish_reason: null },
  ] });
  t.same((next!.choices as Array<{ delta: Json }>).map((c) => c.delta.content), [' after', ' more']);
});
