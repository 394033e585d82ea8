// The reserved final answer of a run (SPEC §5, seed 001, ADR 0007): the same conversation, sent
// with no tools offered and one added instruction to answer from the evidence gathered so far.

import type { ChatMessage } from '../types.js';
import type { FinalReason } from './bounds.js';

/** Request fields that offer or steer tools; none of them may reach the upstream in a final turn. */
const TOOL_FIELDS = ['tools', 'tool_choice', 'parallel_tool_calls', 'functions', 'function_call'] as const;

export const FINAL_ANSWER_INSTRUCTION = [
  'The research for this question is over: no tools are available any more.',
  "Answer the user's last question now, using only the evidence already gathered in this conversation (the tool results above).",
  'Cite the sources you relied on (URLs, file paths, documents or tool names).',
  'Say plainly what remains uncertain and what information is missing.',
  'Do not call, propose or write out any tool call.',
].join(' ');

/** True when the request offers tools, in the current (`tools`) or legacy (`functions`) form. */
export function offersTools(body: { [k: string]: unknown }): boolean {
  const nonEmpty = (v: unknown) => Array.isArray(v) && v.length > 0;
  return nonEmpty(body.tools) || nonEmpty(body.functions);
}

/**
 * A copy of the request for the final turn: the tool fields removed, the original question and
 * every tool exchange kept (the evidence is in them; llama.cpp's ChatML template renders assistant
 * `tool_calls` and `tool` messages with no `tools` offered), and the instruction appended as a
 * last `system` message.
 *
 * Why `system` and not `developer`: every OpenAI-compatible server knows `system` (OpenAI maps it
 * to `developer` for reasoning models itself), while many llama.cpp chat templates know no
 * `developer` role and drop or reject it. A template that rejects a system message after the first
 * turn makes the final turn fail, which the caller answers with the evidence excerpt — so the
 * worst case is still an answer.
 */
export function toFinalAnswerRequest<T extends { messages: ChatMessage[] }>(body: T): T {
  const copy: Record<string, unknown> = { ...body };
  for (const field of TOOL_FIELDS) delete copy[field];
  const instruction: ChatMessage = { role: 'system', content: FINAL_ANSWER_INSTRUCTION };
  copy.messages = [...body.messages, instruction];
  return copy as T;
}

/** The value of `x-tollgate-notice` on a final-answer response. */
export function noticeHeader(reason: FinalReason): string {
  return `finishing-the-answer; reason=${reason}`;
}
