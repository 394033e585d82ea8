// Stage 6 — relay a stream chunk by chunk, never buffered whole, counting output as it passes
// (SPEC §2.6, §11). A choice that reaches its allowance is ended by the gateway with
// `finish_reason: "length"`; the usage chunk goes out only if the client asked for it; the settled
// figures follow in a `: tollgate {…}` comment, then `data: [DONE]`. An upstream that fails part
// way (an error in the stream, or the connection lost) ends it with an error event.

import type { ServerResponse } from 'node:http';
import type { Readable } from 'node:stream';
import type { Dispatcher } from 'undici';
import { SseEventTooLarge, SseParser, sseData, type SseEvent } from './sse.js';
import { contentChunk } from './sse-content-chunk.js';
import { OutputMeter, answerText, carriesAudio, deltaText, toolCallText, writtenText } from './output-meter.js';
import { showsText } from '../../metering/runs/message-text.js';
import { StreamToolCallFilter } from '../../metering/runs/strip-tool-calls.js';
import { evidenceExcerpt, excerptAsRefusal } from '../../metering/runs/evidence-excerpt.js';
import { badUpstreamStream, upstreamError } from './forward.js';
import { errorEnvelopeOf, streamErrorIn } from './upstream-error-body.js';
import type { Plan } from './plan.js';
import { holdsKey, redactDeep, redactText } from './upstream-key.js';

type Json = Record<string, unknown>;

