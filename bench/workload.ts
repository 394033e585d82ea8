// What the load generator sends: a chat request of a realistic size (a system prompt, two earlier
// turns and a new question — about 2 KB of JSON), 128 tokens of reply. Each request's question is
// unique, so every request is a new conversation: the gateway tokenizes its new message and writes
// a fresh ledger row, as it would for distinct users (cached messages are the common case only
// within a conversation; the 100-turn benchmark measures that one).

const SYSTEM =
  'You are a careful assistant for an engineering team. Answer precisely, cite the files and ' +
  'functions you rely on, say what you are unsure about, and prefer short paragraphs over long ' +
  'lists. When a question is ambiguous, state the interpretation you chose before answering. ' +
  'Never invent APIs; if you do not know whether a function exists, say so and suggest how to check.';

const EARLIER = [
  { role: 'user', content: 'We run a Node 20 service behind a reverse proxy. Requests sometimes take 30 s to fail. Where should we look first?' },
  {
    role: 'assistant',
    content:
      'A 30 s failure usually means a timeout somewhere on the path rather than in your handler. Check, in order: ' +
      'the proxy upstream timeout, the keep-alive timeout of your HTTP server compared with the proxy idle timeout ' +
      '(the server must keep connections open longer than the proxy), and the headers timeout of any outbound ' +
      'client. Log the time at which the request reached your process to tell the two apart.',
  },
];

export function chatBody(i: number, stream: boolean): string {
  return JSON.stringify({
    model: 'gpt-4o-mini',
    messages: [
      { role: 'system', content: SYSTEM },
      ...EARLIER,
      { role: 'user', content: `Request ${i}: the proxy times out at 60 s and our server keep-alive is 5 s. Could that explain intermittent 502s under load, and what values would you pick?` },
    ],
    max_tokens: 256,
    stream,
    // Asked for by every target alike, so the upstream does the same work for each (the gateway
    // forces it on anyway).
    ...(stream ? { stream_options: { include_usage: true } } : {}),
  });
}
