// The one table of Tollgate's error codes: status and OpenAI envelope type for each (SPEC §6).
// test/errors-documented.test.ts checks that every code here is in the README's error table.

export const ERRORS = {
  invalid_json: { status: 400, type: 'invalid_request_error' },
  invalid_request: { status: 400, type: 'invalid_request_error' },
  request_timeout: { status: 408, type: 'invalid_request_error' },
  missing_api_key: { status: 401, type: 'authentication_error' },
  invalid_api_key: { status: 401, type: 'authentication_error' },
  admin_token_required: { status: 401, type: 'authentication_error' },
  forbidden: { status: 403, type: 'permission_error' },
  not_found: { status: 404, type: 'not_found_error' },
  method_not_allowed: { status: 405, type: 'invalid_request_error' },
  model_not_found: { status: 404, type: 'invalid_request_error' },
  token_budget_exhausted: { status: 402, type: 'insufficient_quota' },
  conversation_cap_reached: { status: 402, type: 'insufficient_quota' },
  monthly_budget_reached: { status: 402, type: 'insufficient_quota' },
  model_not_priced: { status: 402, type: 'insufficient_quota' },
  concurrency_limit_reached: { status: 429, type: 'rate_limit_error' },
  body_too_large: { status: 413, type: 'invalid_request_error' },
  too_many_rows: { status: 413, type: 'invalid_request_error' },
  row_too_large: { status: 413, type: 'invalid_request_error' },
  request_tokens_exceeded: { status: 413, type: 'invalid_request_error' },
  context_window_exceeded: { status: 413, type: 'invalid_request_error' },
  internal_error: { status: 500, type: 'server_error' },
  upstream_unreachable: { status: 502, type: 'upstream_error' },
  upstream_bad_response: { status: 502, type: 'upstream_error' },
  upstream_timeout: { status: 504, type: 'upstream_error' },
  shutting_down: { status: 503, type: 'server_error' },
  ledger_unavailable: { status: 503, type: 'server_error' },
} as const satisfies Record<string, { status: number; type: string }>;

export type ErrorCode = keyof typeof ERRORS;

export type ErrorDetails = Record<string, unknown>;

export interface ErrorEnvelope {
  error: { message: string; type: string; param: string | null; code: string | number | null; [k: string]: unknown };
}

/** A refusal or failure on its way to the client: status + OpenAI envelope, details beside `message`. */
export class GatewayError extends Error {
  override name = 'GatewayError';
  readonly status: number;
  readonly type: string;
  /** What planning knew when it refused (row counts…): shown by /v1/admission, not in the envelope. */
  context: Record<string, unknown> = {};
  /**
   * What a log line says of this error when its message carries text the upstream wrote (which can
   * repeat the prompt: SPEC §10, prompt text is never logged by default). Null: the message itself.
   */
  logMessage: string | null = null;
  /**
   * A failure (5xx) the same request meets again however soon it is retried: said so with
   * `x-should-retry: false`, as a refusal is (the SDKs would retry it twice at once).
   */
  final = false;
  /**
   * A refusal that passes by itself (429): answered with `retry-after` in place of
   * `x-should-retry: false`, so the SDKs retry it with their back-off. Null: final.
   */
  retryAfterSeconds: number | null = null;

  constructor(
    readonly code: ErrorCode,
    message: string,
    readonly details: ErrorDetails = {},
    readonly param: string | null = null,
    options?: { cause?: unknown },
  ) {
    super(message, options);
    this.status = ERRORS[code].status;
    this.type = ERRORS[code].type;
  }

  toEnvelope(): ErrorEnvelope {
    return envelope(this.code, this.message, this.type, this.param, this.details);
  }
}

/** A request stopped by a gateway that could wait no longer for it to finish (server/main.ts); retryable. */
export function stoppedByShutdown(): GatewayError {
  return new GatewayError('shutting_down', 'the gateway is shutting down: the request was stopped before the model answered; send it again');
}

export function envelope(
  code: string | number | null,
  message: string,
  type: string,
  param: string | null = null,
  details: ErrorDetails = {},
): ErrorEnvelope {
  return { error: { message, type, param, code, ...details } };
}

/** Refusals are final: the OpenAI SDKs honour `x-should-retry` before their own retry rules. */
export const NO_RETRY_HEADERS = Object.freeze({ 'x-should-retry': 'false' });

/** An error whose message quotes the upstream: the client gets all of it, a log line only `logMessage`. */
export function quotingUpstream(err: GatewayError, logMessage: string): GatewayError {
  err.logMessage = logMessage;
  return err;
}
