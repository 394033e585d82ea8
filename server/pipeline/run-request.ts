// The one request pipeline every proxied endpoint shares (ADR 0001):
//   parse → plan → admit → forward → relay → settle
// Routes only say which endpoint they are; everything else happens here, in this order.

import { performance } from 'node:perf_hooks';
import type { FastifyReply, FastifyRequest } from 'fastify';
import type { Dispatcher } from 'undici';
import type { Gateway } from '../gateway.js';
import { GatewayError, envelope, quotingUpstream, stoppedByShutdown } from '../errors.js';
import { upstreamHeaders } from './upstream-headers.js';
import { redactBodyText, redactText } from './upstream-key.js';
import { validateRequest, type EndpointKind } from './endpoints.js';
import { answersInstead, planHeaders, type Plan } from './plan.js';
import { planRequest } from './plan-exact.js';
import { admit } from './admit.js';
import { badUpstreamResponse, forward, isContextOverflow, normaliseUpstreamError, upstreamError, upstreamErrorIsFinal, windowInOverflow } from './forward.js';
import { relayJson, readText } from './relay-json.js';
import { relayStream } from './relay-stream.js';
import { OutputMeter } from './output-meter.js';
import { admissionHeaders, closingComment, NOTHING_USED, sendAsStream, sendFallback, settledHeaders, usageChunkFigures } from './answer-figures.js';
import { countAnswer, echoOf, outputCounting } from './count-answer.js';
import { settle as settleOutcome, pricierFor, providerOutputTrusted, usageUnderReported, type Outcome, type Settled } from './settle.js';
import { sseData } from './sse.js';
import { noticeHeader } from '../../metering/runs/final-answer.js';
import { evidenceExcerpt, excerptAsRefusal, excerptStreamChunks } from '../../metering/runs/evidence-excerpt.js';
import { clientPrincipal } from '../auth-hooks.js';
import { slotFor } from '../key-slots.js';
import type { Principal } from '../auth.js';

export async function handleProxy(gw: Gateway, kind: EndpointKind, request: FastifyRequest, reply: FastifyReply): Promise<void> {
  const t0 = performance.now();
  request.pipelineStart = t0;
  // SPEC §2's order: a malformed body is a 400 whoever sends it; then the key is checked. (A large
  // body whose key had already failed was not kept: its 401 is all there is to say.)
  if (request.bodyUnread) {
    await clientPrincipal(request);
    // Its key passed, but had no slot free as the body arrived, which was then not kept: the 429.
    const slot = request.keySlot;
    if (slot && 'refused' in slot) throw slot.refused;
  }
  const valid = validateRequest(kind, request.body);
  request.routedModel = valid.model;
  const principal = await clientPrincipal(request);
  request.principal = principal;
  // One of the key's slots for the whole request, planning included (429 when none is free): taken
  // as its body arrived, or now.
  const giveBack = slotFor(request, principal);
  try {
    await planAndRelay(gw, kind, request, reply, valid, principal, t0);
  } finally {
    giveBack();
  }
}

/** Stages 2–7 for a parsed request of a known client. */
async function planAndRelay(
  gw: Gateway,
  kind: EndpointKind,
  request: FastifyRequest,
  reply: FastifyReply,
  valid: ReturnType<typeof validateRequest>,
  principal: Principal,
  t0: number,
): Promise<void> {
  const headers = planHeaders(request.raw);
  // A research round the upstream refused for its context window (one the gateway did not know, or
  // counted under) is planned once more, as its final answer (seed 001: a run ends in an answer);
  // its first attempt is refunded.
  let outgrown: Outgrown | undefined;
  for (;;) {
    const planOnce = () => planRequest(gw, valid, principal, headers, outgrown ? { outgrown } : {});
    let plan: Plan;
    try {
      plan = await admit(gw, await planOnce(), planOnce);
    } catch (err) {
      // The answer was refused in its turn: the first attempt is said on a line of its own.
      if (outgrown) request.log.info({ ...outgrown.attempt }, 'the upstream refused a research round for its context window: its final answer was not sent');
      throw err;
    }
    const ended = await relayPlan(gw, kind, request, reply, plan, t0, outgrown);
    if (!ended || outgrown) return;
    outgrown = ended;
    // Its time at the upstream is the request's too, not the gateway's (overhead, whichever line says it).
    request.upstreamMsBefore = ended.attempt.upstream_ms;
  }
}