export interface StreamOutcome {
  /** Usage the upstream reported, if it did. */
  usage: Json | null;
  /** llama.cpp `timings`, if present. */
  timings: Json | null;
  /** True when the gateway ended the stream at the allowance. */
  cut: boolean;
  /** The upstream connection failed part way. */
  upstreamLost: boolean;
  /** The error the upstream sent in the stream (an `error` event or a chunk with `error`), if any. */
  upstreamError: Json | null;
  clientGone: boolean;
  /** Any content reached the client. */
  visibleText: boolean;
  /** The model spoke: audio (`delta.audio.data`) reached the client, which the meter cannot count. */
  audio: boolean;
  /**
   * A final turn wrote text and then proposed tools again, or (with n > 1) left a choice empty: the
   * evidence excerpt was added to those choices, after any text, before the turn's finish (SPEC §5 —
   * the text already reached the client).
   */
  excerptAppended: boolean;
  /** Chunks of choices past those the request asked for came, and were not passed on (their usage is in the provider's figure). */
  unaskedChoices: boolean;
  /** Chunk metadata (id, model, created) for chunks the gateway writes itself. */
  meta: Json;
  /** The response head was written (false: nothing reached the client yet). */
  started: boolean;
}

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export async function relayStream(
  plan: Plan,
  upstream: Dispatcher.ResponseData,
  res: ServerResponse,
  meter: OutputMeter,
  abortUpstream: () => void,
  startHead: () => void,
  /** True once the gateway stopped the stream because it is shutting down. */
  draining: () => boolean = () => false,
  /** Aborted when the request is stopped (the client left, the gateway's drain deadline passed). */
  stopped?: AbortSignal,
): Promise<StreamOutcome> {
  const choicesExpected = plan.valid.n * (plan.valid.kind === 'completions' ? plan.rows.rows : 1);
  // Choices that ended: the gateway cut them at the allowance (nothing more of them is passed on),
  // or the upstream finished them.
  const finished = new Set<number>();
  const cutChoices = new Set<number>();
  /** The upstream wrote on in a choice it had said was finished: its finishes say nothing. */
  let finishEveryChunk = false;
  const filter = plan.mode === 'final-answer' ? new StreamToolCallFilter() : null;
  const out: StreamOutcome = {
    usage: null,
    timings: null,
    cut: false,
    upstreamLost: false,
    upstreamError: null,
    clientGone: false,
    visibleText: false,
    audio: false,
    excerptAppended: false,
    unaskedChoices: false,
    meta: {},
    started: false,
  };
  // A final turn holds its first chunks back until visible text arrives, so that a turn that
  // only proposes tools can still be answered with the excerpt and its header (SPEC §5).
  let pending: string[] | null = filter ? [] : null;
  // A final turn also holds back the chunks that finish its choices until the upstream has ended:
  // a tool call proposed after the text has reached the client still gets the excerpt before them.
  // So does a llama.cpp stream whose client did not ask for usage: the server (asked for usage by
  // the gateway) sends its `timings` on a usage chunk after the finish; the client gets them on the
  // finish chunk, where the server puts them in a stream without usage (fixtures/llamacpp).
  const timingsOnFinish = plan.upstream.config.kind === 'llamacpp' && !plan.valid.includeUsage;
  const holdFinish = filter !== null || timingsOnFinish;
  const heldFinish: Json[] = [];
  let started = false;
  /** The upstream said `[DONE]`: its response is over but for its last bytes. */
  let done = false;
  // While one upstream read is handled, what it produces is gathered into one string and written
  // once: every `res.write` is a chunk of its own (size line, data, CRLF) and a part of the socket
  // write, and per-event writes were the largest cost of relaying a stream (bench/RESULTS.md).
  let gathering = false;
  let gathered = '';
  const send = (text: string) => {
    if (gathering) gathered += text;
    else res.write(text);
  };
  const write = (text: string) => {
    if (pending !== null && !out.visibleText) {
      pending.push(text);
      return;
    }
    if (res.destroyed || res.writableEnded) {
      out.clientGone = true;
      return;
    }
    if (!started) {
      started = true;
      startHead();
    }
    if (pending !== null) {
      for (const held of pending) send(held);
      pending = null;
    }
    send(text);
  };
  const finishChunk = (index: number, reason: 'length' | 'stop'): Json => ({
    ...out.meta,
    choices: [plan.valid.kind === 'chat' ? { index, delta: {}, finish_reason: reason } : { index, text: '', finish_reason: reason }],
  });
  /**
   * The chunk that ends a choice cut at its allowance: with the start of the crossing piece that
   * still fits (meter.cutText), when the piece was plain text, else with no text.
   */
  const cutChunk = (index: number, piece: Json | null, keyTaken = false): Json => {
    const chunk = finishChunk(index, 'length');
    // The start is cut from what the upstream wrote: a piece that held the upstream's key gives
    // none (a start could end part way into the key, which no search would then find).
    const text = keyTaken ? '' : meter.cutText;
    if (text === '' || !plainText(piece)) return chunk;
    const [choice] = chunk.choices as Json[];
    return { ...chunk, choices: [plan.valid.kind === 'chat' ? { ...choice, delta: { content: text } } : { ...choice, text }] };
  };

  // The client asked for usage figures in every chunk (vLLM's `stream_options.continuous_usage_stats`), and for usage.
  const streamOptions = plan.valid.body.stream_options;
  const everyChunk = isObject(streamOptions) && streamOptions.continuous_usage_stats === true && plan.valid.includeUsage;
  /** The stream's id, model and created have been taken from a chunk that carries a real id. */
  let metaTaken = false;
  /** A chunk with choices was parsed: its metadata is the stream's, real id or not. */
  let metaParsed = false;
  /** Any event with data came (a body with none is no event stream at all). */
  let sawData = false;

  const handle = (event: SseEvent): boolean => {
    if (event.data === null) {
      // An upstream's comment — a keep-alive while a provider queues (`: OPENROUTER PROCESSING`) —
      // goes on as it came, so that the client's and its proxies' idle timers see the stream alive.
      // Not in a final turn (whose head waits for its text), and not another Tollgate's closing
      // figures: the client reads this gateway's.
      if (filter === null && event.raw.startsWith(':') && !/^: ?tollgate\b/.test(event.raw)) write(`${redactText(event.raw, plan.upstream.apiKey)}\n\n`);
      return true;
    }
    sawData = true;
    if (event.data.trim() === '[DONE]') {
      done = true;
      return false;
    }
    if (event.event === 'error') {
      out.upstreamError = redactDeep(errorOf(event.data, plan.upstream.name), plan.upstream.apiKey);
      return false;
    }
    // Data in one line can be passed on as `data: <it>`; data that came in several `data:` lines
    // (valid SSE) holds their line ends, and is written again as one line.
    const oneLine = !event.data.includes('\n');
    // The common content chunk, recognised without parsing it (sse-content-chunk.ts), once the
    // stream's metadata has been taken from a chunk that was parsed.
    const fast = filter === null && (metaTaken || metaParsed) && oneLine && !cutChoices.has(0) ? contentChunk(event.data) : null;
    // A chunk that may carry the upstream's own key goes the full way, where it is taken out: the
    // key as written, in the text, or in a member whose JSON escapes the fast path does not read.
    const key = plan.upstream.apiKey;
    const plain = fast !== null && key && (fast.escapedElsewhere || holdsKey(event.data, key) || holdsKey(fast.text, key)) ? null : fast;
    if (plain !== null) {
      if (finished.has(0) && plain.text !== '' && !finishEveryChunk) {
        // Content after the choice's finish (as below).
        finishEveryChunk = true;
        for (const held of heldFinish.splice(0)) write(sseData(held));
      }
      if (meter.add(0, plain.text)) {
        if (!out.visibleText && showsText(plain.text)) out.visibleText = true;
        // `"usage":null` is there because the gateway asked for usage: passed on only if the client did.
        write(`data: ${plan.valid.includeUsage ? event.data : plain.withoutUsage}\n\n`);
        return true;
      }
      // Past the allowance: the choice ends here, as below.
      finished.add(0);
      cutChoices.add(0);
      out.cut = true;
      write(sseData(cutChunk(0, null)));
      return finished.size < choicesExpected;
    }
    let chunk: unknown;
    // As the upstream sent it: what the model wrote is metered on this, and `chunk` is what goes out.
    let sent: unknown;
    let redacted = false;
    try {
      sent = JSON.parse(event.data);
      chunk = redactDeep(sent, plan.upstream.apiKey);
      redacted = chunk !== sent;
    } catch {
      write(`${redactText(event.raw, plan.upstream.apiKey)}\n\n`);
      return true;
    }
    if (!isObject(chunk)) return true;
    // A provider that fails part way says so in the stream (OpenAI; OpenRouter beside a choice
    // finished with "error"; vLLM and TGI in their own shapes): the stream ends, and the client is
    // told in the envelope a failed non-streamed request gets.
    const error = streamErrorIn(chunk);
    if (error !== null) {
      out.upstreamError = redactDeep(errorEnvelopeOf(error, plan.upstream.name).error, plan.upstream.apiKey);
      return false;
    }
    const { usage, timings, choices } = chunk;
    // id, object, created and model are the stream's, the same in every chunk: taken once, from a
    // chunk with an id (Azure's first chunk, its prompt filter results, has an empty one: chunks the
    // gateway writes with it would not be merged into the answer by the SDKs).
    if (!metaTaken) {
      out.meta = { id: chunk.id, object: chunk.object, created: chunk.created, model: chunk.model };
      metaTaken = typeof chunk.id === 'string' && chunk.id !== '';
    }
    if (isObject(usage)) out.usage = usage;
    if (isObject(timings)) out.timings = timings;
    if (!Array.isArray(choices) || choices.length === 0) {
      // A usage-only chunk is sent at the end. After every choice has finished it is the answer's
      // last word: what follows (`[DONE]`) is read apart, so an upstream that then holds the
      // connection open, or drops it, takes nothing from a whole answer.
      if (isObject(usage) && finished.size >= choicesExpected && !finishEveryChunk) {
        done = true;
        return false;
      }
      return true;
    }
    // A server that gives its chunks no id: the first chunk with choices stands for the stream
    // (Azure's id-less first chunk has none), and the fast path may start.
    metaParsed = true;

    const kept: Json[] = [];
    // `"usage": null` is there because the gateway asked for usage: a chunk that has it is passed on
    // as it came only to a client that asked too. Figures beside choices go on only to a client
    // that asked for them in every chunk (vLLM's `continuous_usage_stats`): else they are the
    // answer's usage, which the gateway sends once, in its own usage chunk at the end (llama.cpp
    // writes its usage and timings into a completion's finishing chunk; passed on, the client had
    // the usage twice).
    let untouched = oneLine && !filter && !redacted && (usage === undefined || (usage === null && plan.valid.includeUsage) || (isObject(usage) && everyChunk)) && timings === undefined;
    let visible = false;
    const sentChoices = redacted && isObject(sent) && Array.isArray(sent.choices) ? sent.choices : choices;
    for (const [at, raw] of choices.entries()) {
      if (!isObject(raw)) {
        untouched = false;
        continue;
      }
      const index = typeof raw.index === 'number' ? raw.index : 0;
      // A choice the request did not ask for (an index past n) has no allowance: not passed on. One
      // the upstream said was finished and goes on with is passed on and metered all the same
      // (Gemini behind some proxies says "stop" in every chunk).
      if (cutChoices.has(index) || index < 0 || index >= choicesExpected) {
        if (!cutChoices.has(index)) out.unaskedChoices = true;
        untouched = false;
        continue;
      }
      const written = sentChoices[at];
      const shown = isObject(written) ? written : raw;
      const text = deltaText(shown);
      if (isObject(raw.delta) && carriesAudio(raw.delta)) out.audio = true;
      if (finished.has(index) && text !== '' && !finishEveryChunk) {
        // A choice that writes on after its finish: this server names a finish in every chunk, so
        // no finish of it says the answer is whole, and none is held back.
        finishEveryChunk = true;
        for (const held of heldFinish.splice(0)) write(sseData(held));
      }
      if (isObject(shown.delta)) meter.noteCalls(index, shown.delta);
      if (!meter.add(index, text, isObject(shown.delta) ? toolCallText(shown.delta) : '')) {
        // Past the allowance: the choice ends here, with what of this piece still fits.
        kept.push(...(cutChunk(index, raw, written !== raw).choices as Json[]));
        finished.add(index);
        cutChoices.add(index);
        out.cut = true;
        untouched = false;
        continue;
      }
      if (!visible && showsText(answerText(raw))) visible = true;
      kept.push(raw);
      if (isFinishReason(raw.finish_reason)) {
        finished.add(index);
        if (holdFinish && !finishEveryChunk) untouched = false;
      }
    }
    // The common case — a chunk passed on as it came — is written as received, not re-serialised.
    if (untouched) {
      if (visible) out.visibleText = true;
      write(`data: ${event.data}\n\n`);
    } else if (kept.length > 0) {
      const { usage: _u, timings: _t, choices: _c, ...meta } = chunk;
      let next: Json | null = { ...meta, choices: kept };
      if (isObject(usage) && plan.valid.includeUsage) next.usage = everyChunk ? usage : null;
      if (timings !== undefined && everyChunk) next.timings = timings;
      if (filter) next = filter.push(next);
      if (next) {
        const nextChoices = Array.isArray(next.choices) ? next.choices : [];
        if (nextChoices.some((c) => isObject(c) && showsText(answerText(c)))) out.visibleText = true;
        if (holdFinish && !finishEveryChunk && nextChoices.some((c) => isObject(c) && isFinishReason(c.finish_reason))) heldFinish.push(next);
        else write(sseData(next));
      }
    }
    // Every choice has ended (the gateway cut them or the upstream finished them).
    return !(out.cut && finished.size >= choicesExpected);
  };

  const parser = new SseParser();
  try {
    // Leaving the loop does not destroy the body: after `[DONE]` the rest is read (drainRest).
    reading: for await (const piece of upstream.body.iterator({ destroyOnReturn: false })) {
      gathering = true;
      try {
        for (const event of parser.push(piece as Uint8Array)) {
          if (!handle(event)) break reading;
        }
      } finally {
        gathering = false;
        if (gathered.length > 0 && !res.destroyed && !res.writableEnded) res.write(gathered);
        gathered = '';
      }
      // A client that reads slower than the model writes holds the upstream back, as a plain proxy
      // would: the next piece is read once the client has taken this one, so a stream is never
      // gathered in memory here. The kernel says a socket is writable again only once a good part
      // of its send buffer (up to megabytes) has gone, so a steady slow reader can go a minute or
      // more between two 'drain's: only one that drains nothing for the upstream's own timeout
      // (`timeoutMs`, 10 minutes by default) is taken as gone — its response is destroyed, and
      // the request settles for what was generated.
      if (res.writableNeedDrain && !res.destroyed && (await drained(res, stopped, plan.upstream.config.timeoutMs)) === 'stalled') {
        res.destroy();
        out.clientGone = true;
      }
      if (out.clientGone) break;
    }
    if (!out.cut && !done) for (const event of parser.end()) if (!handle(event)) break;
    // A body that ended with neither `[DONE]` nor every choice finished is an answer broken off,
    // not a whole one (a clean end of the connection part way through, or no events at all).
    if (!done && !out.clientGone && out.upstreamError === null && finished.size < choicesExpected) {
      if (sawData) out.upstreamLost = true;
      else out.upstreamError = badUpstreamStream(plan.upstream.name, 'answered a stream request with no events');
    }
  } catch (err) {
    // An event that never ends is a broken answer, said as such. A read that failed because the
    // client left (the gateway aborted the upstream for it) is the client's leaving; anything else
    // lost the upstream.
    if (err instanceof SseEventTooLarge) out.upstreamError = badUpstreamStream(plan.upstream.name, `sent a broken stream: ${err.message}`);
    else if (res.destroyed) out.clientGone = true;
    // Nothing more came for the upstream's `timeoutMs`: it did not answer in time, as a silence
    // before its headers is (504 upstream_timeout), not a connection lost.
    else if ((err as { code?: unknown }).code === 'UND_ERR_BODY_TIMEOUT') out.upstreamError = upstreamError(err, plan.upstream.name).toEnvelope().error;
    // Every choice had finished: a connection lost before `[DONE]` took nothing from the answer
    // (unless the server names a finish in every chunk: then none says so).
    else if (finished.size < choicesExpected || out.cut || finishEveryChunk) out.upstreamLost = true;
  }
  // Whatever stopped the relay before the upstream's end — the allowance, the client, an error in
  // the stream or one while handling it — stops the upstream too: it would generate for no one.
  if (out.cut || out.clientGone || out.upstreamLost || out.upstreamError !== null) abortUpstream();
  else if (done) drainRest(upstream.body);
  if (filter) {
    // The summary first: text the filter still held makes the turn visible, and `write` must know
    // that before it is asked to send it (else it would be held back with the rest and lost).
    const summary = filter.finish();
    out.visibleText = summary.visibleText;
    if (summary.chunk) write(sseData(summary.chunk));
    // Text went out, then the model proposed tools again, or the upstream failed part way: the
    // turn is no answer (SPEC §5). The excerpt follows the text — it cannot be taken back — under
    // its own first line. With n > 1, only in the choices that are no answer (proposed tools, or
    // wrote nothing: then the excerpt is all they say); the others stand. (With no text in any
    // choice, the caller answers with the excerpt alone.)
    const failed = out.upstreamLost || out.upstreamError !== null;
    if (out.visibleText && !out.clientGone) {
      const excerpt = evidenceExcerpt(plan.valid.messages ?? []);
      // For structured output, as a refusal: the SDKs parse content as JSON, which this is not.
      const field = excerptAsRefusal(plan.valid.body) ? 'refusal' : 'content';
      for (let index = 0; index < choicesExpected; index++) {
        const shown = summary.visibleIn.has(index);
        if (!failed && shown && !summary.proposedIn.has(index)) continue;
        write(sseData({ ...out.meta, choices: [{ index, delta: { [field]: shown ? `\n\n${excerpt}` : excerpt }, finish_reason: null }] }));
        out.excerptAppended = true;
      }
    }
  }
  if (heldFinish.length > 0) {
    const last = heldFinish.length - 1;
    if (timingsOnFinish && out.timings && heldFinish[last]!.timings === undefined) heldFinish[last] = { ...heldFinish[last], timings: out.timings };
    for (const held of heldFinish) write(sseData(held));
  }
  if ((out.upstreamLost || out.upstreamError !== null) && !out.clientGone) {
    if (filter) {
      // A final answer must end as an answer (SPEC §5): what came, then the excerpt (above), ends
      // each choice the upstream left open. (With no text at all, the caller answers with the
      // evidence excerpt instead.)
      for (let i = 0; i < choicesExpected; i++) if (!finished.has(i)) write(sseData(finishChunk(i, 'stop')));
    } else {
      // Otherwise the client is told, as the provider would tell it: an error event, on which the
      // OpenAI SDKs throw an APIError — an agent must not take a broken answer for a whole one.
      write(sseData({ error: out.upstreamError ?? (draining() ? SHUTTING_DOWN : lost(plan.upstream.name)) }));
    }
  }
  out.started = started;
  return out;
}

