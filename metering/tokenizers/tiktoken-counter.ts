// Counts for OpenAI-family models with tiktoken, following the OpenAI cookbook "How to count tokens
// with tiktoken" (num_tokens_from_messages, num_tokens_for_tools). The cookbook's figures match the
// API's `usage.prompt_tokens` for its examples; the tests pin them (SPEC §3).
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import type {
  ChatCount,
  ChatMessage,
  ChatPrompt,
  CountMethod,
  TextCount,
  TokenCounter,
  ToolDefinition,
} from '../types.js';
import { cacheKey, sharedTokenCache, type CachedCount, type TokenCache } from '../token-cache.js';
import { countBounded } from './bounded-encode.js';

// Ordered so that the longer prefixes win (gpt-4o before gpt-4, text-embedding-3 before nothing).
const PREFIXES: ReadonlyArray<readonly [string, TiktokenEncoding]> = [
  ['gpt-4o', 'o200k_base'],
  ['gpt-4.1', 'o200k_base'],
  ['gpt-4.5', 'o200k_base'],
  ['gpt-5', 'o200k_base'],
  ['o1', 'o200k_base'],
  ['o3', 'o200k_base'],
  ['o4-mini', 'o200k_base'],
  ['chatgpt-4o', 'o200k_base'],
  ['gpt-oss', 'o200k_base'],
  ['gpt-4', 'cl100k_base'],
  ['gpt-3.5', 'cl100k_base'],
  ['text-embedding-3-', 'cl100k_base'],
  ['text-embedding-ada-002', 'cl100k_base'],
];

/**
 * The tiktoken encoding of an OpenAI-family model name, by prefix (tiktoken's own
 * `encoding_for_model` knows exact names only and throws on the rest). A provider prefix such as
 * OpenRouter's `openai/gpt-4o` is stripped first. `null`: not an OpenAI-family name.
 */
export function encodingForModel(model: string): TiktokenEncoding | null {
  const slash = model.lastIndexOf('/');
  const name = (slash >= 0 ? model.slice(slash + 1) : model).toLowerCase();
  for (const [prefix, encoding] of PREFIXES) if (name.startsWith(prefix)) return encoding;
  return null;
}

// Chat overhead (cookbook): every message is wrapped in <|start|>{role}<|message|>…<|end|> (3),
// a `name` costs 1 more, and the reply is primed with <|start|>assistant<|message|> (3).
const PER_MESSAGE = 3;
const PER_NAME = 1;
const REPLY_PRIMING = 3;
// Not in the cookbook: an assistant tool call renders as a small JSON envelope around its name and
// arguments; 3 tokens per call covers that envelope in the models we checked by hand. An estimate.
const PER_TOOL_CALL = 3;
// Not in the cookbook: an image part is billed by its size, which we do not fetch. 85 tokens is the
// fixed cost of a low-detail image; a high-detail image costs more, so this undercounts those.
const PER_IMAGE_PART = 85;

interface ToolConstants {
  funcInit: number;
  propInit: number;
  propKey: number;
  enumInit: number;
  enumItem: number;
  funcEnd: number;
}