/** Stages 5–7 for an admitted plan, settled whatever happens. */
async function relayPlan(gw: Gateway, kind: EndpointKind, request: FastifyRequest, reply: FastifyReply, plan: Plan, t0: number, prior?: Outgrown): Promise<Outgrown | void> {
  // From here the request holds a reservation: whatever happens, it is settled before the error
  // leaves (else it would stay reserved until a restart charged it in full).
  const once: Once = { settling: false, log: null };
  // A client that goes away aborts the upstream at once; so does a stopping gateway that can wait
  // no longer (server/main.ts) — what was generated is settled either way.
  const abort = new AbortController();
  const onDrain = () => abort.abort(SHUTTING_DOWN);
  gw.drain.signal.addEventListener('abort', onDrain, { once: true });
  // Admitted after the deadline (the ledger was slow): stopped before it is sent, refunded whole.
  if (gw.drain.signal.aborted) onDrain();
  try {
    return await relayAdmitted(gw, kind, request, reply, plan, t0, once, abort, prior);
  } catch (caught) {
    const err = abort.signal.reason === SHUTTING_DOWN && !(caught instanceof GatewayError) ? stoppedByShutdown() : caught;
    if (!once.settling) {
      // A client that went away while the model worked pays for the prompt it read (499), as at
      // forwarding; anything else that ended the request here refunds it all.
      const clientGone = abort.signal.aborted && abort.signal.reason !== SHUTTING_DOWN;
      const status = clientGone ? 499 : err instanceof GatewayError ? err.status : 500;
      const settled = await settleOutcome(gw, plan, { status, countedOutput: 0, countedMethod: 'none', usage: null, timings: null, fallback: false, refundAll: !clientGone }).catch(
        (e: unknown) => {
          request.log.error({ err: e, id: plan.id }, 'settling after an error failed: the reservation stays open until recovered');
          return null;
        },
      );
      // Its one line and count, as every admitted request has (a client that left part way through
      // a JSON answer ends here).
      if (!request.settledLogged) once.log?.(status, clientGone ? undefined : err, settled);
    }
    // A stream the gateway had taken over from Fastify must be ended here: nothing else would.
    if (reply.sent) return endTakenOver(request, reply, err);
    throw err;
  } finally {
    gw.drain.signal.removeEventListener('abort', onDrain);
  }
}

/**
 * A request that failed after its response was taken over from Fastify (`reply.hijack()`, for a
 * stream): the error handler cannot answer it, so it is ended here — an error envelope if nothing
 * was sent yet, else an error event and `[DONE]`, on which the OpenAI SDKs throw — and logged.
 */
function endTakenOver(request: FastifyRequest, reply: FastifyReply, err: unknown): void {
  const raw = reply.raw;
  const known = err instanceof GatewayError;
  const body = known ? err.toEnvelope() : envelope('internal_error', 'internal error in the gateway', 'server_error');
  if (!raw.destroyed && !raw.writableEnded) {
    if (raw.headersSent) raw.end(`${sseData(body)}data: [DONE]\n\n`);
    else raw.writeHead(known ? err.status : 500, { 'content-type': 'application/json; charset=utf-8' }).end(JSON.stringify(body));
  }
  if (!request.settledLogged) {
    request.settledLogged = true;
    request.log.error({ err, status: known ? err.status : 500 }, 'request failed after its response began');
  }
}

/** A research round the upstream refused for its context: planned again as its final answer, in the window the refusal named (if any). */
type Outgrown = {
  contextWindow: number | null;
  /** What the refused attempt's own line would have said. */
  attempt: { id: string; upstream: string; status: number; upstream_ms: number; refund_tokens: number | null };
};

/** Set when settlement begins; `log` writes the request's one line, once the stages have made it. */
interface Once {
  settling: boolean;
  log: ((status: number, failure?: unknown, settled?: Settled | null) => void) | null;
}

/** The abort reason of a request stopped because the gateway is shutting down. */
const SHUTTING_DOWN = Symbol('shutting down');

