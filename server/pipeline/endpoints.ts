// The three proxied endpoints differ only in how a body is checked and what its rows are; the rest
// of the pipeline is shared (ADR 0001). Validation names the offending field (`param`).

import { GatewayError } from '../errors.js';
import { unstorableText } from '../storable-text.js';
import type { ChatMessage, ToolDefinition } from '../../metering/types.js';
import { isTokenId } from '../../metering/row-plan.js';

export type EndpointKind = 'chat' | 'completions' | 'embeddings';

export const ENDPOINT_PATHS: Record<EndpointKind, string> = {
  chat: '/v1/chat/completions',
  completions: '/v1/completions',
  embeddings: '/v1/embeddings',
};

export function endpointForPath(path: unknown): EndpointKind | null {
  const found = (Object.keys(ENDPOINT_PATHS) as EndpointKind[]).find((k) => ENDPOINT_PATHS[k] === path);
  return found ?? null;
}

export interface ValidRequest {
  kind: EndpointKind;
  body: Record<string, unknown>;
  model: string;
  stream: boolean;
  /** The client asked for a usage chunk (`stream_options.include_usage`). */
  includeUsage: boolean;
  n: number;
  /**
   * Completions the upstream generates per row, which the allowance reserves: `n`, or a legacy
   * completions request's `best_of` (generated server-side, billed, and not all returned).
   */
  generations: number;
  /** max_completion_tokens ?? max_tokens, when given. */
  maxTokens: number | null;
  maxTokensField: 'max_completion_tokens' | 'max_tokens' | null;
  messages: ChatMessage[] | null;
  tools: ToolDefinition[] | null;
  /** Rows (SPEC §1): a chat request's 1, a completions `prompt`'s or an embeddings `input`'s elements. */
  rows: number;
  /**
   * The kinds of content in the messages besides text (`image_url`, `file`, `input_audio`, …, and
   * `audio` for an earlier answer's audio sent back): what a count may not cover (planCountMethod).
   */
  partKinds?: ReadonlySet<string>;
}

/** Part kinds the tokenizer counts: text, an earlier refusal, images (ADR 0022). */
const TIKTOKEN_COUNTS = new Set(['text', 'refusal', 'image_url', 'input_image']);

/**
 * The count's label (SPEC §2), with `:partial` when the messages hold content the count leaves
 * out — files and audio for tiktoken (OpenAI bills them as prompt tokens, by rules the gateway
 * cannot apply to their bytes), anything but text for a llama.cpp server's template — so that a
 * count that is not the whole prompt is never labelled as if it were.
 */
export function planCountMethod<M extends string>(method: M, valid: Pick<ValidRequest, 'partKinds'>): M {
  const kinds = valid.partKinds;
  if (kinds === undefined || kinds.size === 0) return method;
  const tiktoken = method.startsWith('tiktoken:');
  if (!tiktoken && method !== 'llamacpp') return method;
  for (const kind of kinds) {
    if (tiktoken ? !TIKTOKEN_COUNTS.has(kind) : kind !== 'text' && kind !== 'refusal') return `${method.replace(/:upper-bound$/, '')}:partial` as M;
  }
  return method;
}

/**
 * The request may be answered in audio: a chat request whose `modalities` name `"audio"`, or that
 * sets the `audio` output parameters. OpenAI answers in text alone otherwise (`modalities` defaults
 * to `["text"]`), so only such a request is reserved at a model's audio output rate (ADR 0022).
 */
export function mayAnswerInAudio(valid: Pick<ValidRequest, 'kind' | 'body'>): boolean {
  if (valid.kind !== 'chat') return false;
  const { modalities, audio } = valid.body;
  return (Array.isArray(modalities) && modalities.includes('audio')) || isObject(audio);
}

function invalid(param: string, message: string): never {
  throw new GatewayError('invalid_request', `${param}: ${message}`, {}, param);
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The largest allowance a request may name: 2^31 − 1, above every model's output limit. */
export const MAX_TOKENS_LIMIT = 2_147_483_647;

function optionalInt(body: Record<string, unknown>, key: string, min: number, max = MAX_TOKENS_LIMIT): number | null {
  const v = body[key];
  if (v === undefined || v === null) return null;
  if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) invalid(key, `must be an integer from ${min} to ${max}`);
  return v;
}

