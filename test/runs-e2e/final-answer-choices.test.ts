// A final answer asked for with `n > 1` (an outside audit): a turn in which one choice answered and
// another proposed tools again came back as one choice, the excerpt, and the answer was lost; and
// when no choice answered, the excerpt came as one choice where the client asked for two.
import t, { type Test } from 'tap';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { startGateway, openaiUpstream, type TestGateway } from '../helpers/gateway.js';
import { EXCERPT_FIRST_LINE } from '../../metering/runs/evidence-excerpt.js';

type Json = Record<string, unknown>;
const ANSWER = 'Tollgate meters tokens and money.';
const call = { id: 'call_9', type: 'function', function: { name: 'search', arguments: '{"q":"again"}' } };

/**
 * An upstream whose choices answer (`a`), propose a tool again (`t`) or write nothing (`e`), as
 * `pattern` says: a whole answer, or, with `sse`, a stream of the choices' chunks.
 */
async function gateway(t: Test, pattern: string, sse = false): Promise<TestGateway> {
  const upstream = createServer((req, res) => {
    req.resume();
    req.on('end', () => {
      const usage = { prompt_tokens: 60, completion_tokens: 20, total_tokens: 80 };
      const head = { id: 'chatcmpl-1', created: 1, model: 'gpt-4o-mini' };
      if (sse) {
        const event = (choices: Json[], extra: Json = {}) => `data: ${JSON.stringify({ ...head, object: 'chat.completion.chunk', choices, ...extra })}\n\n`;
        let body = '';
        for (const [index, p] of [...pattern].entries()) {
          const delta = p === 'a' ? { role: 'assistant', content: ANSWER } : p === 't' ? { role: 'assistant', tool_calls: [{ index: 0, ...call }] } : { role: 'assistant', content: '' };
          body += event([{ index, delta, finish_reason: null }]);
        }
        for (const [index, p] of [...pattern].entries()) body += event([{ index, delta: {}, finish_reason: p === 't' ? 'tool_calls' : 'stop' }]);
        res.writeHead(200, { 'content-type': 'text/event-stream' });
        res.end(body + event([], { usage }) + 'data: [DONE]\n\n');
        return;
      }
      const choices = [...pattern].map((p, index) =>
        p === 'a'
          ? { index, message: { role: 'assistant', content: ANSWER }, finish_reason: 'stop' }
          : p === 't'
            ? { index, message: { role: 'assistant', content: null, tool_calls: [call] }, finish_reason: 'tool_calls' }
            : { index, message: { role: 'assistant', content: '' }, finish_reason: 'stop' },
      );
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(JSON.stringify({ ...head, object: 'chat.completion', choices, usage }));
    });
  });
  await new Promise<void>((r) => upstream.listen(0, '127.0.0.1', () => r()));
  t.teardown(() => new Promise<void>((r) => upstream.close(() => r())));
  return startGateway(t, { upstreams: [openaiUpstream(`http://127.0.0.1:${(upstream.address() as AddressInfo).port}`)], runs: { maxToolRounds: 1 } });
}

async function collectRows(gw: TestGateway) {
  const out = [];
  for await (const row of gw.ledger.exportRows(null, null)) out.push(row);
  return out;
}

