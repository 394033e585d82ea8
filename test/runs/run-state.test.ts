import t from 'tap';
import type { ChatMessage, ToolCall } from '../../metering/types.js';
import { chainHashes, inspectRun, runKey } from '../../metering/runs/run-state.js';

const user = (content: string): ChatMessage => ({ role: 'user', content });
const call = (id: string, name: string, args: string) => ({ id, type: 'function', function: { name, arguments: args } });
const assistantCalls = (...calls: ToolCall[]): ChatMessage => ({ role: 'assistant', content: null, tool_calls: calls });
const result = (id: string, content: string): ChatMessage => ({ role: 'tool', tool_call_id: id, content });

/** One round: the model asks `name(args)`, the tool answers `answer`. Ids differ per round. */
function round(n: number, name: string, args: string, answer: string): ChatMessage[] {
  return [assistantCalls(call(`call_${n}`, name, args)), result(`call_${n}`, answer)];
}

t.test('the run is what follows the last user message', async (t) => {
  const messages = [
    { role: 'system', content: 'be brief' },
    user('first question'),
    ...round(1, 'search', '{"q":"a"}', 'A'),
    { role: 'assistant', content: 'answer one' },
    user('second question'),
    ...round(2, 'search', '{"q":"b"}', 'B'),
  ];
  const run = inspectRun(messages, []);
  t.equal(run.lastUserIndex, 5);
  t.equal(run.toolRounds, 1, 'the first question’s round is not part of this run');
  t.equal(run.batches[0]!.assistantIndex, 6);
  t.equal(run.batches[0]!.calls[0]!.resultIndex, 7);
});

t.test('no user message: the whole list is the run', async (t) => {
  const run = inspectRun([{ role: 'system', content: 's' }, ...round(1, 'f', '{}', 'x')], []);
  t.equal(run.lastUserIndex, -1);
  t.equal(run.toolRounds, 1);
});

t.test('patience streak', async (t) => {
  await t.test('same calls and results with different ids count', async (t) => {
    const messages = [user('q'), ...round(1, 'read', '{"path":"a","n":1}', 'same'), ...round(2, 'read', '{"n":1, "path":"a"}', 'same'), ...round(3, 'read', '{"path":"a","n":1}', 'same')];
    const run = inspectRun(messages, []);
    t.equal(run.toolRounds, 3);
    t.equal(run.identicalStreak, 3, 'arguments compared as canonical JSON, ids ignored');
  });

  await t.test('different results reset the streak to 1', async (t) => {
    const messages = [user('q'), ...round(1, 'read', '{}', 'v1'), ...round(2, 'read', '{}', 'v1'), ...round(3, 'read', '{}', 'v2')];
    t.equal(inspectRun(messages, []).identicalStreak, 1);
  });

  await t.test('different calls reset the streak to 1', async (t) => {
    const messages = [user('q'), ...round(1, 'read', '{"p":1}', 'v'), ...round(2, 'read', '{"p":2}', 'v')];
    t.equal(inspectRun(messages, []).identicalStreak, 1);
  });

  await t.test('unparseable arguments compare as raw strings', async (t) => {
    const same = [user('q'), ...round(1, 'f', '{bad', 'v'), ...round(2, 'f', '{bad', 'v')];
    t.equal(inspectRun(same, []).identicalStreak, 2);
    const differ = [user('q'), ...round(1, 'f', '{bad', 'v'), ...round(2, 'f', '{bad ', 'v')];
    t.equal(inspectRun(differ, []).identicalStreak, 1);
  });

  await t.test('a write tool never counts and resets', async (t) => {
    const writes = [user('q'), ...round(1, 'save', '{}', 'ok'), ...round(2, 'save', '{}', 'ok'), ...round(3, 'save', '{}', 'ok')];
    const run = inspectRun(writes, ['save']);
    t.equal(run.identicalStreak, 0);
    t.equal(run.lastBatchHasWrite, true);
    t.equal(run.toolRounds, 3, 'writes still count as rounds');

    // 1. two identical reads, 2. a write, 3. the same read again: the streak starts over.
    const mixed = [user('q'), ...round(1, 'read', '{}', 'v'), ...round(2, 'read', '{}', 'v'), ...round(3, 'save', '{}', 'ok'), ...round(4, 'read', '{}', 'v')];
    const after = inspectRun(mixed, ['save']);
    t.equal(after.identicalStreak, 1);
    t.equal(after.lastBatchHasWrite, false);

    // A batch mixing a read and a write is a write batch.
    const both = [user('q'), assistantCalls(call('a', 'read', '{}'), call('b', 'save', '{}')), result('a', 'v'), result('b', 'ok')];
    t.equal(inspectRun(both, ['save']).batches[0]!.hasWrite, true);
  });

  await t.test('parallel calls answered in another order are the same batch', async (t) => {
    const messages = [
      user('q'),
      assistantCalls(call('a1', 'read', '{"p":1}'), call('a2', 'read', '{"p":2}')),
      result('a1', 'one'),
      result('a2', 'two'),
      assistantCalls(call('b1', 'read', '{"p":2}'), call('b2', 'read', '{"p":1}')),
      result('b2', 'one'),
      result('b1', 'two'),
    ];
    const run = inspectRun(messages, []);
    t.equal(run.identicalStreak, 2);
    t.same(run.batches[1]!.calls.map((c) => c.resultIndex), [6, 5], 'results matched by id, in call order');
  });
});

