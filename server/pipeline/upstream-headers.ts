// The upstream's response headers a client acts on, passed on with its answer: its request id (the
// SDKs show it as `_request_id`), its processing time (`openai-processing-ms`), its rate-limit
// state, and its retry advice — an upstream 429 or 408 must stay retryable with the backoff the
// provider asked for. Everything else the upstream sent stays behind: the gateway writes its own
// framing and metering headers.

import type { IncomingHttpHeaders } from 'node:http';
import { redactText } from './upstream-key.js';

const PASSED = new Set(['x-request-id', 'retry-after', 'retry-after-ms', 'x-should-retry', 'openai-processing-ms', 'ratelimit', 'ratelimit-policy']);

/** Rate-limit state by prefix: OpenAI's, Anthropic's (its OpenAI-compatible API), the IETF draft's. */
const PASSED_PREFIXES = ['x-ratelimit-', 'anthropic-ratelimit-', 'ratelimit-'];

export function upstreamHeaders(headers: IncomingHttpHeaders, upstreamKey: string | null = null): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined) continue;
    // The upstream's own key, echoed into a header, stays behind (upstream-key.ts).
    if (PASSED.has(name) || PASSED_PREFIXES.some((p) => name.startsWith(p))) out[name] = redactText(Array.isArray(value) ? value.join(', ') : value, upstreamKey);
  }
  return out;
}