/** An assistant message's tool calls: objects; a function call names its function, with string arguments. */
function checkToolCalls(calls: unknown[], path: string): void {
  calls.forEach((call, j) => {
    if (!isObject(call)) invalid(`${path}[${j}]`, 'must be a tool call object');
    if (call.type !== undefined && typeof call.type !== 'string') invalid(`${path}[${j}].type`, 'must be a string');
    if (call.type === undefined || call.type === 'function') {
      const fn = call.function;
      if (!isObject(fn) || typeof fn.name !== 'string') invalid(`${path}[${j}].function.name`, 'must be a string');
      if (fn.arguments !== undefined && fn.arguments !== null && typeof fn.arguments !== 'string') {
        invalid(`${path}[${j}].function.arguments`, 'must be a string (JSON text)');
      }
    }
  });
}

/**
 * The most fields one object may have: the request itself, a message, or an object within one.
 * OpenAI's request has about 40 and a message under 10; providers add a few more. A message's
 * fields are all hashed, sorted and sized for the prefix memo, and the request is forwarded whole:
 * one message of 1.5 million empty fields (18 MB, under the body limit) held the event loop for
 * 30 s and was charged 9 tokens.
 */
export const MAX_OBJECT_FIELDS = 256;

/**
 * The most fields and array elements a request may have outside its messages and rows, at any
 * depth. Tools and response schemas may be wide (OpenAI takes up to 5,000 properties in a schema,
 * each a few fields), so they are bounded in all rather than per object: 1.4 million fields in a
 * tool held the event loop for 12 s, and an enum of 14 million values 2 s. (A completions
 * `prompt` or embeddings `input` is bounded by its rows and tokens instead: token ids are many.)
 */
export const MAX_REQUEST_FIELDS = 50_000;

/**
 * The most fields and array elements the messages may have in all. A long agent run is many (a
 * tool round is about a dozen: 4,600 rounds are 50,000), so their bound is far larger; but one
 * that costs no tokens must still have one (3.5 million small objects in a message's extra field
 * held the event loop for 5.7 s).
 */
export const MAX_MESSAGE_FIELDS = 1_000_000;

/** How many fields `o` has, counted no further than one past `limit`. */
function fieldsUpTo(o: object, limit: number): number {
  let n = 0;
  for (const _ in o) if (++n > limit) break;
  return n;
}

/** The fields and array elements within `v`, at any depth, counted no further than one past `limit`; `skip`: top-level fields not walked into. */
function nodesWithin(v: unknown, limit: number, skip: ReadonlySet<string> = NOTHING_SKIPPED): number {
  let n = 0;
  const walk = (x: unknown, top: boolean): void => {
    if (typeof x !== 'object' || x === null) return;
    if (Array.isArray(x)) {
      for (let i = 0; i < x.length; i++) {
        if (++n > limit) return;
        walk(x[i], false);
      }
      return;
    }
    for (const k in x) {
      if (++n > limit) return;
      if (!(top && skip.has(k))) walk((x as Record<string, unknown>)[k], false);
    }
  };
  walk(v, true);
  return n;
}

const NOTHING_SKIPPED: ReadonlySet<string> = new Set();
/** What MAX_REQUEST_FIELDS does not count: bounded otherwise. */
const BOUNDED_APART: ReadonlySet<string> = new Set(['messages', 'prompt', 'input']);

/**
 * Where in `v` the first object with more than MAX_OBJECT_FIELDS fields is, as a path suffix
 * (`''` for `v` itself, `.content[0]` for one within), or null when there is none. The path is
 * built only on the way back from a find: an ordinary message costs no strings.
 */
function overFullAt(v: unknown): string | null {
  if (typeof v !== 'object' || v === null) return null;
  if (Array.isArray(v)) {
    for (let i = 0; i < v.length; i++) {
      const inner = overFullAt(v[i]);
      if (inner !== null) return `[${i}]${inner}`;
    }
    return null;
  }
  if (fieldsUpTo(v, MAX_OBJECT_FIELDS) > MAX_OBJECT_FIELDS) return '';
  for (const k in v) {
    const inner = overFullAt((v as Record<string, unknown>)[k]);
    if (inner !== null) return `.${k}${inner}`;
  }
  return null;
}