// Cookbook num_tokens_for_tools: the gpt-4o family and gpt-4/gpt-3.5 differ only in func_init.
const TOOL_CONSTANTS: Record<'o200k_base' | 'cl100k_base', ToolConstants> = {
  o200k_base: { funcInit: 7, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
  cl100k_base: { funcInit: 10, propInit: 3, propKey: 3, enumInit: -3, enumItem: 3, funcEnd: 12 },
};

export interface TiktokenCounterOptions {
  cache?: TokenCache;
}

export class TiktokenCounter implements TokenCounter {
  readonly method: CountMethod;
  readonly encoding: TiktokenEncoding;
  private readonly cache: TokenCache;

  constructor(encoding: TiktokenEncoding, opts: TiktokenCounterOptions = {}) {
    this.encoding = encoding;
    this.method = `tiktoken:${encoding}`;
    this.cache = opts.cache ?? sharedTokenCache;
  }

  /** A counter for an OpenAI-family model name, or null when the name is not one. */
  static forModel(model: string, opts: TiktokenCounterOptions = {}): TiktokenCounter | null {
    const encoding = encodingForModel(model);
    return encoding === null ? null : new TiktokenCounter(encoding, opts);
  }

  async countChat(prompt: ChatPrompt): Promise<ChatCount> {
    return this.countChatSync(prompt);
  }

  countChatSync(prompt: ChatPrompt): ChatCount {
    let upperBound = false;
    const offered = prompt.tools ?? [];
    const tools =
      offered.length > 0
        ? this.cached('tools', offered, () => this.toolsCount(offered))
        : { tokens: 0, upperBound: false };
    upperBound ||= tools.upperBound;
    const prefix: number[] = [tools.tokens];
    for (const message of prompt.messages) {
      const m = this.cached('message', message, () => this.messageCount(message));
      upperBound ||= m.upperBound;
      prefix.push(prefix[prefix.length - 1] + m.tokens);
    }
    return {
      tokens: prefix[prefix.length - 1] + REPLY_PRIMING,
      prefix,
      method: this.label(upperBound),
      upperBound,
    };
  }

  async countText(text: string): Promise<TextCount> {
    const c = this.cached('text', text, () => this.text(text));
    return { tokens: c.tokens, method: this.label(c.upperBound), upperBound: c.upperBound };
  }

  countOutput(text: string): number {
    return countBounded(this.encoding, text).tokens;
  }

  private label(upperBound: boolean): CountMethod {
    return upperBound ? `tiktoken:${this.encoding}:upper-bound` : this.method;
  }

  private cached(kind: string, value: unknown, compute: () => CachedCount): CachedCount {
    const key = cacheKey(`${this.encoding}:${kind}`, value);
    const hit = this.cache.get(key);
    if (hit !== undefined) return hit;
    const fresh = compute();
    this.cache.set(key, fresh);
    return fresh;
  }

  private text(text: string): CachedCount {
    const c = countBounded(this.encoding, text);
    return { tokens: c.tokens, upperBound: c.split };
  }

  private messageCount(message: ChatMessage): CachedCount {
    const acc = new Tally(this.encoding);
    acc.add(PER_MESSAGE);
    acc.text(message.role);
    const content = message.content;
    if (typeof content === 'string') acc.text(content);
    else if (Array.isArray(content)) {
      for (const part of content) {
        if (typeof part.text === 'string') acc.text(part.text);
        else if (part.type === 'image_url' || part.type === 'input_image') acc.add(PER_IMAGE_PART);
      }
    }
    if (typeof message.name === 'string') {
      acc.text(message.name);
      acc.add(PER_NAME);
    }
    for (const call of message.tool_calls ?? []) {
      acc.add(PER_TOOL_CALL);
      acc.text(call.function?.name ?? '');
      acc.text(call.function?.arguments ?? '');
    }
    // `tool_call_id` is routing metadata the model never reads: not counted.
    return acc.result();
  }

  private toolsCount(tools: ToolDefinition[]): CachedCount {
    const k = TOOL_CONSTANTS[this.encoding === 'o200k_base' ? 'o200k_base' : 'cl100k_base'];
    const acc = new Tally(this.encoding);
    for (const tool of tools) {
      const fn = tool.function;
      acc.add(k.funcInit);
      acc.text(`${fn.name}:${stripPeriod(stringOr(fn.description))}`);
      const properties = propertiesOf(fn.parameters);
      if (properties.length === 0) continue;
      acc.add(k.propInit);
      for (const [key, prop] of properties) {
        acc.add(k.propKey);
        if (Array.isArray(prop.enum)) {
          acc.add(k.enumInit);
          for (const item of prop.enum) {
            acc.add(k.enumItem);
            acc.text(String(item));
          }
        }
        acc.text(`${key}:${stringOr(prop.type)}:${stripPeriod(stringOr(prop.description))}`);
      }
    }
    acc.add(k.funcEnd);
    return acc.result();
  }
}

/** Running total of one message or tool list, remembering whether any text was cut. */
class Tally {
  private tokens = 0;
  private upperBound = false;
  constructor(private readonly encoding: TiktokenEncoding) {}
  add(n: number): void {
    this.tokens += n;
  }
  text(s: string): void {
    const c = countBounded(this.encoding, s);
    this.tokens += c.tokens;
    this.upperBound ||= c.split;
  }
  result(): CachedCount {
    return { tokens: Math.max(0, this.tokens), upperBound: this.upperBound };
  }
}

function propertiesOf(parameters: Record<string, unknown> | undefined): Array<[string, Record<string, unknown>]> {
  const props = parameters?.properties;
  if (props === null || typeof props !== 'object' || Array.isArray(props)) return [];
  return Object.entries(props as Record<string, unknown>).map(([key, value]) => [
    key,
    value !== null && typeof value === 'object' ? (value as Record<string, unknown>) : {},
  ]);
}

function stringOr(v: unknown): string {
  return typeof v === 'string' ? v : '';
}

function stripPeriod(s: string): string {
  return s.endsWith('.') ? s.slice(0, -1) : s;
}
