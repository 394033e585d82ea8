// A small tool-using agent for the research-run tests (SPEC §5): the official openai SDK asks, the
// model proposes tool calls, the agent appends the assistant turn and one `tool` message per call,
// and asks again — until a turn comes back without tool calls. Streamed or not, each turn returns
// the text, the tool calls and the response headers, so a test sees what the client saw.

import OpenAI from 'openai';
import type {
  ChatCompletionMessageParam,
  ChatCompletionTool,
  ChatCompletionMessageFunctionToolCall,
} from 'openai/resources/chat/completions';
import type { OpenAiDouble } from '../doubles/openai.js';

type Json = Record<string, unknown>;

export interface Call {
  id: string;
  name: string;
  arguments: string;
}

export interface Turn {
  content: string;
  toolCalls: Call[];
  finishReason: string | null;
  headers: Headers;
  /** A whole answer's usage (null for a stream: the loop does not ask for its usage chunk). */
  usage: { prompt_tokens: number; completion_tokens: number; total_tokens: number } | null;
}

export interface TurnOptions {
  stream: boolean;
  /** Sent as `x-tollgate-conversation`; omitted: the gateway infers the conversation. */
  conversation?: string;
  tools?: ChatCompletionTool[];
  maxTokens?: number;
}

export const MODEL = 'gpt-4o-mini';

export const TOOLS: ChatCompletionTool[] = [
  {
    type: 'function',
    function: {
      name: 'search',
      description: 'Search the documentation',
      parameters: { type: 'object', properties: { q: { type: 'string' } }, required: ['q'] },
    },
  },
  {
    type: 'function',
    function: {
      name: 'save_note',
      description: 'Save a note for later',
      parameters: { type: 'object', properties: { text: { type: 'string' } }, required: ['text'] },
    },
  },
];

export function client(url: string, apiKey = 'tg-anything'): OpenAI {
  // maxRetries 0: a test must see the first answer, not a retried one.
  return new OpenAI({ baseURL: `${url}/v1`, apiKey, maxRetries: 0 });
}

/** One request of the agent loop. */
export async function turn(c: OpenAI, messages: ChatCompletionMessageParam[], o: TurnOptions): Promise<Turn> {
  const body = {
    model: MODEL,
    messages,
    tools: o.tools ?? TOOLS,
    max_tokens: o.maxTokens ?? 64,
  };
  const headers = o.conversation ? { 'x-tollgate-conversation': o.conversation } : undefined;
  if (!o.stream) {
    const { data, response } = await c.chat.completions.create({ ...body, stream: false }, { headers }).withResponse();
    const choice = data.choices[0];
    const calls = (choice?.message.tool_calls ?? []).filter((tc): tc is ChatCompletionMessageFunctionToolCall => tc.type === 'function');
    return {
      content: choice?.message.content ?? '',
      toolCalls: calls.map((tc) => ({ id: tc.id, name: tc.function.name, arguments: tc.function.arguments })),
      finishReason: choice?.finish_reason ?? null,
      headers: response.headers,
      usage: data.usage ?? null,
    };
  }
  const { data: stream, response } = await c.chat.completions.create({ ...body, stream: true }, { headers }).withResponse();
  let content = '';
  let finishReason: string | null = null;
  const calls: Call[] = [];
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    if (!choice) continue;
    content += choice.delta.content ?? '';
    for (const d of choice.delta.tool_calls ?? []) {
      const call = (calls[d.index] ??= { id: '', name: '', arguments: '' });
      call.id += d.id ?? '';
      call.name += d.function?.name ?? '';
      call.arguments += d.function?.arguments ?? '';
    }
    if (choice.finish_reason) finishReason = choice.finish_reason;
  }
  return { content, toolCalls: calls, finishReason, headers: response.headers, usage: null };
}

export interface AgentOptions extends TurnOptions {
  question: string;
  /** The tool's answer to a call (same call and arguments → same result, as a real read would). */
  toolResult?: (call: Call) => string;
  /** Guard against a run that never ends. */
  maxTurns?: number;
}

export interface AgentRun {
  turns: Turn[];
  /** The conversation as the client holds it after the last turn. */
  messages: ChatCompletionMessageParam[];
}

export const defaultToolResult = (call: Call) => `results for ${call.name} ${call.arguments}: see https://docs.example/${call.name}`;

/** The agent loop: ask, run the proposed tools, append, ask again, until an answer comes back. */
export async function runAgent(c: OpenAI, o: AgentOptions): Promise<AgentRun> {
  const messages: ChatCompletionMessageParam[] = [
    { role: 'system', content: 'You are a careful research assistant.' },
    { role: 'user', content: o.question },
  ];
  const turns: Turn[] = [];
  const maxTurns = o.maxTurns ?? 12;
  for (let i = 0; i < maxTurns; i++) {
    const t = await turn(c, messages, o);
    turns.push(t);
    if (t.toolCalls.length === 0) return { turns, messages };
    appendToolRound(messages, t.toolCalls, o.toolResult ?? defaultToolResult);
  }
  throw new Error(`the run did not end within ${maxTurns} turns`);
}

/** Appends the assistant's tool calls and one tool message per call, as an agent framework does. */
export function appendToolRound(messages: ChatCompletionMessageParam[], calls: Call[], result: (call: Call) => string): void {
  messages.push({
    role: 'assistant',
    content: null,
    tool_calls: calls.map((c) => ({ id: c.id, type: 'function', function: { name: c.name, arguments: c.arguments } })),
  });
  for (const call of calls) messages.push({ role: 'tool', tool_call_id: call.id, content: result(call) });
}

/** Tool rounds already in a request the double received: the assistant turns carrying calls. */
export function roundsIn(body: Json): number {
  const messages = Array.isArray(body.messages) ? (body.messages as Json[]) : [];
  return messages.filter((m) => m.role === 'assistant' && Array.isArray(m.tool_calls) && m.tool_calls.length > 0).length;
}

/** A model that proposes one `search` call whenever tools are offered, with new arguments each round. */
export function searchWhileOffered(body: Json): Array<{ name: string; arguments: string }> | null {
  if (!Array.isArray(body.tools) || body.tools.length === 0) return null;
  return [{ name: 'search', arguments: JSON.stringify({ q: `tollgate page ${roundsIn(body) + 1}` }) }];
}

/** The chat requests that reached the double, in order. */
export function chatRequests(double: OpenAiDouble): Json[] {
  return double.requests.filter((r) => r.path.endsWith('/chat/completions') && r.body !== null).map((r) => r.body as Json);
}

export function lastMessage(body: Json): Json {
  const messages = body.messages as Json[];
  return messages[messages.length - 1]!;
}

export async function metricsText(url: string): Promise<string> {
  const res = await fetch(`${url}/metrics`);
  return res.text();
}

/** The value of one sample line in Prometheus text, 0 when absent. */
export function sample(text: string, series: string): number {
  const line = text.split('\n').find((l) => l.startsWith(`${series} `));
  return line ? Number(line.slice(series.length + 1)) : 0;
}
