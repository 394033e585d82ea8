// Run recognition from the messages of one chat request alone (SPEC §5, ADR 0007): the run is
// everything after the last `user` message. No client cooperation, no stored state: the message
// list a tool-using client resends every turn already holds the run's whole history.

import type { ChatMessage } from '../types.js';
import { canonicalArguments, canonicalJson, sha256Hex } from '../canonical-json.js';
import { messageDigest } from '../message-digest.js';
// Equal canonical forms, equal digests: earlier questions are compared without hashing them (an
// image in each would be megabytes hashed a turn).
import { canonicalEqual } from '../prefix-memo.js';
import { hashOnce } from '../hash-once.js';
import { messageText } from './message-text.js';
import { markupCallNames, markupSpans } from './tool-call-markup.js';

export interface BatchCall {
  id: string | null;
  name: string;
  /** The arguments string as the model wrote it. */
  arguments: string;
  /** Index in `messages` of the `tool` message answering this call, or null if none does. */
  resultIndex: number | null;
}

/**
 * One assistant message carrying tool calls, with the `tool` messages that answer it — or, in the
 * legacy form (before `tools`), its one `function_call`, answered by the next `function` message.
 */
export interface ToolBatch {
  /** Index in `messages` of the assistant message. */
  assistantIndex: number;
  /** Calls in the order the model made them, each with its result. */
  calls: BatchCall[];
  /** True when any call names a configured write tool. */
  hasWrite: boolean;
  /** Identity for patience: names, canonical arguments and results — never ids. */
  signature: string;
}

export interface RunInspection {
  /** Index of the last `user` message, −1 when there is none (the whole list is the run). */
  lastUserIndex: number;
  /** Assistant turns in the run carrying tool calls. */
  toolRounds: number;
  /** Consecutive identical read-only batches ending at the latest batch (0 after a write). */
  identicalStreak: number;
  lastBatchHasWrite: boolean;
  batches: ToolBatch[];
}

export function findLastUserIndex(messages: readonly ChatMessage[]): number {
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i]?.role === 'user') return i;
  }
  return -1;
}

export function inspectRun(messages: readonly ChatMessage[], writeTools: readonly string[]): RunInspection {
  const lastUserIndex = findLastUserIndex(messages);
  const writes = new Set(writeTools);
  const batches: ToolBatch[] = [];
  let identicalStreak = 0;
  let previous: ToolBatch | null = null;

  for (let i = lastUserIndex + 1; i < messages.length; i++) {
    const m = messages[i]!;
    if (m.role !== 'assistant') continue;
    let calls = callsOf(m);
    if (calls.length === 0) calls = markupCalls(messages, i);
    if (calls.length === 0) continue;
    const batch = readBatch(messages, i, calls, writes);
    batches.push(batch);
    // Writes change the world, so a repeated write is not "no progress" (seed 001): it resets the
    // streak and the batch after it starts a new one.
    if (batch.hasWrite) identicalStreak = 0;
    else if (previous !== null && !previous.hasWrite && previous.signature === batch.signature) identicalStreak++;
    else identicalStreak = 1;
    previous = batch;
  }

  return {
    lastUserIndex,
    toolRounds: batches.length,
    identicalStreak,
    lastBatchHasWrite: previous?.hasWrite ?? false,
    batches,
  };
}

/** The calls an assistant message makes: its `tool_calls`, else its legacy `function_call`. */
function callsOf(m: ChatMessage): BatchCall[] {
  if (Array.isArray(m.tool_calls) && m.tool_calls.length > 0) {
    return m.tool_calls.map((c) => ({
      id: typeof c.id === 'string' ? c.id : null,
      name: c.function?.name ?? '',
      arguments: c.function?.arguments ?? '',
      resultIndex: null,
    }));
  }
  const legacy = m.function_call as { name?: unknown; arguments?: unknown } | null | undefined;
  if (legacy === null || typeof legacy !== 'object' || typeof legacy.name !== 'string') return [];
  return [{ id: null, name: legacy.name, arguments: typeof legacy.arguments === 'string' ? legacy.arguments : '', resultIndex: null }];
}

/**
 * Calls a model wrote as markup in its text (`<tool_call>…`, tool-call-markup.ts), which the
 * client parsed and answered with `tool` messages: a tool round like any other (SPEC §5), else such
 * a loop would never meet the rounds or patience bounds. One call per answer, named as the markup
 * names them (so a write tool is known); the markup alone — not the prose or reasoning around it —
 * stands as the first call's arguments, so a repeated call is a repeated batch.
 */
