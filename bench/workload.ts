// What the load generator sends: a chat request of about 1 KB of JSON — a system prompt, one
// earlier exchange (a user turn and the assistant's answer) and a new question — with
// `max_tokens: 256`; the upstream replies with 128 tokens. Each request's question carries its
// request number, so every body is unique and every request is a new conversation: the gateway
// tokenizes its new message and writes a fresh ledger row, as it would for distinct users (cached
// messages are the common case only within a conversation; the 100-turn benchmark measures that).

const SYSTEM =
  'You are a careful assistant for an engineering team. Answer precisely, cite the files and ' +
  'functions you rely on, say what you are unsure about, and prefer short paragraphs over long ' +
  'lists. When a question is ambiguous, say which reading you chose. Never invent APIs; if you ' +
  'are not sure a function exists, say how to check.';

const EARLIER = [
  { role: 'user', content: 'Our Node 20 service sits behind a reverse proxy. Requests sometimes take 30 s to fail. Where should we look first?' },
  {
    role: 'assistant',
    content:
      'A 30 s failure usually means a timeout on the path rather than in your handler. Check the proxy ' +
      'upstream timeout, then the keep-alive timeout of your server against the proxy idle timeout, then ' +
      'the headers timeout of any outbound client. Log when each request reached your process.',
  },
];

export function chatBody(i: number, stream: boolean): string {
  return JSON.stringify({
    model: 'gpt-4o-mini',
    messages: [
      { role: 'system', content: SYSTEM },
      ...EARLIER,
      { role: 'user', content: `Request ${i}: the proxy times out at 60 s and our keep-alive is 5 s. Could that explain the intermittent 502s we see under load?` },
    ],
    max_tokens: 256,
    stream,
    // Asked for by every target alike, so the upstream does the same work for each (the gateway
    // forces it on anyway).
    ...(stream ? { stream_options: { include_usage: true } } : {}),
  });
}
