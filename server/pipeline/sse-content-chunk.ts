// The chunk a stream is mostly made of — one choice, index 0, a delta with only `content`, no
// finish — recognised from its text, without parsing the whole event: `JSON.parse` of every event
// was most of the stream relay's own work (~0.8 µs an event, ~130 events an answer). Only the two
// layouts seen from real servers are recognised; anything else (tool calls, reasoning, several
// choices, a finish, usage or timings figures) goes the full way (relay-stream.ts), and so does
// anything this file is unsure of: answering null is always safe.
//
// A key cannot be faked from inside a string: a `"` in JSON text is written `\"`, so `"choices":`
// or `"usage":{` in the raw event are keys of the event, never part of a value.
//
// Plain string searches, and none for a pattern that starts with `"`: V8 searches those slowly,
// and `includes('"usage":{')` alone cost more than the rest of the recognition (~0.17 µs an event).

/**
 * OpenAI: `…,"choices":[{"index":0,"delta":{"content":"…"},"logprobs":null,"finish_reason":null}]`,
 * then maybe `,"usage":null` (the gateway asks for usage) and `,"obfuscation":"…"` (random padding
 * OpenAI adds by default against side channels), then `}`.
 */
const CHOICES_KEY = 'choices":';
const OPENAI_OPEN = `${CHOICES_KEY}[{"index":0,"delta":{"content":"`;
const OPENAI_CLOSE = '},"finish_reason":null}]';
const OPENAI_CLOSE_LOGPROBS = '},"logprobs":null,"finish_reason":null}]';

/** llama.cpp: `{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"…"}}],…` (fixtures/llamacpp). */
const LLAMACPP_OPEN = '{"choices":[{"finish_reason":null,"index":0,"delta":{"content":"';
const LLAMACPP_CLOSE = '}}],';

const USAGE_NULL = ',"usage":null';
const OBFUSCATION = ',"obfuscation":"';

export interface ContentChunk {
  /** The delta's text. */
  text: string;
  /** The event as received, less a trailing `"usage":null` (there only because the gateway asked for usage). */
  withoutUsage: string;
  /** A member other than the delta's text (the id, the model, the padding) holds a JSON escape: read as written, it may say more than it shows. */
  escapedElsewhere: boolean;
}

/**
 * The JSON string whose text starts at `from` (just past its opening quote): its text and the
 * index of its closing quote, or null when it does not close or is not valid JSON text.
 */
function stringAt(data: string, from: number): { text: string; close: number } | null {
  let plain = true;
  for (let i = from; i < data.length; i++) {
    const c = data.charCodeAt(i);
    if (c === 0x22) {
      if (plain) return { text: data.slice(from, i), close: i };
      try {
        return { text: JSON.parse(data.slice(from - 1, i + 1)) as string, close: i };
      } catch {
        return null; // a raw control character, or a bad escape: not for the fast path
      }
    }
    if (c === 0x5c) {
      plain = false;
      i++; // the escaped character, whatever it is, does not end the string
    } else if (c < 0x20) {
      plain = false;
    }
  }
  return null;
}

function openai(data: string): ContentChunk | null {
  const open = data.indexOf(OPENAI_OPEN);
  // `choices` is a key of the event itself: its quote opens it, and `{` or `,` comes before.
  if (open < 2 || data.charCodeAt(0) !== 0x7b || data.charCodeAt(open - 1) !== 0x22) return null;
  const before = data.charCodeAt(open - 2);
  if (before !== 0x7b && before !== 0x2c) return null;
  // Members before `choices` are scalars (id, object, created, model…): the first `[` and the
  // first `{` after the event's own are the choices' — an object or array among those members,
  // such as usage or timings figures, goes the full way.
  const bracket = open + CHOICES_KEY.length;
  if (data.indexOf('[') !== bracket || data.indexOf('{', 1) !== bracket + 1) return null;
  const s = stringAt(data, open + OPENAI_OPEN.length);
  if (s === null) return null;
  let at = s.close + 1;
  if (data.startsWith(OPENAI_CLOSE, at)) at += OPENAI_CLOSE.length;
  else if (data.startsWith(OPENAI_CLOSE_LOGPROBS, at)) at += OPENAI_CLOSE_LOGPROBS.length;
  else return null;
  // After the choices only the usage placeholder and the padding may follow, in that order.
  const usage = data.startsWith(USAGE_NULL, at) ? at : -1;
  if (usage !== -1) at += USAGE_NULL.length;
  if (data.startsWith(OBFUSCATION, at)) {
    const pad = stringAt(data, at + OBFUSCATION.length);
    if (pad === null) return null;
    at = pad.close + 1;
  }
  if (at !== data.length - 1 || data.charCodeAt(at) !== 0x7d) return null;
  const escapedElsewhere = data.lastIndexOf('\\', open) !== -1 || data.indexOf('\\', s.close + 1) !== -1;
  return { text: s.text, withoutUsage: usage === -1 ? data : data.slice(0, usage) + data.slice(usage + USAGE_NULL.length), escapedElsewhere };
}

function llamacpp(data: string): ContentChunk | null {
  const s = stringAt(data, LLAMACPP_OPEN.length);
  if (s === null || !data.startsWith(LLAMACPP_CLOSE, s.close + 1)) return null;
  // Members after `choices` are scalars (created, id, model…): an object or array among them, such
  // as the usage or timings figures or a second `choices`, goes the full way; so does an event
  // that does not end as an object does.
  const tail = s.close + 1 + LLAMACPP_CLOSE.length;
  if (data.indexOf('{', tail) !== -1 || data.indexOf('[', tail) !== -1 || data.charCodeAt(data.length - 1) !== 0x7d) return null;
  return { text: s.text, withoutUsage: data, escapedElsewhere: data.indexOf('\\', s.close + 1) !== -1 };
}

export function contentChunk(data: string): ContentChunk | null {
  // llama.cpp's events start with their choices; OpenAI's with an id.
  return data.startsWith(LLAMACPP_OPEN) ? llamacpp(data) : openai(data);
}