function markupCalls(messages: readonly ChatMessage[], assistantIndex: number): BatchCall[] {
  const answers: ChatMessage[] = [];
  for (let j = assistantIndex + 1; j < messages.length; j++) {
    const role = messages[j]!.role;
    if (role === 'assistant' || role === 'user') break;
    if (role === 'tool' || role === 'function') answers.push(messages[j]!);
  }
  if (answers.length === 0) return [];
  const spans = markupSpans(messageText(messages[assistantIndex]!.content));
  if (spans.length === 0) return [];
  const names = spans.flatMap(markupCallNames);
  return Array.from({ length: Math.max(answers.length, names.length) }, (_, k) => {
    const answer = answers[k];
    return {
      id: typeof answer?.tool_call_id === 'string' ? answer.tool_call_id : null,
      name: names[k] ?? (typeof answer?.name === 'string' ? answer.name : ''),
      arguments: k === 0 ? spans.join('\n') : '',
      resultIndex: null,
    };
  });
}

function readBatch(messages: readonly ChatMessage[], assistantIndex: number, calls: BatchCall[], writes: Set<string>): ToolBatch {

  // The answers are the `tool` (legacy: `function`) messages up to the next assistant turn.
  // Matching stays inside that window because some models reuse ids (`call_0`) every round.
  const window: number[] = [];
  for (let j = assistantIndex + 1; j < messages.length; j++) {
    const role = messages[j]!.role;
    if (role === 'assistant' || role === 'user') break;
    if (role === 'tool' || role === 'function') window.push(j);
  }
  const used = new Set<number>();
  for (const call of calls) {
    if (call.id === null) continue;
    const j = window.find((k) => !used.has(k) && messages[k]!.tool_call_id === call.id);
    if (j !== undefined) {
      call.resultIndex = j;
      used.add(j);
    }
  }
  // Clients that drop or rewrite ids still answer in call order: pair the rest by position.
  const leftover = window.filter((k) => !used.has(k));
  for (const call of calls) {
    if (call.resultIndex === null && leftover.length > 0) call.resultIndex = leftover.shift()!;
  }

  // Parallel calls may come back in any order; the same reads with the same results are the same
  // evidence, so the signature sorts the (name, arguments, result) triples.
  const triples = calls
    .map((c) =>
      canonicalJson([
        c.name,
        canonicalArguments(c.arguments),
        c.resultIndex === null ? null : canonicalJson(messages[c.resultIndex]!.content ?? ''),
      ]),
    )
    .sort();

  return {
    assistantIndex,
    calls,
    hasWrite: calls.some((c) => writes.has(c.name)),
    signature: triples.join('\n'),
  };
}

/**
 * One link of the prefix chain: SHA-256 of the previous link and the message's digest, its first
 * 128 bits in base64url (22 characters). Ample against collisions, and a 200-message chain that
 * the ledger re-writes every turn stays ~4 KB.
 */
export function chainLink(previous: string, digest: string): string {
  return hashOnce('sha256', `${previous}|${digest}`, 'base64url').slice(0, 22);
}

/**
 * Prefix-chain hashes: `h[i] = H(h[i−1] ‖ digest(message i))`, `h[−1] = ''` (digest: see
 * metering/message-digest.ts).
 * `h[i]` identifies messages[0..i]; two requests share their first k messages exactly when their
 * `h[k−1]` match, which is how a conversation and its shared prefix are found without an id.
 */
export function chainHashes(messages: readonly ChatMessage[], known: readonly string[] = []): string[] {
  // `known`: the chain of equal leading messages, already computed (metering/prefix-memo.ts).
  const out = known.slice(0, messages.length);
  let prev = out.length > 0 ? out[out.length - 1]! : '';
  for (let i = out.length; i < messages.length; i++) {
    prev = chainLink(prev, messageDigest(messages[i]!));
    out.push(prev);
  }
  return out;
}

/**
 * A stable key for the run: which user message it answers — the last one's digest, and how many
 * user messages up to it say the same (the first "go on", the second…). The same for every request
 * of one question's research, different for the next question (even a repeated "go on": its
 * occurrence moves). Nothing else up to the question is in it, so a system prompt rewritten every
 * turn (a clock line, a changed instruction) does not start a new run with a fresh budget and
 * clock (seed 000: such a turn is charged in full, against the same research), and neither does
 * history compacted during the research (earlier turns replaced by a summary). With no user
 * message at all the key covers the leading messages before the first assistant or tool turn (the
 * system prompt), which is as stable as such a client allows. Combine it with the conversation id:
 * two conversations asking the same question have the same key.
 */
export function runKey(messages: readonly ChatMessage[], chain?: readonly string[]): string {
  const lastUser = findLastUserIndex(messages);
  if (lastUser >= 0) {
    const question = messages[lastUser]!;
    let occurrence = 1;
    for (let i = 0; i < lastUser; i++) if (messages[i]!.role === 'user' && canonicalEqual(messages[i], question)) occurrence++;
    return sha256Hex(`question ${occurrence} ${messageDigest(question)}`);
  }
  let anchor = messages.findIndex((m) => m.role === 'assistant' || m.role === 'tool') - 1;
  if (anchor < -1) anchor = messages.length - 1;
  if (anchor < 0) return sha256Hex('');
  // A caller that already has the chain of `messages` passes it: each link covers only its prefix.
  return (chain ?? chainHashes(messages.slice(0, anchor + 1)))[anchor]!;
}