t.test('results are matched inside their round, by id, then by position', async (t) => {
  // The model reuses `call_0` every round; each round's answer must stay with its round.
  const messages = [
    user('q'),
    assistantCalls(call('call_0', 'read', '{}')),
    result('call_0', 'first'),
    assistantCalls(call('call_0', 'read', '{}')),
    result('call_0', 'second'),
    assistantCalls({ function: { name: 'read', arguments: '{}' } }),
    { role: 'tool', content: 'third, no id' },
  ];
  const run = inspectRun(messages, []);
  t.same(run.batches.map((b) => b.calls[0]!.resultIndex), [2, 4, 6]);
  t.equal(run.identicalStreak, 1, 'different results');
});

t.test('a round whose results have not arrived has null results', async (t) => {
  const run = inspectRun([user('q'), assistantCalls(call('x', 'read', '{}'))], []);
  t.equal(run.batches[0]!.calls[0]!.resultIndex, null);
  t.equal(run.toolRounds, 1);
});

t.test('chainHashes', async (t) => {
  const a = [{ role: 'system', content: 's' }, user('q'), { role: 'assistant', content: 'x' }];
  const h = chainHashes(a);
  t.equal(h.length, 3);
  t.equal(new Set(h).size, 3);
  t.match(h[0], /^[A-Za-z0-9_-]{22}$/, '128 bits of SHA-256, base64url');

  const longer = chainHashes([...a, user('more')]);
  t.same(longer.slice(0, 3), h, 'a growing list keeps its prefix hashes');

  const reordered = chainHashes([{ content: 's', role: 'system' }, user('q'), { content: 'x', role: 'assistant', tool_calls: undefined }]);
  t.same(reordered, h, 'key order and absent fields do not matter');
  t.same(chainHashes([a[0]!, a[1]!, { role: 'assistant', content: 'x', refusal: null }]), h, 'null equals absent');

  const edited = chainHashes([{ role: 'system', content: 'S' }, user('q'), a[2]!]);
  t.not(edited[2], h[2], 'a change early changes every later hash');
});

t.test('runKey is stable within a run and changes with the next question', async (t) => {
  const start = [{ role: 'system', content: 's' }, user('q1')];
  const turn2 = [...start, ...round(1, 'read', '{}', 'v')];
  const turn3 = [...turn2, ...round(2, 'read', '{}', 'w')];
  t.equal(runKey(turn2), runKey(start));
  t.equal(runKey(turn3), runKey(start));
  const next = [...turn3, { role: 'assistant', content: 'answer' }, user('q2')];
  t.not(runKey(next), runKey(start));

  // A system prompt rewritten every turn (a clock line) keeps the run: only the question marks it.
  const clocked = [{ role: 'system', content: 's — the time is 12:03' }, ...turn3.slice(1)];
  t.equal(runKey(clocked), runKey(start), 'a changed system prompt is the same run');
  // The same words asked again are the next question all the same.
  const goOn = [...next, { role: 'assistant', content: 'more?' }, user('go on')];
  const goOnAgain = [...goOn, { role: 'assistant', content: 'more?' }, user('go on')];
  t.not(runKey(goOnAgain), runKey(goOn), 'a repeated "go on" is a new run');
  t.equal(runKey([user('a'), { role: 'assistant', content: 'x' }, user('b')]), runKey([user('b')]), 'earlier, other questions are not in the key');
  // History compacted during the research (earlier turns replaced by a summary) keeps the run.
  const long = [{ role: 'system', content: 's' }, user('q0'), { role: 'assistant', content: 'a0' }, user('q1'), ...round(1, 'read', '{}', 'v')];
  const compacted = [{ role: 'system', content: 's. Summary: q0 was answered with a0.' }, user('q1'), ...round(1, 'read', '{}', 'v'), ...round(2, 'read', '{}', 'w')];
  t.equal(runKey(compacted), runKey(long), 'a compacted history is the same run');
  // The second "go on" stays the second while earlier, other turns are compacted away.
  const compactedGoOn = [{ role: 'system', content: 'summary' }, user('go on'), { role: 'assistant', content: 'more?' }, user('go on')];
  t.equal(runKey(compactedGoOn), runKey(goOnAgain));

  const noUser = [{ role: 'system', content: 's' }, ...round(1, 'read', '{}', 'v')];
  t.equal(runKey(noUser), runKey([...noUser, ...round(2, 'read', '{}', 'w')]), 'anchored on the leading system prompt');
  t.match(runKey([]), /^[0-9a-f]{64}$/);
});

