// Where an OpenAI-compatible server puts its error. OpenAI writes `{"error": {message, type, param,
// code}}`; others do not all follow it: vLLM and Mistral write that object at the top level with
// `"object": "error"` (Mistral's `message` can itself be an object), LM Studio and TGI write
// `{"error": "text"}`, FastAPI-based servers `{"detail": …}`. A body of any of these shapes is an
// error, whatever status came with it.

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/**
 * The error object an upstream's body carries, as `{message, …its other fields}` with `message` a
 * string; null when the body is no error (or not an object). Only the shapes above are read: a body
 * with choices or data is an answer, whatever else it has — but for a choice finished with "error".
 */
export function upstreamErrorIn(body: unknown): Json | null {
  if (!isObject(body)) return null;
  const { error } = body;
  // OpenRouter says a failure part way beside the choice it ended, with `finish_reason: "error"`.
  if (isObject(error) && Array.isArray(body.choices) && body.choices.some((c) => isObject(c) && c.finish_reason === 'error')) {
    return { ...error, message: messageText(error.message) };
  }
  if (Array.isArray(body.choices) || Array.isArray(body.data)) return null;
  if (isObject(error)) return { ...error, message: messageText(error.message) };
  if (typeof error === 'string') return { message: error };
  if (body.object === 'error') {
    const { object: _o, ...rest } = body;
    return { ...rest, message: messageText(rest.message) };
  }
  if (body.detail !== undefined && Object.keys(body).length === 1) return { message: messageText(body.detail) };
  return null;
}

/**
 * The error a stream's event carries: in a stream an error object is an error wherever it stands
 * (OpenAI's and OpenRouter's mid-stream failures), else the shapes `upstreamErrorIn` reads.
 */
export function streamErrorIn(event: Json): Json | null {
  return isObject(event.error) ? { ...event.error, message: messageText(event.error.message) } : upstreamErrorIn(event);
}

/** A message as text: a string as it is, anything else as its JSON (Mistral's validation details). */
function messageText(v: unknown): string {
  if (typeof v === 'string') return v;
  return v === undefined || v === null ? '' : JSON.stringify(v);
}

/**
 * An upstream's error object in the OpenAI envelope, the same for an error status, a 200 and a
 * stream's error event. Its fields are kept; `message` is text (`fallback` when it had none);
 * `param` a string or null. A numeric `code` (llama.cpp and vLLM send the HTTP status there) gives
 * way to the error's `type`, the useful code; a provider's own `null`, or none, stays null. An
 * error that names no type (`{"error": "text"}`, OpenRouter's stream errors) is an
 * `upstream_error` naming its upstream, with its own code if it has one.
 */
export function errorEnvelopeOf(e: Json, upstream: string, fallback = 'the upstream failed'): { error: Json } {
  const message = typeof e.message === 'string' && e.message !== '' ? e.message : e.message !== undefined && e.message !== null && e.message !== '' ? JSON.stringify(e.message) : fallback;
  const param = typeof e.param === 'string' ? e.param : null;
  if (typeof e.type !== 'string') {
    return { error: { ...e, message, type: 'upstream_error', param, code: typeof e.code === 'string' ? e.code : 'upstream_error', upstream } };
  }
  const code = typeof e.code === 'string' || e.code === null || e.code === undefined ? (e.code ?? null) : e.type;
  return { error: { ...e, message, param, code } };
}