function checkMessages(v: unknown, partKinds: Set<string>): ChatMessage[] {
  if (!Array.isArray(v)) invalid('messages', 'must be an array of messages');
  if (v.length === 0) invalid('messages', 'must contain at least one message');
  v.forEach((m, i) => {
    if (!isObject(m)) invalid(`messages[${i}]`, 'must be an object');
    const full = overFullAt(m);
    if (full !== null) invalid(`messages[${i}]${full}`, `has more than ${MAX_OBJECT_FIELDS} fields, the most an object of a message may have`);
    if (typeof m.role !== 'string') invalid(`messages[${i}].role`, 'must be a string');
    const c = m.content;
    if (c !== undefined && c !== null && typeof c !== 'string' && !Array.isArray(c)) {
      invalid(`messages[${i}].content`, 'must be a string, an array of content parts, or null');
    }
    if (Array.isArray(c)) {
      c.forEach((part, j) => {
        if (!isObject(part) || typeof part.type !== 'string') invalid(`messages[${i}].content[${j}]`, 'must be a content part with a type');
        // A text part is counted: its text must be text.
        if (part.type === 'text' && typeof part.text !== 'string') invalid(`messages[${i}].content[${j}].text`, 'must be a string');
        // An image is counted from its `detail` (metering/tokenizers/image-tokens.ts): its shape is checked as OpenAI checks it.
        if (part.type === 'image_url') checkImageUrl(part.image_url, `messages[${i}].content[${j}].image_url`);
        if (part.type !== 'text') partKinds.add(part.type);
      });
    }
    // An earlier audio answer sent back by reference (`audio: {id}`): the model hears it again.
    if (isObject(m.audio)) partKinds.add('audio');
    if (m.tool_calls !== undefined && m.tool_calls !== null) {
      if (!Array.isArray(m.tool_calls)) invalid(`messages[${i}].tool_calls`, 'must be an array');
      checkToolCalls(m.tool_calls, `messages[${i}].tool_calls`);
    }
    if (m.name !== undefined && typeof m.name !== 'string') invalid(`messages[${i}].name`, 'must be a string');
  });
  return v as ChatMessage[];
}

/** An image part's `image_url`: OpenAI's `{url, detail?}`, or the bare URL some servers take (Ollama). */
function checkImageUrl(v: unknown, path: string): void {
  if (typeof v === 'string') return;
  if (!isObject(v)) invalid(path, 'must be an object with a url (or the URL itself)');
  if (typeof v.url !== 'string') invalid(`${path}.url`, 'must be a string');
  if (v.detail !== undefined && v.detail !== null && typeof v.detail !== 'string') invalid(`${path}.detail`, 'must be a string');
}

/** A function's `parameters` (a JSON schema, counted with the tool): an object when given. */
function checkParameters(fn: Record<string, unknown>, path: string): void {
  if (fn.parameters !== undefined && fn.parameters !== null && !isObject(fn.parameters)) invalid(`${path}.parameters`, 'must be an object (a JSON schema)');
}

function checkTools(v: unknown): ToolDefinition[] | null {
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v)) invalid('tools', 'must be an array');
  v.forEach((t, i) => {
    if (!isObject(t)) invalid(`tools[${i}]`, 'must be an object');
    // A function tool needs its name; another kind (`custom`) is the upstream's to judge.
    if (t.type === undefined || t.type === 'function') {
      if (!isObject(t.function) || typeof t.function.name !== 'string') invalid(`tools[${i}].function.name`, 'must be a string');
      checkParameters(t.function, `tools[${i}].function`);
    } else if (typeof t.type !== 'string') {
      invalid(`tools[${i}].type`, 'must be a string');
    }
  });
  return v.length > 0 ? (v as ToolDefinition[]) : null;
}

/**
 * The fields of a chat request besides its messages and tools that planning reads — hashed into the
 * tool offer, counted with the prompt, or choosing the price — so a value of the wrong type is a 400
 * naming it, not a guess forwarded and paid for.
 */
