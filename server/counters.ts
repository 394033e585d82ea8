// The gateway's view of counting: which counter a request's model uses on its upstream, the byte
// estimate to fall back on, and each model's context window (configured, else learnt from a
// llama.cpp server's /props and refreshed now and then, since a server can be restarted with
// another -c / --parallel).

import type { Config } from './config.js';
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import type { Upstream, UpstreamRegistry } from './upstreams.js';
import type { TokenCounter } from '../metering/types.js';
import { createCounters, encodingForModel, fetchServerProps, MODEL_PREFIXES, type ServerProps } from '../metering/tokenizers/index.js';
import type { TokenCache } from '../metering/token-cache.js';

const WINDOW_REFRESH_MS = 60_000;
/**
 * How long a llama.cpp server's /props may take (it is a few settings, answered at once even while
 * the server generates): past it the window is unknown for now. Without a bound of its own it
 * waited on the upstream's `timeoutMs` (10 minutes by default) — `/v1/models`, every request's
 * plan and a stopping gateway's drain with it.
 */
export const PROPS_TIMEOUT_MS = 5_000;
/** After /props failed, how long the last known answer (or none) stands before it is asked again. */
const PROPS_RETRY_MS = 10_000;

export interface Counters {
  forModel(upstream: Upstream, model: string): TokenCounter;
  readonly estimate: TokenCounter;
  readonly cache: TokenCache;
  contextWindow(upstream: Upstream, model: string): Promise<number | null>;
  /** The model name a llama.cpp server reports serving (its /props, learnt with the window); else null. */
  servedModel(upstream: Upstream): Promise<string | null>;
  /** Ends the tokenizer worker threads (ADR 0009); the app calls it on close. */
  close(): Promise<void>;
}

/**
 * @param now a monotonic clock (ms) for the refresh: the wall clock stepped back would keep a
 *   server's window, learnt before a restart with another -c, for as long as the step.
 */
export function gatewayCounters(config: Config, now: () => number = () => performance.now(), propsTimeoutMs = PROPS_TIMEOUT_MS): Counters {
  const inner = createCounters({ cacheBytes: config.tokenCache.maxBytes, workers: config.tokenCache.workers });
  const learnt = new Map<string, { props: ServerProps | null; at: number; failed: boolean }>();
  // One question at a time per server: requests planned while it is asked wait for that answer.
  const asking = new Map<string, Promise<ServerProps | null>>();
  /** A llama.cpp server's /props, refreshed now and then; the last known (or nothing) if it is down. */
  const propsOf = (upstream: Upstream): Promise<ServerProps | null> => {
    const at = now();
    const known = learnt.get(upstream.name);
    if (known && at - known.at < (known.failed ? PROPS_RETRY_MS : WINDOW_REFRESH_MS)) return Promise.resolve(known.props);
    let answer = asking.get(upstream.name);
    if (answer === undefined) {
      const signal = AbortSignal.timeout(propsTimeoutMs);
      answer = fetchServerProps(upstream.dispatcher, upstream.config.baseUrl, { refresh: true, apiKey: upstream.apiKey ?? undefined, signal })
        .then(
          (props) => {
            learnt.set(upstream.name, { props, at, failed: false });
            return props;
          },
          () => {
            // Unknown is null, never a guess; the server's own 400 still guards its window.
            const props = known?.props ?? null;
            learnt.set(upstream.name, { props, at: now(), failed: true });
            return props;
          },
        )
        .finally(() => asking.delete(upstream.name));
      asking.set(upstream.name, answer);
    }
    return answer;
  };
  const ref = (u: Upstream) => ({ kind: u.config.kind, baseUrl: u.config.baseUrl, dispatcher: u.dispatcher, apiKey: u.apiKey ?? undefined });
  return {
    estimate: inner.fallback,
    cache: inner.cache,
    close: () => inner.close(),
    forModel: (upstream, model) => inner.counterFor(ref(upstream), model),
    async contextWindow(upstream) {
      if (upstream.config.contextWindow !== null) return upstream.config.contextWindow;
      if (upstream.config.kind !== 'llamacpp') return null;
      return (await propsOf(upstream))?.contextWindow ?? null;
    },
    async servedModel(upstream) {
      if (upstream.config.kind !== 'llamacpp') return null;
      return (await propsOf(upstream))?.modelAlias ?? null;
    },
  };
}

/**
 * The tiktoken encodings that requests to the configured OpenAI-kind upstreams can need: the
 * encoding of each model family (a name prefix, `gpt-4o`) whose models route to such an upstream,
 * and of each exact model name configured for one. Loaded at start (server/main.ts), so the first
 * request of a family does not wait half a second for its encoding.
 */
export function encodingsServed(upstreams: UpstreamRegistry): TiktokenEncoding[] {
  const openai = (u: Upstream | null) => u !== null && u.config.kind === 'openai';
  const out = new Set<TiktokenEncoding>();
  for (const [prefix, encoding] of MODEL_PREFIXES) {
    // A few names of the family: `gpt-4o*` routes `gpt-4o-mini` though not `gpt-4o` itself.
    if ([prefix, `${prefix}x`, `${prefix}-x`].some((name) => openai(upstreams.route(name)))) out.add(encoding);
  }
  for (const { model, upstream } of upstreams.namedModels()) {
    const encoding = openai(upstream) ? encodingForModel(model) : null;
    if (encoding !== null) out.add(encoding);
  }
  return [...out];
}