/** Stages 5–7 for an admitted plan: forward, relay, settle. `once.settling` is set when settlement begins. */
async function relayAdmitted(
  gw: Gateway,
  kind: EndpointKind,
  request: FastifyRequest,
  reply: FastifyReply,
  plan: Plan,
  t0: number,
  once: Once,
  abort: AbortController,
  prior?: Outgrown,
): Promise<Outgrown | void> {
  const settle: typeof settleOutcome = (...args) => {
    once.settling = true;
    return settleOutcome(...args);
  };
  const m = gw.metrics;
  // A final answer that is the excerpt alone sends no model anything: no prompt to count.
  if (!plan.excerptOnly) {
    m.promptTokens.inc({ kind: 'new' }, plan.promptCharge);
    m.promptTokens.inc({ kind: 'shared' }, plan.rows.sumTokens - plan.promptCharge);
  }
  m.outputTokens.inc({ kind: 'reserved' }, plan.allowance);
  const notices: string[] = [];
  if (plan.mode === 'final-answer' && plan.finalReason) {
    notices.push(noticeHeader(plan.finalReason));
    m.finalAnswer.inc({ reason: plan.finalReason });
  }
  const pricier = pricierFor(gw, plan);
  if (pricier) notices.push(pricier);

  const draining = () => abort.signal.reason === SHUTTING_DOWN;
  const onClose = () => {
    if (!reply.raw.writableFinished) abort.abort();
  };
  reply.raw.on('close', onClose);
  // A client that left while the request was planned and admitted has already closed: its
  // request is not sent at all.
  if (reply.raw.destroyed) abort.abort();

  const counter = gw.counters.forModel(plan.upstream, plan.model);
  const tForward = performance.now();
  let upstreamMs = 0;
  let upstreamCalled = false;
  let outcome: Outcome;
  let settled: Settled | null = null;
  // The request's one log line (SPEC §10); a failure the client is answered with rides on it, at warn.
  const finishLog = (status: number, failure?: unknown, settledElsewhere?: Settled | null) => {
    request.settledLogged = true;
    if (settledElsewhere !== undefined) settled = settledElsewhere;
    if (upstreamCalled && upstreamMs === 0) upstreamMs = performance.now() - tForward;
    const total = performance.now() - t0;
    const before = request.upstreamMsBefore ?? 0;
    const overhead = Math.max(0, total - upstreamMs - before) / 1000;
    m.overhead.observe({ route: kind }, overhead);
    // Only a request some upstream was sent has an upstream duration.
    if (upstreamCalled) m.upstreamDuration.observe({ upstream: plan.upstream.name }, upstreamMs / 1000);
    m.requests.inc({ route: kind, upstream: plan.upstream.name, status: String(status) });
    const failed =
      failure === undefined
        ? null
        : failure instanceof GatewayError
          ? { code: failure.code, err: gw.config.logging.prompts ? failure.message : (failure.logMessage ?? failure.message) }
          : isLogFailure(failure)
            ? { code: failure.code, err: failure.message }
            : { err: (failure as Error)?.message ?? String(failure) };
    const level = failed === null ? 'info' : isLogFailure(failure) && failure.level === 'info' ? 'info' : 'warn';
    request.log[level](
      {
        id: plan.id,
        tenant: plan.principal.tenant,
        model: plan.model,
        upstream: plan.upstream.name,
        status,
        mode: plan.mode,
        prompt_tokens: plan.rows.sumTokens,
        shared_prefix_tokens: plan.sharedPrefixTokens,
        reserved_tokens: plan.promptCharge + plan.allowance,
        generated_tokens: settled?.generated ?? null,
        charge_tokens: settled?.chargeTokens ?? null,
        refund_tokens: settled?.refundTokens ?? null,
        cost_usd: settled?.costUsd ?? null,
        overhead_ms: Math.round(overhead * 1e6) / 1e3,
        upstream_ms: Math.round((upstreamMs + before) * 1e3) / 1e3,
        // A research round the upstream refused for its context, sent again as the final answer: the
        // first attempt (its own ledger row) rides on this, the request's one line.
        ...(prior ? { outgrown_attempt: prior.attempt } : {}),
        // Prompt text only when the operator turned it on (`logging.prompts`; SPEC §10).
        ...(gw.config.logging.prompts ? { prompt: plan.valid.messages ?? plan.valid.body.prompt ?? plan.valid.body.input ?? null } : {}),
        ...failed,
      },
      'request settled',
    );
  };

  once.log = finishLog;

  // A final answer that could not fit the model at all: the run ends with the evidence excerpt,
  // and no model is called (plan.ts).
  if (plan.excerptOnly) {
    settled = await settle(gw, plan, { status: 200, countedOutput: 0, countedMethod: 'none', usage: null, timings: null, fallback: true, refundAll: true });
    return sendFallback(gw, plan, reply, notices, settled, finishLog);
  }

  let res: Dispatcher.ResponseData;
  const neverSent = abort.signal.aborted;
  upstreamCalled = !neverSent;
  try {
    res = await forward(plan, abort.signal, request.headers);
  } catch (err) {
    upstreamMs = performance.now() - tForward;
    if (draining()) err = stoppedByShutdown();
    const clientGone = abort.signal.aborted && !draining();
    const status = clientGone ? 499 : err instanceof GatewayError ? err.status : 502;
    // Only an upstream failure refunds the whole reservation; a client that left while the model
    // worked on the request pays for the prompt it read, the allowance is refunded (SPEC §2.7) —
    // unless it left before the request was sent: then no model read anything.
    // A final turn that failed is answered with the evidence excerpt: the client gets a 200, and
    // the ledger says so.
    const fallback = plan.mode === 'final-answer' && !abort.signal.aborted;
    settled = await settle(gw, plan, { status: fallback ? 200 : status, countedOutput: 0, countedMethod: 'none', usage: null, timings: null, fallback, refundAll: !clientGone || neverSent });
    if (fallback) return sendFallback(gw, plan, reply, notices, settled, finishLog);
    finishLog(status, clientGone ? undefined : err);
    // A 502/504 (or a stopping gateway's 503) carries the settled figures too (whole refund), as an
    // upstream's own error does.
    if (!clientGone) reply.headers({ ...admissionHeaders(plan, notices), ...settledHeaders(settled) });
    throw err;
  }

  /**
   * An upstream that failed before any output: the whole reservation is refunded, and a final
   * turn is answered with the evidence excerpt (SPEC §5; null then: the answer is sent).
   */
  const refundedFailure = async (status: number): Promise<Settled | null> => {
    upstreamMs = performance.now() - tForward;
    const fallback = plan.mode === 'final-answer';
    // (`settled` too: the request's log line reads its figures.)
    const done = (settled = await settle(gw, plan, { status: fallback ? 200 : status, countedOutput: 0, countedMethod: 'none', usage: null, timings: null, fallback, refundAll: true }));
    if (!fallback) return done;
    sendFallback(gw, plan, reply, notices, done, finishLog);
    return null;
  };

  if (res.statusCode >= 400) {
    const text = await errorText(plan, res);
    const body = normaliseUpstreamError(res.statusCode, text, plan.upstream.name);
    if (plan.mode === 'normal' && isContextOverflow(res.statusCode, body) && answersInstead(plan.valid, gw.config.runs.writeTools)) {
      // Past a window the gateway did not know (no contextWindow, no /props) or counted under:
      // refunded whole, and planned again as the run's final answer (planAndRelay), as a round
      // past a known window is — in the window the refusal names, where none is known here.
      const done = await refundedFailure(res.statusCode);
      m.upstreamDuration.observe({ upstream: plan.upstream.name }, upstreamMs / 1000);
      // Said on the request's one line, by the final answer that follows (or on its own if that is refused).
      return {
        contextWindow: windowInOverflow(body),
        attempt: { id: plan.id, upstream: plan.upstream.name, status: res.statusCode, upstream_ms: Math.round(upstreamMs * 1e3) / 1e3, refund_tokens: done?.refundTokens ?? null },
      };
    }
    const failed = await refundedFailure(res.statusCode);
    if (!failed) return;
    finishLog(res.statusCode, {
      ...upstreamFailure(body.error, gw.config.logging.prompts, `upstream "${plan.upstream.name}" answered ${res.statusCode}`),
      level: res.statusCode >= 500 ? 'warn' : 'info',
    });
    // The upstream's own error, with its own retry advice: a 429 stays retryable (SPEC §6 marks
    // only the gateway's refusals final).
    const final = upstreamErrorIsFinal(plan.upstream.config.kind, res.statusCode, body) ? { 'x-should-retry': 'false' } : {};
    reply
      .code(res.statusCode)
      .headers({ ...upstreamHeaders(res.headers, plan.upstream.apiKey), ...final, ...admissionHeaders(plan, notices), ...settledHeaders(failed) })
      .send(body);
    return;
  }

  // An upstream that answered with no usable answer: an error object in a 200, a body that is not
  // JSON, or anything but an event stream to a stream request. Nothing was generated: the whole
  // reservation is refunded, and a final turn is answered with the evidence excerpt (SPEC §5).
  const badResponse = async (err: GatewayError): Promise<void> => {
    const failed = await refundedFailure(err.status);
    if (!failed) return;
    finishLog(err.status, err);
    reply.headers({ ...admissionHeaders(plan, notices), ...settledHeaders(failed) });
    throw err;
  };

  // A redirect is not followed (where it points is not configuration). Where it points is for the
  // operator's log only: a Location can name an internal address, or carry a key or a signature.
  if (res.statusCode >= 300) {
    await errorText(plan, res);
    const what = `redirected the request (${res.statusCode}); the gateway follows no redirect: set the upstream's baseUrl to where it points`;
    const location = typeof res.headers.location === 'string' ? redactText(res.headers.location.slice(0, 500), plan.upstream.apiKey) : '(no location)';
    return badResponse(quotingUpstream(badUpstreamResponse(plan.upstream.name, `${what} (the gateway's log says where)`), `upstream "${plan.upstream.name}" ${what}: ${location}`));
  }

  // A stream request answered with a whole completion is relayed as one (completion-as-stream.ts).
  const answeredWhole = plan.valid.stream && isJsonType(res.headers['content-type']);
  if (plan.valid.stream && !answeredWhole && !isEventStream(res.headers['content-type'])) {
    const text = await errorText(plan, res);
    return badResponse(notAStream(plan, text));
  }

  if (!plan.valid.stream || answeredWhole) {
    let json: Awaited<ReturnType<typeof relayJson>>;
    try {
      json = await relayJson(plan, res, echoOf(plan, counter));
    } catch (err) {
      if (abort.signal.aborted) throw err;
      if (err instanceof GatewayError && err.code === 'upstream_bad_response') return badResponse(err);
      // Its answer stopped coming for the upstream's `timeoutMs`: it did not answer in time (504).
      if ((err as { code?: unknown }).code === 'UND_ERR_BODY_TIMEOUT') return badResponse(upstreamError(err, plan.upstream.name));
      // The upstream's connection broke while its answer was read: nothing usable came.
      return badResponse(badUpstreamResponse(plan.upstream.name, `broke off its answer: ${(err as Error).message}`, err));
    }
    upstreamMs = performance.now() - tForward;
    const counted = await countAnswer(plan, counter, json, { signal: gw.drain.signal, timeoutMs: gw.answerCountTimeoutMs });
    // A final turn that proposed tools again, or left no text, is no answer: the excerpt is (SPEC §5)
    // — for every choice, or, with n > 1, for those that did not answer (relay-json.ts).
    const fallback = json.fallback === 'whole';
    outcome = {
      status: 200,
      countedOutput: counted.tokens,
      countedFirstChoice: counted.first,
      toolCalls: json.toolCalls,
      countedMethod: counted.method,
      usage: json.usage,
      timings: json.timings,
      fallback: json.fallback !== 'none',
      refundAll: false,
      uncountedAudio: json.audio,
      unaskedChoices: json.unaskedChoices,
    };
    settled = await settle(gw, plan, outcome);
    if (fallback) return sendFallback(gw, plan, reply, notices, settled, finishLog);
    finishLog(200);
    const partial: Record<string, string> = json.fallback === 'partial' ? { 'x-tollgate-fallback': 'evidence-excerpt' } : {};
    if (json.fallback === 'partial') gw.metrics.fallback.inc();
    if (answeredWhole) return sendAsStream(plan, reply, json, { ...upstreamHeaders(res.headers, plan.upstream.apiKey), ...admissionHeaders(plan, notices), ...partial }, settled);
    reply.code(200).headers({ ...upstreamHeaders(res.headers, plan.upstream.apiKey), ...admissionHeaders(plan, [...notices, ...settled.notices]), ...settledHeaders(settled), ...partial });
    // A llama.cpp server's usage for a prompt array or n > 1 is row 0's and choice 0's: the client
    // gets the gateway's figures for them, as a stream's usage chunk gives them.
    if (json.usage !== null && usageUnderReported(plan)) reply.send({ ...json.body, usage: { ...json.usage, ...usageChunkFigures(plan, null, settled) } });
    else if (json.raw !== null) reply.type('application/json; charset=utf-8').send(json.raw);
    else reply.send(json.body);
    return;
  }

  // Streams: the admission figures as headers, the settled ones in a closing comment.
  reply.hijack();
  const raw = reply.raw;
  const streamHead = (extra: Record<string, string | string[]>) =>
    raw.writeHead(200, {
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      // Said explicitly (left to Node, a client's abort went unnoticed until the keep-alive timeout,
      // so the upstream generated on for ~70 s); `close` when the client asked for it (RFC 9112 §9.6).
      connection: /\bclose\b/i.test(request.headers.connection ?? '') ? 'close' : 'keep-alive',
      'x-accel-buffering': 'no',
      ...upstreamHeaders(res.headers, plan.upstream.apiKey),
      ...admissionHeaders(plan, notices),
      ...extra,
    });
  const meter = new OutputMeter(outputCounting(plan, counter.method), counter, plan.perChoiceAllowance, echoOf(plan, counter));
  const streamed = await relayStream(plan, res, raw, meter, () => abort.abort(), () => streamHead({}), draining, abort.signal);
  upstreamMs = performance.now() - tForward;
  // llama.cpp's tool calls come in pieces of several tokens: counted as text where the meter's
  // figure is the one settled on (the server's usage is not trusted, or never came).
  if (streamed.cut || streamed.unaskedChoices || !providerOutputTrusted(plan, streamed.usage)) await meter.countCalls({ signal: gw.drain.signal, timeoutMs: gw.answerCountTimeoutMs });
  const fallback = plan.mode === 'final-answer' && !streamed.visibleText && !streamed.clientGone;
  // An upstream that failed before any output refunds the whole reservation, as a failure before
  // the response does (SPEC §2.7, §11); one lost part way pays for what it generated.
  const upstreamFailed = streamed.upstreamLost || streamed.upstreamError !== null;
  const failedBeforeOutput = upstreamFailed && meter.total() === 0 && !streamed.audio;
  // A failure the excerpt answered is a 200, as on the other paths: the client got an answer.
  const answered = fallback || streamed.excerptAppended;
  outcome = {
    // The ledger and the log say how it ended, though the client's status line said 200.
    status: streamed.clientGone ? 499 : upstreamFailed && !answered ? (draining() ? 503 : streamed.upstreamError?.code === 'upstream_timeout' ? 504 : 502) : 200,
    countedOutput: meter.total(),
    countedFirstChoice: meter.choiceTotal(0),
    toolCalls: meter.toolCalls(),
    countedMethod: meter.method,
    // A cut stream's upstream usage never came (or counts past the cut): the meter stands.
    usage: streamed.cut ? null : streamed.usage,
    timings: streamed.timings,
    fallback: fallback || streamed.excerptAppended,
    refundAll: failedBeforeOutput,
    uncountedAudio: streamed.audio,
    unaskedChoices: streamed.unaskedChoices,
  };
  settled = await settle(gw, plan, outcome);
  if (!raw.destroyed) {
    if (!streamed.started) streamHead(fallback ? { 'x-tollgate-fallback': 'evidence-excerpt' } : {});
    // The excerpt's chunks carry an id of their own; its usage chunk then carries the same one.
    let meta = streamed.meta;
    if (fallback) {
      const text = evidenceExcerpt(plan.valid.messages ?? []);
      const chunks = excerptStreamChunks(plan.model, text, false, { asRefusal: excerptAsRefusal(plan.valid.body), n: plan.valid.n });
      for (const chunk of chunks) raw.write(sseData(chunk));
      const { choices: _c, ...first } = chunks[0] as Record<string, unknown>;
      meta = first;
      gw.metrics.fallback.inc();
    }
    // After an error event there is no usage chunk: the stream ended in error (a final answer's
    // stream ends as an answer instead, usage and all).
    if (plan.valid.includeUsage && (!upstreamFailed || plan.mode === 'final-answer')) {
      const usage = outcome.refundAll ? NOTHING_USED : usageChunkFigures(plan, streamed.cut ? null : streamed.usage, settled);
      // llama.cpp's `timings` ride on its usage chunk, as the server sends them (fixtures/llamacpp).
      raw.write(sseData({ ...meta, choices: [], usage, ...(streamed.timings ? { timings: streamed.timings } : {}) }));
    }
    if (streamed.excerptAppended) gw.metrics.fallback.inc();
    raw.write(closingComment(settled, fallback || streamed.excerptAppended));
    raw.end('data: [DONE]\n\n');
  }
  // A stream that ended in error is said so, with the code the client's error event had, as the
  // same failure unstreamed is (its message only where prompts are logged: it may quote them).
  const streamFailure: LogFailure | undefined = !upstreamFailed || answered || streamed.clientGone
    ? undefined
    : draining()
      ? { code: 'shutting_down', message: 'the gateway stopped the stream as it shut down' }
      : streamed.upstreamError === null
        ? { code: 'upstream_lost', message: `the connection to upstream "${plan.upstream.name}" was lost part way through the stream` }
        : upstreamFailure(streamed.upstreamError, gw.config.logging.prompts, `the stream from upstream "${plan.upstream.name}" ended in error`);
  finishLog(outcome.status, streamFailure);
}