t.test('legacy function calls are rounds, answered by the next "function" message', async (t) => {
  const legacy = (n: number, answer: string): ChatMessage[] => [
    { role: 'assistant', content: null, function_call: { name: 'search', arguments: `{"q":"x"}` } },
    { role: 'function', name: 'search', content: answer },
  ];
  const run = inspectRun([user('go'), ...legacy(1, 'same'), ...legacy(2, 'same'), ...legacy(3, 'same')], []);
  t.equal(run.toolRounds, 3);
  t.equal(run.identicalStreak, 3, 'identical reads count toward patience');
  t.equal(run.batches[0]!.calls[0]!.resultIndex, 2);
  t.same(run.batches[0]!.calls.map((c) => [c.name, c.arguments]), [['search', '{"q":"x"}']]);
  t.equal(inspectRun([user('go'), { role: 'assistant', content: 'plain', function_call: null }], []).toolRounds, 0, 'a null function_call is no call');
});

t.test('calls written as markup and answered by tool messages are rounds, repeated ones count toward patience', async (t) => {
  const hermes = (n: number, name: string, answer: string): ChatMessage[] => [
    { role: 'assistant', content: `Let me look.\n<tool_call>\n{"name": "${name}", "arguments": {"q": "x"}}\n</tool_call>` },
    { role: 'tool', tool_call_id: `m${n}`, content: answer },
  ];
  const run = inspectRun([user('go'), ...hermes(1, 'search', 'same'), ...hermes(2, 'search', 'same'), ...hermes(3, 'search', 'same')], ['save']);
  t.equal(run.toolRounds, 3);
  t.equal(run.identicalStreak, 3);
  t.same(run.batches[0]!.calls.map((c) => [c.id, c.name, c.resultIndex]), [['m1', 'search', 2]]);
  const written = inspectRun([user('go'), ...hermes(1, 'save', 'ok'), ...hermes(2, 'save', 'ok')], ['save']);
  t.equal(written.identicalStreak, 0, 'a write read from the markup does not count toward patience');
  // Markup with no tool message after it is text (a model showing an example), not a round.
  t.equal(inspectRun([user('go'), { role: 'assistant', content: '<tool_call>{"name":"search"}</tool_call>' }], []).toolRounds, 0);
  t.equal(inspectRun([user('go'), { role: 'assistant', content: 'plain text' }, { role: 'tool', tool_call_id: 'x', content: 'r' }], []).toolRounds, 0, 'a tool message after plain text makes no round');
  // The markup is the batch, not the reasoning or prose around it.
  const musing = (n: number): ChatMessage[] => [
    { role: 'assistant', content: `<think>attempt ${n}: maybe this time</think>\n<tool_call>{"name":"search","arguments":{"q":"x"}}</tool_call>` },
    { role: 'tool', tool_call_id: `t${n}`, content: 'same' },
  ];
  t.equal(inspectRun([user('go'), ...musing(1), ...musing(2), ...musing(3)], []).identicalStreak, 3, 'the same call three times, whatever was thought around it');
});

t.test('markup names its calls by dialect; a name inside the arguments is not a call', async (t) => {
  const names = (content: string, answers = 1) =>
    inspectRun([user('go'), { role: 'assistant', content }, ...Array.from({ length: answers }, (_, i) => ({ role: 'tool' as const, tool_call_id: `a${i}`, content: 'r' }))], []).batches[0]!.calls.map((c) => c.name);
  t.same(names('<tool_call>{"name":"lookup_user","arguments":{"name":"Bob"}}</tool_call>'), ['lookup_user']);
  t.same(names('<|tool_call|>[{"name":"a","arguments":{}},{"name":"b","arguments":{"name":"c"}}]<|/tool_call|>', 2), ['a', 'b']);
  t.same(names('<function=delete_user>{"id":1}</function>'), ['delete_user']);
  t.same(names('<|channel|>commentary to=functions.delete_user <|constrain|>json<|message|>{"id":1}<|call|>'), ['delete_user']);
  t.same(names('<|python_tag|>search.call(query="x")'), ['search']);
  t.same(names('[TOOL_CALLS]search[ARGS]{"q":"x"}'), ['search']);
  t.same(names('<|tool_calls_section_begin|><|tool_call_begin|>functions.search:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>'), ['search']);
  t.same(names('<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>search\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>'), ['search']);
  const written = inspectRun([user('go'), { role: 'assistant', content: '<tool_call>{"name":"lookup","arguments":{}}</tool_call><tool_call>{"name":"save","arguments":{}}</tool_call>' }, { role: 'tool', tool_call_id: 'x', content: 'r' }], ['save']);
  t.equal(written.batches[0]!.hasWrite, true, 'a write named in the markup is a write, even with fewer answers than calls');
});
