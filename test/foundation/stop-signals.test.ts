// The stop signals keep one listener each while what they do changes (server/stop-signals.ts): a
// moment with none let Node drop a signal that came while the start held the event loop.
import t from 'tap';
import { STOP_SIGNALS, routeStopSignals, type StopSignal } from '../../server/stop-signals.js';

t.test('a stop signal goes to the handler of the moment, and no signal is ever left without a listener', async (t) => {
  const before = STOP_SIGNALS.map((s) => process.listenerCount(s));
  const got: string[] = [];
  const signals = routeStopSignals((s: StopSignal) => got.push(`starting:${s}`));
  t.teardown(() => signals.close());
  const counts = () => STOP_SIGNALS.map((s, i) => process.listenerCount(s) - before[i]!);
  t.same(counts(), [1, 1, 1], 'one listener a signal');
  process.emit('SIGTERM', 'SIGTERM');
  signals.route((s) => got.push(`serving:${s}`));
  t.same(counts(), [1, 1, 1], 'still one a signal when what they do changes: none was taken off');
  process.emit('SIGINT', 'SIGINT');
  process.emit('SIGHUP', 'SIGHUP');
  t.same(got, ['starting:SIGTERM', 'serving:SIGINT', 'serving:SIGHUP']);
  signals.close();
  t.same(counts(), [0, 0, 0]);
});