/** A failure said on a request's line without a GatewayError: its code, a message safe to log, its level (warn). */
interface LogFailure {
  code: string;
  message: string;
  level?: 'info' | 'warn';
}

/**
 * An upstream's error object as a log line says it: its code (bounded), and its message only where
 * prompts are logged (it may repeat the prompt), else `what` happened.
 */
function upstreamFailure(error: unknown, promptsLogged: boolean, what: string): LogFailure {
  const e = (typeof error === 'object' && error !== null ? error : {}) as { code?: unknown; message?: unknown };
  return {
    code: typeof e.code === 'string' || typeof e.code === 'number' ? String(e.code).slice(0, 64) : 'upstream_error',
    message: promptsLogged && typeof e.message === 'string' ? e.message : `${what} (its message is not logged: it may repeat the prompt)`,
  };
}

function isLogFailure(v: unknown): v is LogFailure {
  return typeof v === 'object' && v !== null && !(v instanceof Error) && typeof (v as LogFailure).code === 'string' && typeof (v as LogFailure).message === 'string';
}

function isJsonType(contentType: string | string[] | undefined): boolean {
  const value = Array.isArray(contentType) ? contentType[0] : contentType;
  return value !== undefined && /^\s*application\/json\b/i.test(value);
}

function isEventStream(contentType: string | string[] | undefined): boolean {
  const value = Array.isArray(contentType) ? contentType[0] : contentType;
  return value === undefined || /^\s*text\/event-stream\b/i.test(value);
}

