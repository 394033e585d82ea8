// Stage 5 — forward (SPEC §2): the allowance made explicit so the upstream can never generate more
// than was reserved, usage forced on for streams, the client's credentials replaced by the
// upstream's, and only the client's headers that describe it and its call passed on (client-headers.ts).
// undici failures become typed 502/504 errors that keep their cause (as @fastify/reply-from does).

import type { IncomingHttpHeaders } from 'node:http';
import type { Dispatcher } from 'undici';
import { GatewayError } from '../errors.js';
import type { Plan } from './plan.js';
import { ENDPOINT_PATHS } from './endpoints.js';
import { errorEnvelopeOf, upstreamErrorIn } from './upstream-error-body.js';
import { clientHeaders } from './client-headers.js';

export function upstreamPath(plan: Plan): string {
  const { upstream } = plan;
  const endpoint = ENDPOINT_PATHS[plan.valid.kind];
  if (upstream.config.kind === 'llamacpp') {
    // llama.cpp serves its OpenAI routes under /v1 whatever the base URL says.
    return `${upstream.basePath.replace(/\/v1$/, '')}${endpoint}`;
  }
  // OpenAI convention: the base URL already ends with the version (https://api.openai.com/v1).
  return `${upstream.basePath}${endpoint.replace(/^\/v1/, '')}`;
}

/**
 * Where `max_completion_tokens` is read: OpenAI's own API (`api.openai.com`, `eu.api.openai.com`)
 * for every model; Azure's OpenAI and AI Foundry hosts for OpenAI's models only (Foundry also
 * serves Mistral, Llama and DeepSeek, through an API that reads `max_tokens`).
 */
function readsCompletionTokens(origin: string, model: string): boolean {
  const host = origin.slice(origin.indexOf('//') + 2).replace(/:\d+$/, '').toLowerCase();
  if (host === 'api.openai.com' || host.endsWith('.api.openai.com')) return true;
  const azure = /\.(openai|cognitiveservices)\.azure\.com$/.test(host) || host.endsWith('.services.ai.azure.com');
  return azure && /^(gpt-|o\d|chatgpt-)/.test(model.toLowerCase());
}

/**
 * OpenAI's reasoning models by their bare name (o1, o3-mini, o4-mini, gpt-5…), which refuse
 * `max_tokens` wherever they are reached under that name (a gateway or proxy in front of OpenAI).
 * A vendor-prefixed name (`openai/o3`) is a router's, which takes `max_tokens` and translates it.
 */
function isOpenAiReasoningModel(model: string): boolean {
  return /^(o\d+(-|$)|gpt-5)/.test(model.toLowerCase());
}

/**
 * The field the allowance travels in. llama.cpp reads `n_predict`, else `max_tokens`; it has no
 * `max_completion_tokens`, so a client's `max_completion_tokens` reaches it as `max_tokens` (the
 * recorded props list only those two). Completions have only `max_tokens`. A chat request to an
 * upstream configured with `allowanceField` gets that one; otherwise the client's own field; when
 * it named none, `max_completion_tokens` at OpenAI itself or for an OpenAI reasoning model, and
 * `max_tokens` elsewhere: many OpenAI-compatible servers do not know the newer name — Mistral
 * refuses the request (422), Ollama ignores it and generates on.
 */
export function allowanceFieldOf(plan: Pick<Plan, 'upstream' | 'valid'>): 'max_tokens' | 'max_completion_tokens' {
  const { config, origin } = plan.upstream;
  if (config.kind === 'llamacpp' || plan.valid.kind !== 'chat') return 'max_tokens';
  if (config.allowanceField !== null) return config.allowanceField;
  if (plan.valid.maxTokensField) return plan.valid.maxTokensField;
  return readsCompletionTokens(origin, plan.valid.model) || isOpenAiReasoningModel(plan.valid.model) ? 'max_completion_tokens' : 'max_tokens';
}

export function upstreamBody(plan: Plan): Record<string, unknown> {
  const body: Record<string, unknown> = { ...plan.forwardBody };
  if (plan.valid.kind !== 'embeddings') {
    const field = allowanceFieldOf(plan);
    delete body.n_predict;
    delete body.max_tokens;
    delete body.max_completion_tokens;
    body[field] = plan.perChoiceAllowance;
  }
  if (plan.valid.stream) {
    const so = typeof body.stream_options === 'object' && body.stream_options !== null ? body.stream_options : {};
    body.stream_options = { ...so, include_usage: true };
  }
  return body;
}

const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'UND_ERR_CONNECT_TIMEOUT']);

