// Upstreams: one undici Pool each, created at start and closed at shutdown (STYLE §6). A request's
// `model` picks its upstream from configuration only — never from anything else in the request.

import { Pool, type Dispatcher } from 'undici';
import type { Billing, Config, UpstreamConfig } from './config.js';
import { hashOnce } from '../metering/hash-once.js';

export interface Upstream {
  readonly config: UpstreamConfig;
  readonly name: string;
  /** Origin (scheme://host:port) the pool connects to. */
  readonly origin: string;
  /** Path prefix of the base URL (`/v1` for https://api.openai.com/v1, '' for llama.cpp). */
  readonly basePath: string;
  /** The server behind it, as a conversation's head records it (`serverIdOf`; ADR 0004). */
  readonly serverId: string;
  readonly dispatcher: Dispatcher;
  readonly billing: Billing;
  /** The upstream's key, read from `apiKeyEnv` at start. Never logged. */
  readonly apiKey: string | null;
}

/**
 * Which server holds a prompt cache: the upstream's kind and its base URL as requests use it
 * (origin + path, so `http://Host:80/` and `http://host` are one server), not its name — a renamed
 * upstream still talks to the same cache (ADR 0004). A short digest: a fixed 16 characters in every
 * head row, however long the URL. Heads keep it, so the form must never change: a changed form
 * would cost every open conversation one full charge.
 */
export function serverIdOf(kind: UpstreamConfig['kind'], origin: string, basePath: string): string {
  return hashOnce('sha256', `${kind} ${origin}${basePath}`, 'base64url').slice(0, 16);
}

/** `gpt-*` → /^gpt-.*$/ ; only `*` and `?` are special. */
export function globToRegExp(glob: string): RegExp {
  const body = glob.replace(/[.+^${}()|[\]\\]/g, '\\$&').replace(/\*/g, '.*').replace(/\?/g, '.');
  return new RegExp(`^${body}$`);
}

export class UpstreamRegistry {
  readonly list: Upstream[];
  private readonly matchers: Array<{ pattern: string; re: RegExp; exact: boolean; literal: number; upstream: Upstream }>;

  constructor(config: Config, env: NodeJS.ProcessEnv = process.env, dispatcherFor?: (u: UpstreamConfig) => Dispatcher) {
    this.list = config.upstreams.map((u) => {
      const url = new URL(u.baseUrl);
      const basePath = url.pathname.replace(/\/+$/, '');
      return {
        config: u,
        name: u.name,
        origin: url.origin,
        basePath,
        serverId: serverIdOf(u.kind, url.origin, basePath),
        dispatcher:
          dispatcherFor?.(u) ??
          new Pool(url.origin, {
            connections: u.connections,
            keepAliveTimeout: 4_000,
            headersTimeout: u.timeoutMs,
            bodyTimeout: u.timeoutMs,
          }),
        billing: u.billing,
        apiKey: u.apiKeyEnv ? (env[u.apiKeyEnv] ?? null) : null,
      };
    });
    // The most specific entry wins: an exact name, then the pattern with the most literal
    // characters (`gpt-4o*` over `gpt-*` over `*`), then config order. So a catch-all `*` upstream
    // can sit anywhere in the list, as in SPEC §8's example, without taking `gpt-*` from another.
    const matchers = this.list.flatMap((upstream) =>
      upstream.config.models.map((m) => ({ pattern: m, re: globToRegExp(m), exact: !/[*?]/.test(m), literal: m.replace(/[*?]/g, '').length, upstream })),
    );
    // Array.prototype.sort is stable: equal specificity keeps config order.
    this.matchers = matchers.sort((a, b) => Number(b.exact) - Number(a.exact) || b.literal - a.literal);
  }

  route(model: string): Upstream | null {
    return this.matchers.find((m) => m.re.test(model))?.upstream ?? null;
  }

  /**
   * Model entries that never route to their upstream: one that an entry as specific and earlier in
   * the config already has — the same name, or the same pattern. (Narrower overlaps route by
   * specificity, and both upstreams serve something.)
   */
  shadowed(): Array<{ upstream: Upstream; model: string; takenBy: Upstream }> {
    const out: Array<{ upstream: Upstream; model: string; takenBy: Upstream }> = [];
    for (const [at, m] of this.matchers.entries()) {
      const first = this.matchers.findIndex((other) => other.pattern === m.pattern);
      if (first < at && this.matchers[first]!.upstream !== m.upstream) out.push({ upstream: m.upstream, model: m.pattern, takenBy: this.matchers[first]!.upstream });
    }
    return out;
  }

  /** Exact (non-pattern) model names configured, with their upstream. */
  namedModels(): Array<{ model: string; upstream: Upstream }> {
    return this.matchers.filter((m) => m.exact).map((m) => ({ model: m.pattern, upstream: m.upstream }));
  }

  async close(): Promise<void> {
    await Promise.allSettled(this.list.map((u) => u.dispatcher.close()));
  }
}
