// Stage 6 for a non-streamed answer: read the upstream's JSON (a whole response is small next to a
// request body), find the usage and the generated text per choice, and, in a final turn, remove
// any tool call the model still proposes (SPEC §5).

import type { Dispatcher } from 'undici';
import { stripToolCallsFromCompletion } from '../../metering/runs/strip-tool-calls.js';
import { evidenceExcerpt, excerptAsRefusal, excerptMessage } from '../../metering/runs/evidence-excerpt.js';
import { quotingUpstream } from '../errors.js';
import { badUpstreamResponse } from './forward.js';
import { upstreamErrorIn } from './upstream-error-body.js';
import type { Plan } from './plan.js';
import { carriesAudio, echoedLength, writtenText } from './output-meter.js';
import { holdsKey, redactDeep, redactText } from './upstream-key.js';

type Json = Record<string, unknown>;

const MAX_RESPONSE_BYTES = 256 * 1024 * 1024;

export interface JsonOutcome {
  body: Json;
  /**
   * The upstream's own text when the body is passed on unchanged (every turn but a final one):
   * sent as it came, not re-serialised — faster (an embeddings batch is megabytes of numbers) and
   * byte for byte what the provider wrote. Null when the gateway changed the body.
   */
  raw: string | null;
  usage: Json | null;
  timings: Json | null;
  /** Generated text per choice (output-meter.ts `writtenText`), counted as a floor under the provider's figure. */
  texts: string[];
  /** Where in `texts` the first choice's text is (index 0: row 0's first for a prompt array); -1 when none came. */
  firstChoice: number;
  /** Tool calls written: by the first choice, and by the others together (settle.ts's share of their markup). */
  toolCalls: { first: number; others: number };
  /** A choice's message carries audio the model spoke (`carriesAudio`), which `texts` cannot count. */
  audio: boolean;
  /**
   * A final turn that is no answer (SPEC §5): `whole` when no choice answered — it proposed tools
   * again or left no text — and the caller answers with the evidence excerpt; `partial` when some
   * of its `n` choices did and the excerpt already stands in `body` for the others.
   */
  fallback: 'none' | 'partial' | 'whole';
  /** Choices past those the request asked for were dropped: the provider's output figure covers them too. */
  unaskedChoices: boolean;
}

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export async function readText(body: Dispatcher.ResponseData['body'], upstream: string, limit = MAX_RESPONSE_BYTES): Promise<string> {
  const chunks: Buffer[] = [];
  let total = 0;
  for await (const chunk of body) {
    total += (chunk as Buffer).length;
    if (total > limit) {
      body.destroy();
      throw badUpstreamResponse(upstream, `sent a response larger than ${limit} bytes`);
    }
    chunks.push(chunk as Buffer);
  }
  return Buffer.concat(chunks, total).toString('utf8');
}

function choiceText(choice: Json): string {
  const text = typeof choice.text === 'string' ? choice.text : '';
  return isObject(choice.message) ? text + writtenText(choice.message) : text;
}

/**
 * @param echoOf completions with `echo`: the prompt each choice (by index) starts with, which the
 *   model read and did not write — left out of `texts`, as a stream's meter leaves it out.
 */