export function upstreamError(err: unknown, upstream: string): GatewayError {
  const code = (err as { code?: string }).code ?? '';
  if (TIMEOUT_CODES.has(code)) {
    return new GatewayError('upstream_timeout', `upstream "${upstream}" did not answer in time (${code})`, { upstream }, null, { cause: err });
  }
  const reason = err instanceof Error ? err.message : String(err);
  return new GatewayError('upstream_unreachable', `upstream "${upstream}" could not be reached: ${reason}`, { upstream }, null, { cause: err });
}

/** An upstream answered, but with nothing usable: named like the other upstream failures. */
export function badUpstreamResponse(upstream: string, what: string, cause?: unknown): GatewayError {
  return new GatewayError('upstream_bad_response', `upstream "${upstream}" ${what}`, { upstream }, null, cause === undefined ? undefined : { cause });
}

/** The same failure said inside a stream already under way (an SSE `error` event's object). */
export function badUpstreamStream(upstream: string, what: string): Record<string, unknown> {
  return badUpstreamResponse(upstream, what).toEnvelope().error;
}

export async function forward(plan: Plan, signal: AbortSignal, fromClient: IncomingHttpHeaders = {}): Promise<Dispatcher.ResponseData> {
  const { upstream } = plan;
  const headers: Record<string, string> = {
    ...clientHeaders(fromClient),
    'content-type': 'application/json',
    accept: plan.valid.stream ? 'text/event-stream' : 'application/json',
    // The gateway reads the answer as it comes, to meter it: a compressed one it could not read.
    'accept-encoding': 'identity',
    'x-request-id': plan.id,
  };
  if (upstream.apiKey) headers.authorization = `Bearer ${upstream.apiKey}`;
  try {
    return await upstream.dispatcher.request({
      origin: upstream.origin,
      path: upstreamPath(plan),
      method: 'POST',
      headers,
      body: JSON.stringify(upstreamBody(plan)),
      signal,
    });
  } catch (err) {
    if (signal.aborted) throw err;
    throw upstreamError(err, upstream.name);
  }
}

/**
 * An upstream error body in the OpenAI envelope, from whatever shape the server wrote
 * (upstream-error-body.ts); llama.cpp's numeric `code` is normalised. A body that is no error
 * object at all (HTML, plain text) becomes an `upstream_error` naming the upstream, its text the
 * message.
 */
export function normaliseUpstreamError(status: number, text: string, upstream: string): Record<string, unknown> {
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    parsed = null;
  }
  const e = upstreamErrorIn(parsed);
  if (e !== null && (e.message !== '' || e.type !== undefined)) return errorEnvelopeOf(e, upstream, `upstream answered ${status}`);
  const message = text.slice(0, 2000) || `upstream answered ${status}`;
  return { error: { message, type: 'upstream_error', param: null, code: 'upstream_error', upstream } };
}

/**
 * An upstream's refusal of a prompt past its context window, in the words servers use: llama.cpp's
 * `exceed_context_size_error` (fixtures/llamacpp: error-context-overflow-chat), OpenAI's
 * `context_length_exceeded`, and the "maximum context length" vLLM and others write.
 */
export function isContextOverflow(status: number, body: Record<string, unknown>): boolean {
  if (status !== 400 && status !== 413) return false;
  const error = body.error as { message?: unknown; type?: unknown; code?: unknown } | undefined;
  if (error === undefined) return false;
  if (error.type === 'exceed_context_size_error' || error.code === 'exceed_context_size_error' || error.code === 'context_length_exceeded') return true;
  return typeof error.message === 'string' && /maximum context length|exceeds the available context size/i.test(error.message);
}

/** The window a context refusal names: llama.cpp's `n_ctx`, or "maximum context length is N tokens". */
export function windowInOverflow(body: Record<string, unknown>): number | null {
  const error = body.error as { message?: unknown; n_ctx?: unknown } | undefined;
  if (typeof error?.n_ctx === 'number' && Number.isSafeInteger(error.n_ctx) && error.n_ctx > 0) return error.n_ctx;
  const said = typeof error?.message === 'string' ? /maximum context length is (\d{1,9}) tokens/i.exec(error.message) : null;
  return said ? Number(said[1]) : null;
}

/**
 * An upstream error that the same request will meet again, from a llama.cpp server: its 500 for an
 * embeddings input past its physical batch size (fixtures/llamacpp: emb-error-embeddings-overflow),
 * and its 501 for what it was not started to do (error-embeddings-not-enabled). They keep their
 * status, but the SDKs are told not to retry them (they retry every 5xx twice).
 */
export function upstreamErrorIsFinal(kind: 'openai' | 'llamacpp', status: number, body: Record<string, unknown>): boolean {
  if (kind !== 'llamacpp') return false;
  const error = body.error as { message?: unknown; type?: unknown } | undefined;
  if (status === 501 && error?.type === 'not_supported_error') return true;
  return status === 500 && typeof error?.message === 'string' && /is too large to process\. increase the physical batch size/.test(error.message);
}
