// A llama.cpp server's prompt cache reuses the longest run of tokens two prompts begin with, and no
// more. A template that writes a message elsewhere once more messages follow it — Mistral-7B-
// Instruct v0.3 (and Nemo) write the system message, and the tools, into the LAST user turn — makes
// turn 2 begin with the first question where turn 1 began with the system message: the server
// reuses a few tokens, whatever the messages have in common. The credit follows the tokens (ADR
// 0004): never more than the server's own `timings.cache_n`. And a request that tells the server
// not to reuse its cache (`cache_prompt: false`) is credited nothing.
import t, { type Test } from 'tap';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { toJson, type TemplateMessage } from '../doubles/llamacpp-template.js';
import { startGateway, llamaUpstream } from '../helpers/gateway.js';

type Json = Record<string, any>;

const text = (c: unknown) => (typeof c === 'string' ? c : '');

/**
 * Mistral-7B-Instruct-v0.3's chat template (its tokenizer_config.json), as llama-server renders it
 * with `--jinja`: the system message goes into the last message when that is a user turn, and the
 * tools block before the last user message.
 */
function mistralV03(messages: TemplateMessage[], tools: unknown[] | undefined): string {
  let system: string | undefined;
  let loop = messages;
  if (messages[0]?.role === 'system') {
    system = text(messages[0].content);
    loop = messages.slice(1);
  }
  const lastUser = loop.filter((m) => m.role === 'user').at(-1);
  let out = '<s>';
  loop.forEach((m, i) => {
    const last = i === loop.length - 1;
    if (m.role === 'user') {
      if (tools && tools.length > 0 && m === lastUser) out += `[AVAILABLE_TOOLS] [${tools.map((x) => toJson(x)).join(', ')}][/AVAILABLE_TOOLS]`;
      out += last && system !== undefined ? `[INST] ${system}\n\n${text(m.content)}[/INST]` : `[INST] ${text(m.content)}[/INST]`;
    } else if (m.role === 'assistant') {
      out += ` ${text(m.content).trim()}</s>`;
    } else if (m.role === 'tool') {
      out += `[TOOL_RESULTS] {"content": ${JSON.stringify(text(m.content))}}[/TOOL_RESULTS]`;
    }
  });
  return out;
}

const SYSTEM = { role: 'system', content: 'You are a careful research assistant for the Tollgate project. '.repeat(20) };
const TOOLS = [{ type: 'function', function: { name: 'search', description: 'Search the notes', parameters: { type: 'object', properties: { q: { type: 'string' } } } } }];

async function world(t: Test, template?: typeof mistralV03) {
  const llama = await startLlamaCppDouble({ completionTokens: 5, ...(template ? { template } : {}) });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [llamaUpstream(llama.url)] });
  const post = async (messages: Json[], extra: Json = {}) => {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'c1' },
      body: JSON.stringify({ model: 'm', max_tokens: 20, messages, ...extra }),
    });
    t.equal(res.status, 200);
    const body = (await res.json()) as Json;
    return {
      reply: body.choices[0].message.content as string,
      shared: Number(res.headers.get('x-tollgate-shared-prefix-tokens')),
      promptCharge: Number(res.headers.get('x-tollgate-reserved-tokens')) - 20,
      cacheN: body.timings.cache_n as number,
      promptN: body.timings.prompt_n as number,
    };
  };
  return { llama, post };
}

t.test('the recorded template (ChatML): turn 2 is credited what the server reused, as before', async (t) => {
  const { post } = await world(t);
  const m1 = [SYSTEM, { role: 'user', content: 'What is the capital of France?' }];
  const r1 = await post(m1);
  const r2 = await post([...m1, { role: 'assistant', content: r1.reply }, { role: 'user', content: 'And of Spain?' }]);
  t.ok(r2.shared > 200, `the system turn and the first exchange are shared (${r2.shared})`);
  t.ok(r2.shared - 16 <= r2.cacheN, `credited ${r2.shared - 16} ≤ cache_n ${r2.cacheN}`);
});

t.test('Mistral v0.3 moves the system message into the last user turn: turn 2 is credited no more than the server reused', async (t) => {
  const { post } = await world(t, mistralV03);
  const m1 = [SYSTEM, { role: 'user', content: 'What is the capital of France?' }];
  const r1 = await post(m1);
  const r2 = await post([...m1, { role: 'assistant', content: r1.reply }, { role: 'user', content: 'And of Spain?' }]);
  t.comment(`shared ${r2.shared}, prompt charge ${r2.promptCharge}; server cache_n ${r2.cacheN}, prompt_n ${r2.promptN}`);
  t.ok(r2.cacheN < 20, `the server reused only the first few tokens (${r2.cacheN})`);
  t.ok(Math.max(0, r2.shared - 16) <= r2.cacheN, `credited ${Math.max(0, r2.shared - 16)} ≤ cache_n ${r2.cacheN} (was 239)`);
  t.ok(r2.promptCharge >= r2.promptN, `prompt charge ${r2.promptCharge} ≥ what the server read (${r2.promptN})`);
  // Turn 3 after turn 2: the system message moved again, to the new last user turn.
  const r3 = await post([...m1, { role: 'assistant', content: r1.reply }, { role: 'user', content: 'And of Spain?' }, { role: 'assistant', content: r2.reply }, { role: 'user', content: 'And of Italy?' }]);
  t.ok(r3.promptCharge >= r3.promptN, `turn 3: prompt charge ${r3.promptCharge} ≥ ${r3.promptN} read`);
});

t.test('Mistral v0.3 with tools: the tools block moves with the last user message, and its credit with it', async (t) => {
  const { post } = await world(t, mistralV03);
  const m1 = [SYSTEM, { role: 'user', content: 'Find what the notes say of France.' }];
  const r1 = await post(m1, { tools: TOOLS });
  const r2 = await post([...m1, { role: 'assistant', content: r1.reply }, { role: 'user', content: 'And of Spain?' }], { tools: TOOLS });
  t.comment(`shared ${r2.shared}; server cache_n ${r2.cacheN}, prompt_n ${r2.promptN}`);
  t.ok(Math.max(0, r2.shared - 16) <= r2.cacheN, `credited ${Math.max(0, r2.shared - 16)} ≤ cache_n ${r2.cacheN}`);
  t.ok(r2.promptCharge >= r2.promptN, `prompt charge ${r2.promptCharge} ≥ ${r2.promptN} read`);
});

t.test('cache_prompt: false goes to the server as sent, and the turn is credited nothing: the server reads it all', async (t) => {
  const { llama, post } = await world(t);
  const m1 = [SYSTEM, { role: 'user', content: 'What is the capital of France?' }];
  const r1 = await post(m1, { cache_prompt: false });
  const m2 = [...m1, { role: 'assistant', content: r1.reply }, { role: 'user', content: 'And of Spain?' }];
  const r2 = await post(m2, { cache_prompt: false });
  t.equal((llama.requests.filter((r) => r.path === '/v1/chat/completions').at(-1)!.body as Json).cache_prompt, false, 'forwarded as sent');
  t.equal(r2.cacheN, 0, 'the server reused nothing');
  t.equal(r2.shared, 0, 'and nothing is credited');
  t.equal(r2.promptCharge, r2.promptN, 'the whole prompt is charged');
  // The same turn with the cache allowed is credited again.
  const r3 = await post([...m2, { role: 'assistant', content: r2.reply }, { role: 'user', content: 'And of Italy?' }]);
  t.ok(r3.shared > 200, `cache_prompt left out: credited again (${r3.shared})`);
});