/** A stream request answered with something else than an event stream: the provider's error, said as it said it. */
function notAStream(plan: Plan, text: string): GatewayError {
  let message = text.slice(0, 500);
  try {
    const parsed = JSON.parse(text) as { error?: { message?: unknown } | string };
    const e = parsed?.error;
    if (typeof e === 'string') message = e;
    else if (e && typeof e.message === 'string') message = e.message;
  } catch {
    // not JSON: its start is the message
  }
  return quotingUpstream(
    badUpstreamResponse(plan.upstream.name, `answered a stream request with no event stream: ${message || 'an empty body'}`),
    `upstream "${plan.upstream.name}" answered a stream request with no event stream (its message is not logged: it may repeat the prompt)`,
  );
}

/** Bytes of an upstream's error body read and passed on; past it, the status alone speaks. */
const ERROR_BODY_BYTES = 1024 * 1024;

/**
 * An upstream's error body, bounded, and with the upstream's own key taken out: a provider that
 * echoes the request's headers in its error must not hand the gateway's key to the client.
 */
async function errorText(plan: Plan, res: Dispatcher.ResponseData): Promise<string> {
  return redactBodyText(await readText(res.body, plan.upstream.name, ERROR_BODY_BYTES).catch(() => ''), plan.upstream.apiKey);
}
