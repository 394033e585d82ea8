import t from 'tap';
import type { ChatMessage } from '../../metering/types.js';
import { FINAL_ANSWER_INSTRUCTION, noticeHeader, offersTools, toFinalAnswerRequest } from '../../metering/runs/final-answer.js';

const messages: ChatMessage[] = [
  { role: 'system', content: 'You research.' },
  { role: 'user', content: 'What is the capital of Australia?' },
  { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'search', arguments: '{"q":"capital"}' } }] },
  { role: 'tool', tool_call_id: 'c1', content: 'Canberra (source: example.org)' },
];

const body = {
  model: 'gpt-4o',
  messages,
  tools: [{ type: 'function', function: { name: 'search' } }],
  tool_choice: 'auto',
  parallel_tool_calls: true,
  functions: [{ name: 'legacy' }],
  function_call: 'auto',
  temperature: 0.2,
  max_tokens: 500,
  stream: true,
};

t.test('toFinalAnswerRequest removes every tool field and keeps the rest', async (t) => {
  const final = toFinalAnswerRequest(body);
  for (const field of ['tools', 'tool_choice', 'parallel_tool_calls', 'functions', 'function_call']) {
    t.notOk(field in final, `${field} removed`);
  }
  t.equal(final.model, 'gpt-4o');
  t.equal(final.temperature, 0.2);
  t.equal(final.max_tokens, 500);
  t.equal(final.stream, true);
  t.notOk(offersTools(final));
});

t.test('the question and tool exchanges are kept; the instruction is a last system message', async (t) => {
  const final = toFinalAnswerRequest(body);
  t.equal(final.messages.length, messages.length + 1);
  t.same(final.messages.slice(0, messages.length), messages);
  const last = final.messages.at(-1)!;
  t.equal(last.role, 'system');
  t.equal(last.content, FINAL_ANSWER_INSTRUCTION);
  t.match(FINAL_ANSWER_INSTRUCTION, /answer/i);
  t.match(FINAL_ANSWER_INSTRUCTION, /sources/i);
  t.match(FINAL_ANSWER_INSTRUCTION, /uncertain/i);
  t.match(FINAL_ANSWER_INSTRUCTION, /missing/i);
  t.match(FINAL_ANSWER_INSTRUCTION, /do not call/i);
});

t.test('the client’s request is not changed', async (t) => {
  const before = structuredClone(body);
  toFinalAnswerRequest(body);
  t.same(body, before);
});

t.test('offersTools', async (t) => {
  t.equal(offersTools(body), true);
  t.equal(offersTools({ tools: [] }), false);
  t.equal(offersTools({ functions: [{ name: 'f' }] }), true);
  t.equal(offersTools({}), false);
});

t.test('noticeHeader', async (t) => {
  t.equal(noticeHeader('rounds'), 'finishing-the-answer; reason=rounds');
  t.equal(noticeHeader('tokens'), 'finishing-the-answer; reason=tokens');
});
