// The client's headers that go on to the upstream (SPEC §2: the client's auth replaced by the
// upstream's key, hop-by-hop headers dropped). A list of those passed, not of those kept back: the
// upstream may be a router or an AI gateway that reads headers of its own to choose the provider,
// the model, the account billed or the cache (Portkey's `x-portkey-config`, Cloudflare's
// `cf-aig-*`, Vertex's `x-goog-user-project`, any `*api-key`), and a client that could send those
// would choose what the gateway meters as if the configuration had (an outside review of a first
// version that passed everything but a list found a dozen such names). What is passed describes
// the client and its call, and changes neither where it goes nor who pays:
// - `openai-beta` (the API features a call opts into), `user-agent` and the OpenAI SDKs'
//   `x-stainless-*` (their version, runtime and retry count);
// - an app's attribution for a router (`http-referer`, `x-title`);
// - tracing (`traceparent`, `tracestate`, OpenAI's `x-client-request-id`);
// - `idempotency-key` and `accept-language`.
// Credentials, cookies, the client's address, hop-by-hop and framing headers (the gateway writes
// the body anew and reads the answer whole and uncompressed), and `x-tollgate-*` never are.

import type { IncomingHttpHeaders } from 'node:http';

const PASSED = new Set(['openai-beta', 'user-agent', 'http-referer', 'x-title', 'traceparent', 'tracestate', 'x-client-request-id', 'idempotency-key', 'accept-language']);
const PASSED_PREFIXES = ['x-stainless-'];

export function clientHeaders(headers: IncomingHttpHeaders): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || !(PASSED.has(name) || PASSED_PREFIXES.some((p) => name.startsWith(p)))) continue;
    out[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}
