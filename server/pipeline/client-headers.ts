// The client's own headers go on to the upstream (SPEC §2: the client's auth replaced by the
// upstream's key, hop-by-hop headers dropped) — `openai-beta`, `user-agent`, the SDK's
// `x-stainless-*`, a router's `http-referer` and `x-title` — but for what the gateway owns:
// - credentials, and the headers that choose whose account pays: the upstream's key is the
//   gateway's, so the client may not pick its OpenAI organization or project, nor send a key of
//   its own in another header (Azure's `api-key`, Anthropic's `x-api-key`, Google's
//   `x-goog-api-key`: a turn the provider billed elsewhere, metered here);
//   cookies, which are the client's with the gateway, not with the provider;
// - where the request came from (`forwarded`, `x-forwarded-*`, `x-real-ip`): the gateway is the
//   provider's client, and its own clients' addresses are not the provider's business;
// - hop-by-hop headers (RFC 9110 §7.6.1), and any the client's `connection` names;
// - the framing the gateway writes itself: the body is written anew (its type, length and
//   encoding), the answer must come whole and uncompressed to be metered (no ranges, no
//   conditions that could answer 206, 304 or 412), and the request id is the gateway's;
// - the gateway's own `x-tollgate-*` headers.

import type { IncomingHttpHeaders } from 'node:http';

const DROPPED = new Set([
  'authorization',
  'proxy-authorization',
  'openai-organization',
  'openai-project',
  'cookie',
  'connection',
  'keep-alive',
  'proxy-connection',
  'te',
  'trailer',
  'transfer-encoding',
  'upgrade',
  'http2-settings',
  'host',
  'content-length',
  'content-type',
  'content-encoding',
  'expect',
  'accept',
  'accept-encoding',
  'x-request-id',
  'forwarded',
  'x-real-ip',
  'range',
  'if-range',
  'if-match',
  'if-none-match',
  'if-modified-since',
  'if-unmodified-since',
]);

/** A key in a header of its own: `api-key`, `x-api-key`, `x-goog-api-key`, … */
const KEY_HEADER = /(^|-)api-?key$/;

export function clientHeaders(headers: IncomingHttpHeaders): Record<string, string> {
  const named = typeof headers.connection === 'string' ? headers.connection.toLowerCase().split(',').map((s) => s.trim()) : [];
  const out: Record<string, string> = {};
  for (const [name, value] of Object.entries(headers)) {
    if (value === undefined || DROPPED.has(name) || KEY_HEADER.test(name) || name.startsWith('x-tollgate-') || name.startsWith('x-forwarded-') || named.includes(name)) continue;
    out[name] = Array.isArray(value) ? value.join(', ') : value;
  }
  return out;
}