export async function relayJson(plan: Plan, upstream: Dispatcher.ResponseData, echoOf?: (index: number) => string): Promise<JsonOutcome> {
  const text = await readText(upstream.body, plan.upstream.name);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw badUpstreamResponse(plan.upstream.name, 'sent a response that is not JSON');
  }
  if (!isObject(parsed)) throw badUpstreamResponse(plan.upstream.name, 'sent a response that is not a JSON object');
  // A provider that reports a failure in a 200 (an error and no answer, in any of the shapes servers
  // write: upstream-error-body.ts) failed all the same.
  const error = upstreamErrorIn(parsed);
  if (error !== null) {
    const message = redactText(String(error.message !== '' ? error.message : JSON.stringify(error)), plan.upstream.apiKey);
    throw quotingUpstream(
      badUpstreamResponse(plan.upstream.name, `answered 200 with an error: ${message}`),
      `upstream "${plan.upstream.name}" answered 200 with an error (its message is not logged: it may repeat the prompt)`,
    );
  }
  // An answer that echoes the upstream's own key (a debugging proxy that repeats the request's
  // headers) is written out again without it; the common answer goes as it came (upstream-key.ts).
  // (Looked for only where the text holds the key, or an escape that might spell it.)
  const key = plan.upstream.apiKey;
  let clean = holdsKey(text, key) || (key && text.includes('\\')) ? redactDeep(parsed, key) : parsed;
  // More choices than the request asked for: those past n have no allowance, and are not passed on
  // or counted, as a stream's are not (relay-stream.ts). (As many as asked, however numbered — a
  // server that counts from 1 — are the answer.)
  const expected = plan.valid.n * (plan.valid.kind === 'completions' ? plan.rows.rows : 1);
  const unaskedChoices = Array.isArray(parsed.choices) && parsed.choices.length > expected;
  const asked = (choice: unknown, at: number) => {
    if (!unaskedChoices) return true;
    const index = isObject(choice) && typeof choice.index === 'number' ? choice.index : at;
    return index >= 0 && index < expected;
  };
  if (unaskedChoices && Array.isArray(clean.choices)) clean = { ...clean, choices: clean.choices.filter(asked) };
  // Metered on what the model wrote, as the upstream sent it.
  const choices: Json[] = [];
  const positions: number[] = [];
  if (Array.isArray(parsed.choices)) {
    for (const [at, choice] of parsed.choices.entries()) {
      if (!isObject(choice) || !asked(choice, at)) continue;
      choices.push(choice);
      positions.push(at);
    }
  }
  const indexes = choices.map((choice, k) => (typeof choice.index === 'number' ? choice.index : positions[k]!));
  const texts = choices.map((choice, k) => {
    const written = choiceText(choice);
    const echo = echoOf?.(indexes[k]!) ?? '';
    return echo === '' ? written : written.slice(echoedLength(written, echo));
  });
  let body = clean;
  let raw: string | null = clean === parsed ? text : null;
  let fallback: JsonOutcome['fallback'] = 'none';
  if (plan.mode === 'final-answer') {
    raw = null;
    const stripped = stripToolCallsFromCompletion(clean);
    body = stripped.body as Json;
    const answers = Array.isArray(body.choices) ? body.choices : [];
    if (stripped.failed.length >= answers.length) fallback = 'whole';
    else if (stripped.failed.length > 0) {
      // With n > 1, the choices that answered are kept, and the excerpt stands in for the others.
      const message = excerptMessage(evidenceExcerpt(plan.valid.messages ?? []), excerptAsRefusal(plan.valid.body));
      for (const at of stripped.failed) answers[at] = { ...(answers[at] as Json), message, finish_reason: 'stop' };
      fallback = 'partial';
    }
  }
  const callsOf = (choice: Json) => {
    const message = isObject(choice.message) ? choice.message : {};
    return (Array.isArray(message.tool_calls) ? message.tool_calls.length : 0) + (isObject(message.function_call) ? 1 : 0);
  };
  const calls = choices.map(callsOf);
  const first = indexes.indexOf(0);
  const firstCalls = calls[first] ?? 0;
  const toolCalls = { first: firstCalls, others: calls.reduce((a, b) => a + b, 0) - firstCalls };
  return {
    body,
    raw,
    usage: isObject(parsed.usage) ? parsed.usage : null,
    timings: isObject(parsed.timings) ? parsed.timings : null,
    texts,
    firstChoice: first,
    toolCalls,
    audio: choices.some((choice) => isObject(choice.message) && carriesAudio(choice.message)),
    fallback,
    unaskedChoices,
  };
}
