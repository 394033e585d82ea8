// An answer's output as the gateway counts it: how a stream is metered (by tokenizer, by chunk, or
// by bytes), a whole answer counted, and the echoed prompt a completion starts with left out.

import type { TokenCounter } from '../../metering/types.js';
import { estimateTokens } from '../../metering/tokenizers/byte-estimate.js';
import type { Plan } from './plan.js';
import type { OutputCounting } from './output-meter.js';
import { providerOutputTrusted } from './settle.js';

/** How a stream is metered: with the model's tokenizer where there is one here, by llama.cpp's token a chunk, else by bytes. */
export function outputCounting(plan: Plan, counterMethod: string): OutputCounting {
  if (counterMethod.startsWith('tiktoken:')) return 'tokenizer';
  return plan.upstream.config.kind === 'llamacpp' ? 'chunk' : 'bytes';
}

/**
 * A whole answer's output as the gateway counts it. Where it counts on this machine it always does,
 * as it does a stream's: a tiktoken count is exact, and settlement takes it as a floor under the
 * provider's figure (a provider that says 0, or half, for what it wrote is not taken at its word);
 * the byte estimate, no bound, tells only a figure of 0 for text that came (settle.ts). A llama.cpp
 * server's own tokenizer is asked only where its usage cannot be trusted (a prompt array, n > 1,
 * choices past n), and within `asked.timeoutMs`. A text that could not be counted is estimated, and
 * the count is labelled so; an estimate is capped at the choice's allowance, as a stream's is
 * (ADR 0004). `first` is the first choice's part of `tokens` (undefined where no choice is numbered
 * 0): a llama.cpp server's own figure for a prompt array or n > 1 covers that choice alone (settle.ts).
 */
export async function countAnswer(
  plan: Plan,
  counter: TokenCounter,
  json: { texts: string[]; firstChoice: number; usage: Record<string, unknown> | null; unaskedChoices: boolean },
  asked: { signal: AbortSignal; timeoutMs: number },
): Promise<{ tokens: number; first: number | undefined; method: string }> {
  if (counter.method === 'llamacpp' && !json.unaskedChoices && providerOutputTrusted(plan, json.usage)) return { tokens: 0, first: undefined, method: counter.method };
  let upperBound = false;
  let estimated = counter.method === 'estimate:bytes';
  const countAll = (signal?: AbortSignal) =>
    Promise.all(
      json.texts.map(async (text) => {
        if (!text) return 0;
        try {
          const c = await (counter.countGenerated?.(text, signal) ?? counter.countText(text, signal));
          upperBound ||= c.upperBound;
          return c.tokens;
        } catch {
          estimated = true;
          return Math.min(estimateTokens(text), plan.perChoiceAllowance);
        }
      }),
    );
  // A server's tokenizer is asked within a bound of its own (`ANSWER_COUNT_TIMEOUT_MS`).
  const counts = counter.countGenerated ? await withinBound(asked.signal, asked.timeoutMs, countAll) : await countAll();
  const capped = counter.method === 'estimate:bytes' ? counts.map((n) => Math.min(n, plan.perChoiceAllowance)) : counts;
  const method = estimated ? 'estimate:bytes' : upperBound ? `${counter.method}:upper-bound` : counter.method;
  return { tokens: capped.reduce((a, b) => a + b, 0), first: json.firstChoice < 0 ? undefined : capped[json.firstChoice], method };
}

/**
 * How long an answer waits on a llama.cpp server's `/tokenize` for its count (a whole answer's text,
 * a stream's tool calls) before the client gets the end of it. Past it the count falls back — a
 * whole answer's to the byte estimate, a stream's to a token a chunk — rather than holding the
 * answer for the upstream's `timeoutMs` (10 minutes by default).
 */
export const ANSWER_COUNT_TIMEOUT_MS = 5_000;

/**
 * Runs `work` under a signal aborted with `signal` or once `timeoutMs` has passed; the timer and the
 * listener are let go when it ends. (Not `AbortSignal.any`: on Node 20 each one it makes stays
 * attached to a long-lived signal such as the gateway's drain — a leak a request.)
 */
export async function withinBound<T>(signal: AbortSignal, timeoutMs: number, work: (bounded: AbortSignal) => Promise<T>): Promise<T> {
  const bound = new AbortController();
  const stop = () => bound.abort(signal.reason);
  if (signal.aborted) stop();
  else signal.addEventListener('abort', stop, { once: true });
  const timer = setTimeout(() => bound.abort(new Error(`no answer within ${timeoutMs} ms`)), timeoutMs);
  try {
    return await work(bound.signal);
  } finally {
    clearTimeout(timer);
    signal.removeEventListener('abort', stop);
  }
}

/**
 * What each choice of a completions request with `echo` starts with: its prompt (choices
 * are numbered prompt by prompt, `n` to a prompt). Undefined when nothing is echoed — and for a
 * llama.cpp server, which does not echo: there, text that happens to repeat the prompt is the
 * model's own, and is metered.
 */
export function echoOf(plan: Plan, counter: TokenCounter): ((index: number) => string) | undefined {
  const body = plan.valid.body;
  if (plan.valid.kind !== 'completions' || body.echo !== true || plan.upstream.config.kind !== 'openai') return undefined;
  const prompt = body.prompt;
  const n = plan.valid.n;
  const isIds = (p: unknown): p is number[] => Array.isArray(p) && p.every((x) => typeof x === 'number');
  return (index) => {
    const p = Array.isArray(prompt) && !isIds(prompt) ? prompt[Math.floor(index / n)] : prompt;
    if (typeof p === 'string') return p;
    // A prompt of token ids is echoed as their text: known where the counter has the vocabulary.
    return isIds(p) ? (counter.decode?.(p) ?? '') : '';
  };
}