/** The request after the run's first tool round: with maxToolRounds 1, its final answer. */
const finalTurn = (stream: boolean) => ({
  model: 'gpt-4o-mini',
  n: 2,
  stream,
  ...(stream ? { stream_options: { include_usage: true } } : {}),
  messages: [
    { role: 'user', content: 'What does Tollgate meter?' },
    { role: 'assistant', content: null, tool_calls: [{ ...call, id: 'call_1', function: { name: 'search', arguments: '{"q":"tollgate"}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: 'EVIDENCE: Tollgate meters tokens and money.' },
  ],
  tools: [{ type: 'function', function: { name: 'search', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }],
  max_tokens: 100,
});

async function post(gw: TestGateway, stream: boolean): Promise<{ res: Response; usage: Json | null; choices: Array<{ index: number; text: string; finish: string | null; toolCalls: boolean }> }> {
  let usage: Json | null = null;
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(finalTurn(stream)) });
  const byIndex = new Map<number, { index: number; text: string; finish: string | null; toolCalls: boolean }>();
  const at = (index: number) => byIndex.get(index) ?? byIndex.set(index, { index, text: '', finish: null, toolCalls: false }).get(index)!;
  if (!stream) {
    for (const c of ((await res.json()) as { choices: Array<{ index: number; message: Json; finish_reason: string }> }).choices) {
      Object.assign(at(c.index), { text: String(c.message.content ?? ''), finish: c.finish_reason, toolCalls: 'tool_calls' in c.message });
    }
  } else {
    for (const event of (await res.text()).split('\n\n')) {
      if (!event.startsWith('data: {')) continue;
      const parsed = JSON.parse(event.slice(6)) as { usage?: Json | null; choices: Array<{ index: number; delta: Json; finish_reason: string | null }> };
      if (parsed.usage) usage = parsed.usage;
      for (const c of parsed.choices) {
        const choice = at(c.index);
        if (typeof c.delta.content === 'string') choice.text += c.delta.content;
        if ('tool_calls' in c.delta) choice.toolCalls = true;
        if (c.finish_reason) choice.finish = c.finish_reason;
      }
    }
  }
  return { res, usage, choices: [...byIndex.values()].sort((a, b) => a.index - b.index) };
}

t.test('n = 2, one choice answers and one proposes tools: the answer is kept, the excerpt stands in for the other', async (t) => {
  const gw = await gateway(t, 'at');
  const { res, choices } = await post(gw, false);
  t.equal(res.status, 200);
  t.equal(res.headers.get('x-tollgate-notice'), 'finishing-the-answer; reason=rounds');
  t.equal(res.headers.get('x-tollgate-fallback'), 'evidence-excerpt', 'the excerpt answered one of them');
  t.equal(choices.length, 2);
  t.equal(choices[0]!.text, ANSWER, "the model's answer");
  t.match(choices[0], { finish: 'stop', toolCalls: false });
  t.equal(choices[1]!.text.split('\n')[0], EXCERPT_FIRST_LINE, 'the excerpt for the choice that proposed tools');
  t.match(choices[1], { finish: 'stop', toolCalls: false });
  for await (const row of gw.ledger.exportRows(null, null)) t.equal(row.fallback, true, 'the row says the excerpt answered');
});

for (const stream of [false, true]) {
  t.test(`n = 2, no choice answers: the excerpt in each of the two choices (${stream ? 'streamed' : 'not streamed'})`, async (t) => {
    const gw = await gateway(t, 'tt');
    const { res, usage, choices } = await post(gw, stream);
    t.equal(res.status, 200);
    t.equal(res.headers.get('x-tollgate-fallback'), 'evidence-excerpt');
    t.same(choices.map((c) => c.index), [0, 1], 'two choices, as asked');
    if (stream) {
      // The model read the prompt and wrote tool calls, and was charged for them: the usage says so.
      const [row] = await collectRows(gw);
      t.equal(usage?.completion_tokens, row!.generated_tokens, `the usage chunk has what was charged (${row!.generated_tokens} written)`);
      t.ok((row!.generated_tokens ?? 0) > 0);
    }
    for (const c of choices) {
      t.equal(c.text.split('\n')[0], EXCERPT_FIRST_LINE);
      t.match(c, { finish: 'stop', toolCalls: false });
    }
  });
}

// A review: the streamed final answer still judged its choices together — the excerpt went after
// every choice's text when one proposed tools, and a choice that wrote nothing was left empty.
for (const [pattern, what] of [['at', 'proposes tools'], ['ae', 'writes nothing']] as const) {
  t.test(`streamed, n = 2, one choice answers and one ${what}: the excerpt in that one alone`, async (t) => {
    const gw = await gateway(t, pattern, true);
    const { res, choices } = await post(gw, true);
    t.equal(res.status, 200);
    t.equal(choices.length, 2);
    t.equal(choices[0]!.text, ANSWER, "the model's answer, nothing after it");
    t.match(choices[0], { finish: 'stop', toolCalls: false });
    t.equal(choices[1]!.text.trim().split('\n')[0], EXCERPT_FIRST_LINE, 'the excerpt in the other');
    t.match(choices[1], { finish: 'stop', toolCalls: false });
  });
}