function checkChatFields(body: Record<string, unknown>): void {
  const given = (key: string) => body[key] !== undefined && body[key] !== null;
  if (given('tool_choice') && typeof body.tool_choice !== 'string' && !isObject(body.tool_choice)) invalid('tool_choice', 'must be a string ("none", "auto", "required") or an object');
  if (given('parallel_tool_calls') && typeof body.parallel_tool_calls !== 'boolean') invalid('parallel_tool_calls', 'must be a boolean');
  if (given('response_format')) {
    // Only what planning reads is held to a shape. Servers differ in the rest: llama.cpp takes `{}`,
    // a `json_schema` type without its object, a schema beside the type, and ignores a bare string;
    // the upstream answers those. (Only a `json_schema` object is counted with the prompt: plan.ts.)
    const rf = body.response_format;
    if (!isObject(rf) && typeof rf !== 'string') invalid('response_format', 'must be an object, such as {"type": "json_object"}');
    if (isObject(rf)) {
      if (rf.type !== undefined && rf.type !== null && typeof rf.type !== 'string') invalid('response_format.type', 'must be a string');
      if (rf.json_schema !== undefined && rf.json_schema !== null && !isObject(rf.json_schema)) invalid('response_format.json_schema', 'must be an object');
    }
  }
  if (given('prediction')) {
    const p = body.prediction;
    if (!isObject(p)) invalid('prediction', 'must be an object');
    if (typeof p.content !== 'string' && !Array.isArray(p.content)) invalid('prediction.content', 'must be a string or an array of text parts');
    if (Array.isArray(p.content)) {
      p.content.forEach((part, j) => {
        if (!isObject(part) || typeof part.text !== 'string') invalid(`prediction.content[${j}].text`, 'must be a string');
      });
    }
  }
  if (given('modalities') && !(Array.isArray(body.modalities) && body.modalities.every((m) => typeof m === 'string'))) invalid('modalities', 'must be an array of strings');
  if (given('audio') && !isObject(body.audio)) invalid('audio', 'must be an object');
}

/**
 * The legacy `functions` offer (before `tools`), as the tools it stands for: counted and hashed as
 * a tool offer is (the request itself is forwarded as the client wrote it).
 */
function checkFunctions(v: unknown): ToolDefinition[] | null {
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v)) invalid('functions', 'must be an array');
  v.forEach((f, i) => {
    if (!isObject(f) || typeof f.name !== 'string') invalid(`functions[${i}].name`, 'must be a string');
    checkParameters(f, `functions[${i}]`);
  });
  return v.length > 0 ? v.map((f) => ({ type: 'function', function: f }) as ToolDefinition) : null;
}

/** The tool offer: `tools`, and a legacy `functions` beside them too (both are forwarded, so both are counted). */
function offered(tools: ToolDefinition[] | null, functions: ToolDefinition[] | null): ToolDefinition[] | null {
  return tools && functions ? [...tools, ...functions] : (tools ?? functions);
}

/**
 * Checks a completions `prompt` / embeddings `input` (the row shapes of metering/row-plan.ts
 * `textRows`) and returns how many rows it has. Nothing is built per row: a body of millions of
 * rows is refused for their number before any is counted, and building them took seconds.
 */
function checkRows(v: unknown, param: 'prompt' | 'input', allowEmptyString: boolean): number {
  // A shape error names the field in its message already (as metering/row-plan.ts words it).
  const shape = (message: string, at: string = param): never => {
    throw new GatewayError('invalid_request', message, {}, at);
  };
  if (typeof v === 'string') {
    // A plain string has no element 0: the field itself is named.
    if (!allowEmptyString && v.length === 0) invalid(param, 'must not be empty');
    return 1;
  }
  if (!Array.isArray(v)) shape(`${param} must be a string or an array`);
  const list = v as unknown[];
  if (list.length === 0) invalid(param, 'must not be empty');
  // One prompt of token ids.
  if (list.every(isTokenId)) return 1;
  // A list that starts with a number is a prompt of token ids: the first element that is not one
  // is at fault (a negative or fractional id, or a string among ids), not the valid id before it.
  if (typeof list[0] === 'number') {
    const bad = list.findIndex((x) => !isTokenId(x));
    shape(`${param}[${bad}] must be a token id (a whole number from 0): ${param} is a list of token ids`, `${param}[${bad}]`);
  }
  for (let i = 0; i < list.length; i++) {
    const row = list[i];
    if (typeof row !== 'string' && !(Array.isArray(row) && row.every(isTokenId))) shape(`${param}[${i}] must be a string or an array of token ids`, `${param}[${i}]`);
  }
  if (!allowEmptyString) list.forEach((row, i) => row === '' && invalid(`${param}[${i}]`, 'must not be empty'));
  // A row of token ids names at least one token (an empty one is no prompt, and no input).
  list.forEach((row, i) => Array.isArray(row) && row.length === 0 && invalid(`${param}[${i}]`, 'must not be an empty list of token ids'));
  return list.length;
}

