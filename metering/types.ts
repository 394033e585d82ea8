// Shared shapes of the metering core. Plain TypeScript: nothing here knows about Fastify.

/**
 * How a count was obtained (SPEC §2). An upper bound — from splitting a pathological run of text,
 * or images counted at the most they can cost (ADR 0022) — is labelled
 * `tiktoken:<encoding>:upper-bound`; a byte estimate is always `estimate:bytes`. A size refusal
 * resting on images at the least they can cost labels its figure `tiktoken:<encoding>:lower-bound`.
 * A chat count that leaves out files or audio (for llama.cpp, anything but text) is labelled
 * `<method>:partial` (ADR 0022).
 */
export type CountMethod =
  | `tiktoken:${string}`
  | 'llamacpp'
  | 'provider'
  | 'estimate:bytes';

export interface ToolCall {
  id?: string;
  type?: string;
  function?: { name?: string; arguments?: string };
  /** Another kind of call (`custom: {name, input}`), keyed by its `type`. */
  [k: string]: unknown;
}

export type ContentPart = { type: string; text?: string; [k: string]: unknown };

export interface ChatMessage {
  role: string;
  content?: string | ContentPart[] | null;
  name?: string;
  tool_calls?: ToolCall[];
  tool_call_id?: string;
  [k: string]: unknown;
}

/**
 * A tool offered to the model: a function tool (`type: "function"`), or another kind the API knows
 * (`custom`, with `custom: {name, description, format}`), passed on as written.
 */
export interface ToolDefinition {
  type: string;
  function?: {
    name: string;
    description?: string;
    parameters?: Record<string, unknown>;
    [k: string]: unknown;
  };
  [k: string]: unknown;
}

/** The parts of a chat request that decide what the model reads. */
export interface ChatPrompt {
  model: string;
  messages: ChatMessage[];
  tools?: ToolDefinition[];
  tool_choice?: unknown;
  /**
   * The structured-output schema a provider reads with the prompt (`response_format.json_schema`),
   * counted with the tools as the offer's share. A llama.cpp server makes it a grammar instead,
   * which the prompt never holds: its counter leaves it out.
   */
  format?: unknown;
  /**
   * The request's other fields that a server rendering its own chat template renders with
   * (`add_generation_prompt`, `chat_template_kwargs`, …: see `TEMPLATE_FIELDS`); llama.cpp's
   * count passes them on, so it stays the server's own.
   */
  template?: Record<string, unknown>;
  /** Counts already known for the leading messages (metering/prefix-memo.ts); a hint a counter may use. */
  known?: KnownPrefix;
}

/**
 * Chat request fields besides `messages` and `tools` that change what a llama.cpp server's chat
 * template renders (its /apply-template parses the request as its chat route does): `tool_choice`
 * `"none"` leaves the tools out, `chat_template_kwargs` sets template switches such as
 * `enable_thinking`, `add_generation_prompt` and `continue_final_message` change the end.
 */
export const TEMPLATE_FIELDS = ['tool_choice', 'parallel_tool_calls', 'add_generation_prompt', 'continue_final_message', 'chat_template_kwargs', 'reasoning_format'] as const;

/**
 * The counts of an earlier, equal list of leading messages, from the counter that made them. Never
 * of messages with images: what an image costs depends on the model, not only on the counter.
 */
export interface KnownPrefix {
  /** How many leading messages the counts cover. */
  messages: number;
  /** The method of the counter that made them: only the same counter reuses them. */
  method: CountMethod;
  /** ChatCount.prefix of that list: prefix[k + 1] − prefix[k] is message k's tokens. */
  prefix: readonly number[];
}

/** A chat prompt's count, with the running total after each message for shared-prefix charging. */
export interface ChatCount {
  /** Whole prompt as the model reads it: tools + messages + reply priming. */
  tokens: number;
  /**
   * `prefix[k]` = tokens of the rendered leading k messages (tool definitions included, reply
   * priming excluded). `prefix[0]` is the tools' share. Length = messages.length + 1.
   */
  prefix: number[];
  /**
   * Where the counter sees the token ids (llama.cpp): `prefixDigests[k]` digests the ids counted in
   * `prefix[k]`, so a rendering that changed at the same count can be told apart (ADR 0004).
   */
  prefixDigests?: string[];
  /**
   * Where the counter holds the token ids (llama.cpp): the digest of the first `count` of them, made
   * as `prefixDigests` are ('' past the last). The charge checks the previous request's boundaries
   * with it (ADR 0004): a template that writes a message elsewhere once more follow it (Mistral v0.3
   * moves the system message into the last user turn) shares only the tokens both begin with.
   */
  digestAt?: (count: number) => string;
  method: CountMethod;
  /**
   * True when the count is an upper bound, not exact: a pathological run of text was split, or an
   * image is counted at the most it can cost.
   */
  upperBound: boolean;
  /** Whether the text alone is an upper bound (a second, exact count can help); default `upperBound`. */
  textUpperBound?: boolean;
  /** The image parts of the prompt, when it has some: their share of `tokens`, and the least they can cost. */
  images?: ImageCount;
}

/** What a prompt's images add to its count (ADR 0022). */
export interface ImageCount {
  parts: number;
  /** Their share of the count: the most they can cost. */
  tokens: number;
  /** The least they can cost together. */
  least: number;
}

export interface TextCount {
  tokens: number;
  method: CountMethod;
  upperBound: boolean;
}

/** One tokenizer family (tiktoken encoding, a llama.cpp server, or the byte estimate). */
export interface TokenCounter {
  readonly method: CountMethod;
  countChat(prompt: ChatPrompt, signal?: AbortSignal): Promise<ChatCount>;
  /** A completions prompt row or an embeddings input row (plain text, no chat formatting). */
  countText(text: string, signal?: AbortSignal): Promise<TextCount>;
  /** Output text as generated (used to meter streamed output when the provider gives no usage). */
  countOutput(text: string): number;
  /**
   * Text the model wrote, counted exactly where that takes a call (llama.cpp's /tokenize, with no
   * start-of-text token added: the model wrote none). Without it, `countText` counts output as well.
   */
  countGenerated?(text: string, signal?: AbortSignal): Promise<TextCount>;
  /**
   * The longest start of `text` (whole characters) that is at most `tokens` tokens, for a streamed
   * piece that crosses the allowance; '' when it cannot be told cheaply.
   */
  leadingText?(text: string, tokens: number): string;
  /** The text of token ids in this counter's vocabulary; null when they are not all in it. */
  decode?(ids: readonly number[]): string | null;
  /**
   * A counter that counts more exactly, at more cost, where this one gives upper bounds (tiktoken:
   * long runs without spaces); asked for only before refusing a request on an upper bound.
   */
  exactly?(opts?: { remember?: boolean }): TokenCounter;
}
