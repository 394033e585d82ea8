// Incremental SSE framing (server/pipeline/sse.ts): however the upstream's bytes are cut into
// reads, the same events come out as from the whole stream in one read.

import t from 'tap';
import { MAX_EVENT_CHARS, SseEventTooLarge, SseParser, type SseEvent } from '../../server/pipeline/sse.js';

function parse(pieces: Buffer[]): SseEvent[] {
  const p = new SseParser();
  const events: SseEvent[] = [];
  for (const piece of pieces) events.push(...p.push(piece));
  events.push(...p.end());
  return events;
}

t.test('every cut into two reads gives the events of one read, CRLF and multi-byte text included', async (t) => {
  const stream = Buffer.from(
    [
      'data: {"choices":[{"index":0,"delta":{"content":"café 🎉"}}]}',
      ': a comment',
      'event: error\r\ndata: {"error":{"message":"overloaded"}}',
      'data: {"choices":[{"index":0,"delta":{"content":"naïve"}}]}',
      'data: [DONE]',
    ].join('\r\n\r\n') + '\r\n\r\n',
  );
  const whole = parse([stream]);
  t.equal(whole.length, 5);
  t.same(whole[2], { data: '{"error":{"message":"overloaded"}}', raw: 'event: error\ndata: {"error":{"message":"overloaded"}}', event: 'error' });
  t.equal(whole[0]!.data, '{"choices":[{"index":0,"delta":{"content":"café 🎉"}}]}');
  let differing = 0;
  for (let cut = 1; cut < stream.length; cut++) {
    const events = parse([stream.subarray(0, cut), stream.subarray(cut)]);
    if (JSON.stringify(events) !== JSON.stringify(whole)) {
      differing++;
      t.fail(`cut at byte ${cut} (${JSON.stringify(stream.subarray(cut - 2, cut + 2).toString('latin1'))}) gave other events`, { found: events, wanted: whole });
    }
  }
  t.equal(differing, 0, 'no cut changes the events');
});

t.test('a stream cut into one-byte reads; a last event without its blank line', async (t) => {
  const text = 'data: {"a":1}\n\ndata: {"b":"ü"}\r\rdata: {"c":3}';
  const bytes = Buffer.from(text);
  const pieces = [...bytes].map((b) => Buffer.from([b]));
  t.same(
    parse(pieces).map((e) => e.data),
    ['{"a":1}', '{"b":"ü"}', '{"c":3}'],
  );
});

t.test('a byte order mark before the first event is not part of it', async (t) => {
  const bom = Buffer.from([0xef, 0xbb, 0xbf]);
  const body = Buffer.from('data: {"a":1}\n\ndata: {"b":2}\n\n');
  t.same(parse([Buffer.concat([bom, body])]).map((e) => e.data), ['{"a":1}', '{"b":2}']);
  // Split inside the mark itself, too.
  t.same(parse([bom.subarray(0, 2), Buffer.concat([bom.subarray(2), body])]).map((e) => e.data), ['{"a":1}', '{"b":2}']);
});

t.test('CR-only line ends: an event is given out by the read that completes it', async (t) => {
  const p = new SseParser();
  t.same(p.push(Buffer.from('data: {"a":1}\r\r')).map((e) => e.data), ['{"a":1}'], 'not held until the next read');
  t.same(p.push(Buffer.from('data: [DONE]\r\r')).map((e) => e.data), ['[DONE]']);
  // A CRLF split after its CR: the LF that follows is the same line end, not a blank line.
  const q = new SseParser();
  t.same(q.push(Buffer.from('event: error\r')), []);
  t.same(q.push(Buffer.from('\ndata: {"error":{"message":"x"}}\r\n\r\n')), [{ data: '{"error":{"message":"x"}}', raw: 'event: error\ndata: {"error":{"message":"x"}}', event: 'error' }]);
});

t.test('an event read in many pieces is whole once its blank line comes, the blank line itself split across reads', async (t) => {
  const p = new SseParser();
  const content = 'x'.repeat(100_000);
  const event = `data: {"choices":[{"index":0,"delta":{"content":"${content}"}}]}`;
  const bytes = Buffer.from(`${event}\n\ndata: [DONE]\n\n`);
  const events: SseEvent[] = [];
  // The blank line itself split across two reads, after 1,000 reads of the event.
  const cut = bytes.indexOf('\n\n') + 1;
  for (let at = 0; at < cut; at += 100) events.push(...p.push(bytes.subarray(at, Math.min(at + 100, cut))));
  t.same(events, [], 'nothing yet: the event has not ended');
  events.push(...p.push(bytes.subarray(cut)));
  t.same(events.map((e) => e.data), [event.slice(6), '[DONE]']);
});

t.test('an event that grows past MAX_EVENT_CHARS without ending is refused, not held for ever', async (t) => {
  const p = new SseParser();
  p.push(Buffer.from('data: {"a":1}\n\n'));
  const piece = Buffer.from('data: ' + 'y'.repeat(1024 * 1024 - 6) + '\n');
  let pushed = 0;
  const err = (() => {
    try {
      for (;;) {
        p.push(piece);
        pushed += piece.length;
        if (pushed > 2 * MAX_EVENT_CHARS) return null;
      }
    } catch (e) {
      return e;
    }
  })();
  t.ok(err instanceof SseEventTooLarge, 'SseEventTooLarge');
  t.ok(pushed <= MAX_EVENT_CHARS, `refused once past the bound (${pushed} chars held before the last read)`);
});