/**
 * The longest model name taken (characters). Provider names run to ~80 (`ft:` fine-tunes,
 * `org/model:variant`); a name is logged, stored per turn and used as a cache key, so a
 * megabyte-long one is no model (it filled caches and logs a megabyte a request).
 */
export const MAX_MODEL_CHARS = 256;

export function validateRequest(kind: EndpointKind, body: unknown): ValidRequest {
  if (!isObject(body)) throw new GatewayError('invalid_request', 'request body must be a JSON object');
  if (fieldsUpTo(body, MAX_OBJECT_FIELDS) > MAX_OBJECT_FIELDS) {
    throw new GatewayError('invalid_request', `the request has more than ${MAX_OBJECT_FIELDS} fields, the most it may have`);
  }
  if (nodesWithin(body, MAX_REQUEST_FIELDS, BOUNDED_APART) > MAX_REQUEST_FIELDS) {
    throw new GatewayError('invalid_request', `the request has more than ${MAX_REQUEST_FIELDS} fields and array elements outside its messages and rows (at any depth), the most it may have`);
  }
  if (nodesWithin(body.messages, MAX_MESSAGE_FIELDS) > MAX_MESSAGE_FIELDS) {
    invalid('messages', `have more than ${MAX_MESSAGE_FIELDS} fields and array elements in all (at any depth), the most they may have`);
  }
  if (typeof body.model !== 'string' || body.model.length === 0) invalid('model', 'must be a non-empty string');
  if (body.model.length > MAX_MODEL_CHARS) invalid('model', `must be at most ${MAX_MODEL_CHARS} characters (it has ${body.model.length})`);
  const modelText = unstorableText(body.model);
  if (modelText) invalid('model', modelText);
  const stream = body.stream === undefined || body.stream === null ? false : body.stream;
  if (typeof stream !== 'boolean') invalid('stream', 'must be a boolean');
  const so = body.stream_options;
  if (so !== undefined && so !== null && !isObject(so)) invalid('stream_options', 'must be an object');
  const includeUsage = isObject(so) && so.include_usage === true;
  const n = optionalInt(body, 'n', 1, 128) ?? 1;
  const mct = optionalInt(body, 'max_completion_tokens', 1);
  const mt = optionalInt(body, 'max_tokens', 1);
  const bestOf = kind === 'completions' ? optionalInt(body, 'best_of', 1, 128) : null;
  if (bestOf !== null && bestOf < n) invalid('best_of', `must be at least n (${n}): it is how many completions are generated, n how many are returned`);
  const base = {
    kind,
    body,
    model: body.model,
    stream: kind === 'embeddings' ? false : stream,
    includeUsage,
    n: kind === 'embeddings' ? 1 : n,
    generations: kind === 'embeddings' ? 1 : Math.max(n, bestOf ?? 1),
    maxTokens: kind === 'embeddings' ? null : (mct ?? mt),
    maxTokensField: kind === 'embeddings' ? null : mct !== null ? ('max_completion_tokens' as const) : mt !== null ? ('max_tokens' as const) : null,
  };
  switch (kind) {
    case 'chat': {
      const partKinds = new Set<string>();
      const messages = checkMessages(body.messages, partKinds);
      const tools = offered(checkTools(body.tools), checkFunctions(body.functions));
      checkChatFields(body);
      return { ...base, messages, tools, rows: 1, partKinds };
    }
    case 'completions':
      if (body.prompt === undefined) invalid('prompt', 'is required');
      // Read with every prompt, and counted so.
      if (body.suffix !== undefined && body.suffix !== null && typeof body.suffix !== 'string') invalid('suffix', 'must be a string');
      return { ...base, messages: null, tools: null, rows: checkRows(body.prompt, 'prompt', true) };
    case 'embeddings':
      if (body.input === undefined) invalid('input', 'is required');
      return { ...base, messages: null, tools: null, rows: checkRows(body.input, 'input', false) };
  }
}
