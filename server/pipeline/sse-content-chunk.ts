// The chunk a stream is mostly made of — one choice, index 0, a delta with only `content`, no
// finish — recognised from its text, without parsing the whole event: `JSON.parse` of every event
// was most of the stream relay's own work (~0.8 µs an event, ~130 events an answer). Only the two
// layouts seen from real servers are recognised; anything else (tool calls, reasoning, several
// choices, a finish, usage or timings figures) goes the full way (relay-stream.ts).
//
// A key cannot be faked from inside a string: a `"` in JSON text is written `\"`, so `"choices":`
// or `"usage":{` in the raw event are keys of the event, never part of a value.

const CONTENT = '("(?:[^"\\\\]|\\\\.)*")';

/** OpenAI: `…,"choices":[{"index":0,"delta":{"content":"…"},"logprobs":null,"finish_reason":null}]}`, maybe `,"usage":null` last. */
const OPENAI = new RegExp(`"choices":\\[\\{"index":0,"delta":\\{"content":${CONTENT}\\},(?:"logprobs":null,)?"finish_reason":null\\}\\](,"usage":null)?\\}$`);

/** llama.cpp: `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"…"}}],…` (fixtures/llamacpp). */
const LLAMACPP = new RegExp(`^\\{"choices":\\[\\{"finish_reason":null,"index":0,"delta":\\{"content":${CONTENT}\\}\\}\\],`);

const USAGE_NULL = ',"usage":null}';

export interface ContentChunk {
  /** The delta's text. */
  text: string;
  /** The event as received, less a trailing `"usage":null` (there only because the gateway asked for usage). */
  withoutUsage: string;
}

export function contentChunk(data: string): ContentChunk | null {
  const m = OPENAI.exec(data) ?? LLAMACPP.exec(data);
  if (m === null) return null;
  if (data.includes('"usage":{') || data.includes('"timings":{')) return null;
  return {
    text: JSON.parse(m[1]!) as string,
    withoutUsage: m[2] === undefined ? data : `${data.slice(0, data.length - USAGE_NULL.length)}}`,
  };
}
