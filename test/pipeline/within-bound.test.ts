// The bound an answer's count is asked within (count-answer.ts `withinBound`): it aborts the work
// on time or with the request's own signal, and leaves nothing attached to that signal after.
import t from 'tap';
import { getEventListeners } from 'node:events';
import { withinBound } from '../../server/pipeline/count-answer.js';

/** Work that ends only when its signal is aborted, with the abort's reason. */
const untilAborted = (signal: AbortSignal) =>
  new Promise<string>((resolve) => signal.addEventListener('abort', () => resolve(String((signal.reason as Error).message ?? signal.reason)), { once: true }));

t.test('work that ends in time gets its value through, and the long-lived signal keeps no listener', async (t) => {
  const drain = new AbortController();
  for (let i = 0; i < 100; i++) t.equal(await withinBound(drain.signal, 1_000, async () => i), i);
  t.equal(getEventListeners(drain.signal, 'abort').length, 0, 'no listener left behind');
});

t.test('work still going at the bound is aborted then', async (t) => {
  const drain = new AbortController();
  t.equal(await withinBound(drain.signal, 20, untilAborted), 'no answer within 20 ms');
  t.equal(getEventListeners(drain.signal, 'abort').length, 0);
  t.notOk(drain.signal.aborted, 'the outer signal is not touched');
});

t.test('the outer signal aborts the work, before or during it', async (t) => {
  const during = new AbortController();
  const pending = withinBound(during.signal, 60_000, untilAborted);
  during.abort(new Error('draining'));
  t.equal(await pending, 'draining');
  const before = new AbortController();
  before.abort(new Error('already'));
  t.equal(await withinBound(before.signal, 60_000, async (s) => (s.aborted ? 'aborted at once' : 'not')), 'aborted at once');
});