/**
 * A choice's finish: a reason named. Some servers write `""` (SGLang, Ollama in 2024) or `"null"`
 * (KoboldCpp) in every chunk where OpenAI writes null; taken for a finish, they cut the answer at
 * its first chunk.
 */
function isFinishReason(v: unknown): v is string {
  return typeof v === 'string' && v !== '' && v !== 'null';
}

/** How long an upstream may take to end its response after `[DONE]` before it is cut off. */
const AFTER_DONE_MS = 5_000;
const ignore = () => {};

/** Resolves when `res` has written out what it held, has closed, or the request stopped; or after `ms` ('stalled'). */
function drained(res: ServerResponse, stopped: AbortSignal | undefined, ms: number): Promise<'drained' | 'stalled'> {
  if (stopped?.aborted) return Promise.resolve('drained');
  return new Promise((resolve) => {
    const done = (how: 'drained' | 'stalled') => () => {
      clearTimeout(timer);
      res.off('drain', onDrain);
      res.off('close', onDrain);
      stopped?.removeEventListener('abort', onDrain);
      resolve(how);
    };
    const onDrain = done('drained');
    const timer = setTimeout(done('stalled'), ms);
    res.on('drain', onDrain);
    res.on('close', onDrain);
    stopped?.addEventListener('abort', onDrain, { once: true });
  });
}

