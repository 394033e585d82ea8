// A stream request that an upstream answered with a whole completion (`application/json`) — some
// OpenAI-compatible servers do not stream every request (Ollama did not stream tool calls, a proxy
// in front of a server that cannot stream): the answer is good and was paid for, so the client gets
// it in the form it asked for, as the chunks a streaming server would have sent — one a choice,
// with its whole message as the delta and its finish — rather than a 502 for an answer it could use.

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** The delta that carries a chat message whole: tool calls get the `index` a stream gives them. */
function deltaOf(message: Json): Json {
  const delta: Json = { ...message };
  if (Array.isArray(message.tool_calls)) delta.tool_calls = message.tool_calls.map((c, index) => (isObject(c) ? { index, ...c } : c));
  return delta;
}

/** The data chunks of `completion` (a chat or text completion object) as a stream; no usage chunk, no [DONE]. */
export function completionChunks(completion: Json, chat: boolean): Json[] {
  const { choices, usage: _u, object: _o, ...meta } = completion;
  const object = chat ? 'chat.completion.chunk' : 'text_completion';
  const out: Json[] = [];
  for (const choice of Array.isArray(choices) ? choices : []) {
    if (!isObject(choice)) continue;
    const { message, finish_reason: finish, ...rest } = choice;
    const piece = chat ? { ...rest, delta: isObject(message) ? deltaOf(message) : {}, finish_reason: finish ?? 'stop' } : { ...rest, finish_reason: finish ?? 'stop' };
    out.push({ ...meta, object, choices: [piece] });
  }
  return out;
}
