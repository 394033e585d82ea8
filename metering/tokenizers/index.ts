// Which counter counts a request (SPEC §3): an OpenAI-family model name → tiktoken with its
// encoding; a llama.cpp upstream → the server's own template and tokenizer; anything else → the
// labelled byte estimate. Counters are created once per (upstream, model) and reused.
import type { Dispatcher } from 'undici';
import type { TokenCounter } from '../types.js';
import { sharedTokenCache, TokenCache } from '../token-cache.js';
import { ByteEstimateCounter } from './byte-estimate.js';
import { LlamaCppCounter } from './llamacpp-counter.js';
import { encodingForModel, TiktokenCounter } from './tiktoken-counter.js';
import { CountPool } from './count-pool.js';

export { CountPool, CountPoolError, type CountPoolStats } from './count-pool.js';
export { BYTES_PER_ESTIMATED_TOKEN, ByteEstimateCounter, estimateTokens } from './byte-estimate.js';
export { fetchContextWindow, fetchServerProps, LlamaCppCounter, LlamaCppCountError, type ServerProps } from './llamacpp-counter.js';
export { encodingForModel, MODEL_PREFIXES, TiktokenCounter } from './tiktoken-counter.js';
export { loadEncoders } from './bounded-encode.js';

export interface UpstreamRef {
  kind: 'openai' | 'llamacpp';
  baseUrl: string;
  dispatcher: Dispatcher;
  /** llama.cpp `--api-key`, when set. */
  apiKey?: string;
}

export interface CountersOptions {
  /** Bytes of per-message counts to keep (default 16 MiB); ignored when `cache` is given. */
  cacheBytes?: number;
  cache?: TokenCache;
  /** Worker threads that count large texts off the main thread (1–2, default 1; ADR 0009). */
  workers?: number;
}

export interface Counters {
  counterFor(upstream: UpstreamRef, model: string): TokenCounter;
  /** The byte estimate, for a caller falling back after a llama.cpp counting failure. */
  readonly fallback: TokenCounter;
  readonly cache: TokenCache;
  /** Ends the counting workers; call on shutdown. */
  close(): Promise<void>;
}

export function createCounters(opts: CountersOptions = {}): Counters {
  const cache =
    opts.cache ?? (opts.cacheBytes === undefined ? sharedTokenCache : new TokenCache(opts.cacheBytes));
  const fallback = new ByteEstimateCounter();
  // Workers start only when a large text first needs one.
  const pool = new CountPool({ size: opts.workers ?? 1 });
  const tiktoken = new Map<string, TiktokenCounter>();
  const llamacpp = new Map<string, LlamaCppCounter>();

  return {
    cache,
    fallback,
    close: () => pool.close(),
    counterFor(upstream, model) {
      // A llama.cpp server tokenizes with its own vocabulary whatever the model is called.
      if (upstream.kind === 'llamacpp') {
        let c = llamacpp.get(upstream.baseUrl);
        if (c === undefined) {
          const { dispatcher, baseUrl, apiKey } = upstream;
          c = new LlamaCppCounter({ dispatcher, baseUrl, apiKey, cache });
          llamacpp.set(upstream.baseUrl, c);
        }
        return c;
      }
      const encoding = encodingForModel(model);
      if (encoding === null) return fallback;
      let c = tiktoken.get(encoding);
      if (c === undefined) {
        c = new TiktokenCounter(encoding, { cache, pool });
        tiktoken.set(encoding, c);
      }
      return c;
    },
  };
}