/**
 * After `[DONE]` the upstream's response is over but for its last bytes (the chunked encoding's
 * end, usually in the same read): they are read, so that the exchange ends as a whole one and its
 * connection goes back to the pool. Destroying the body instead made an AbortError, and formatted
 * its stack, on every stream (~4 % of a streamed request's CPU, bench/RESULTS.md).
 */
function drainRest(body: Readable): void {
  if (body.destroyed || body.readableEnded) return;
  body.on('error', ignore);
  // Unref'd: it never keeps a process alive on its own (while the upstream's socket is open, it fires).
  const stop = setTimeout(() => body.destroy(), AFTER_DONE_MS).unref();
  body.once('close', () => clearTimeout(stop));
  body.resume();
}

function lost(upstream: string): Json {
  return { message: `the connection to upstream "${upstream}" was lost part way through the stream`, type: 'upstream_error', param: null, code: 'upstream_lost', upstream };
}

const SHUTTING_DOWN: Json = {
  message: 'the gateway is shutting down: the stream was ended before the model finished; what was generated is charged',
  type: 'server_error',
  param: null,
  code: 'shutting_down',
};

/** An `event: error`'s data, in the envelope every other upstream error gets (upstream-error-body.ts). */
function errorOf(data: string, upstream: string): Json {
  let e: Json = { message: data };
  try {
    const parsed: unknown = JSON.parse(data);
    if (isObject(parsed)) e = streamErrorIn(parsed) ?? parsed;
  } catch {
    // not JSON: the text is the message
  }
  return errorEnvelopeOf(e, upstream).error;
}

/** A choice whose only output is plain text (content, or a completion's text); null is the fast path's content chunk. */
function plainText(choice: Json | null): boolean {
  if (choice === null) return true;
  if (typeof choice.text === 'string') return true;
  const d = choice.delta;
  return isObject(d) && typeof d.content === 'string' && writtenText(d) === d.content;
}
