// The recorded llama-server's tokenizer and chat template, reproduced for the test double
// (fixtures/llamacpp/README.md): GPT-2 byte-level BPE plus the two ChatML control tokens, and the
// Qwen2.5-style ChatML template with tools from props.response.json `chat_template`.
// The test double's tests check both byte for byte against the recorded apply-template / tokenize
// responses.
import { get_encoding, type Tiktoken } from '@dqbd/tiktoken';

export const IM_START = 50257;
export const IM_END = 50258;

let gpt2: Tiktoken | null = null;

/** One encoder for every double in the process (encoders hold WASM memory until freed). */
export function gpt2Encoder(): Tiktoken {
  gpt2 ??= get_encoding('gpt2', { '<|im_start|>': IM_START, '<|im_end|>': IM_END });
  return gpt2;
}

/** llama.cpp `/tokenize` semantics: special-token text is parsed unless `parseSpecial` is false. */
export function tokenize(text: string, parseSpecial = true): number[] {
  const enc = gpt2Encoder();
  return Array.from(parseSpecial ? enc.encode(text, 'all') : enc.encode_ordinary(text));
}

export function tokenBytes(id: number): Uint8Array {
  return gpt2Encoder().decode_single_token_bytes(id);
}

export function detokenize(ids: number[]): string {
  return new TextDecoder().decode(gpt2Encoder().decode(Uint32Array.from(ids)));
}

export interface TemplateMessage {
  role?: unknown;
  content?: unknown;
  tool_calls?: unknown;
  [k: string]: unknown;
}

/** Jinja's `tojson` as minja renders it: Python-style `", "` and `": "` separators. */
export function toJson(v: unknown): string {
  if (v === null || v === undefined) return 'null';
  if (Array.isArray(v)) return `[${v.map(toJson).join(', ')}]`;
  if (typeof v === 'object') {
    const entries = Object.entries(v as Record<string, unknown>).filter(([, x]) => x !== undefined);
    return `{${entries.map(([k, x]) => `${JSON.stringify(k)}: ${toJson(x)}`).join(', ')}}`;
  }
  return JSON.stringify(v) ?? 'null';
}

function text(content: unknown): string {
  if (typeof content === 'string') return content;
  // The template does not take typed content: llama.cpp joins the text parts first.
  if (Array.isArray(content)) {
    return content
      .map((p) => (p !== null && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : ''))
      .join('\n');
  }
  return '';
}

interface CallView {
  name: string;
  args: unknown;
}

function toolCallsOf(m: TemplateMessage): CallView[] {
  if (!Array.isArray(m.tool_calls)) return [];
  return m.tool_calls.map((c: unknown) => {
    const call = (c ?? {}) as { function?: { name?: unknown; arguments?: unknown }; name?: unknown; arguments?: unknown };
    const fn = call.function ?? call;
    let args: unknown = fn.arguments ?? {};
    // llama.cpp parses string arguments to an object before rendering (supports_object_arguments).
    if (typeof args === 'string') {
      try {
        args = JSON.parse(args);
      } catch {
        /* not JSON: rendered as the string it is */
      }
    }
    return { name: typeof fn.name === 'string' ? fn.name : '', args };
  });
}

const TOOLS_INTRO =
  '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>';
const TOOLS_OUTRO =
  '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n';

/**
 * The prompt llama.cpp renders for a chat request. A final assistant message is a prefill: left
 * open (no `<|im_end|>`) and without a generation prompt, as `apply-template.response.json` shows.
 * `preamble` is not the recorded template's: text some templates write at the head of the system
 * turn, with or without a system message (Llama 3.x: "Cutting Knowledge Date: … Today Date: …").
 */
export function renderChat(messages: TemplateMessage[], tools?: unknown[], addGenerationPrompt = true, preamble?: string): string {
  const last = messages[messages.length - 1];
  const prefill = last !== undefined && last.role === 'assistant';
  let out = '';
  const firstIsSystem = messages[0]?.role === 'system';
  const head = preamble ?? '';
  if (tools !== undefined && tools.length > 0) {
    out += '<|im_start|>system\n' + head + (firstIsSystem ? text(messages[0].content) : 'You are a helpful assistant.');
    out += TOOLS_INTRO;
    for (const tool of tools) out += '\n' + toJson(tool);
    out += TOOLS_OUTRO;
  } else if (firstIsSystem || preamble !== undefined) {
    out += `<|im_start|>system\n${head}${firstIsSystem ? text(messages[0].content) : ''}<|im_end|>\n`;
  }
  messages.forEach((m, i) => {
    const calls = toolCallsOf(m);
    if (m.role === 'user' || (m.role === 'system' && i > 0) || (m.role === 'assistant' && calls.length === 0)) {
      out += `<|im_start|>${m.role}\n${text(m.content)}<|im_end|>\n`;
    } else if (m.role === 'assistant') {
      out += '<|im_start|>assistant';
      const c = text(m.content);
      if (c.length > 0) out += '\n' + c;
      for (const call of calls) out += `\n<tool_call>\n{"name": "${call.name}", "arguments": ${toJson(call.args)}}\n</tool_call>`;
      out += '<|im_end|>\n';
    } else if (m.role === 'tool') {
      if (i === 0 || messages[i - 1].role !== 'tool') out += '<|im_start|>user';
      out += `\n<tool_response>\n${text(m.content)}\n</tool_response>`;
      if (i === messages.length - 1 || messages[i + 1].role !== 'tool') out += '<|im_end|>\n';
    }
    // Any other role is dropped silently, as the recorded server does (error-bad-role).
  });
  if (prefill) return out.endsWith('<|im_end|>\n') ? out.slice(0, -'<|im_end|>\n'.length) : out;
  return addGenerationPrompt ? out + '<|im_start|>assistant\n' : out;
}

/** The template string the recorded server reports in `/props` (fixtures/llamacpp/props.response.json). */
export const CHAT_TEMPLATE = `{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}`;
