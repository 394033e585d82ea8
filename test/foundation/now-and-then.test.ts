import t from 'tap';
import { NowAndThen } from '../../server/log-now-and-then.js';
import { HOUR_MS, sleep, steppableWallClock } from '../helpers/wall-clock.js';

t.test('a lasting state is written once, then at most once a minute, saying how many were held back', async (t) => {
  const now = { ms: 0 };
  const w = new NowAndThen(() => now.ms);
  t.same(w.due('a'), { heldBack: 0 }, 'the first time');
  t.equal(w.due('a'), null);
  t.same(w.due('b'), { heldBack: 0 }, 'each key on its own');
  now.ms = 59_999;
  t.equal(w.due('a'), null);
  now.ms = 60_000;
  t.same(w.due('a'), { heldBack: 2 }, 'a minute on: written again, with the two held back');
  t.equal(w.due('a'), null);
});

t.test('a warning is written again once its time has passed, though the wall clock is stepped back an hour (regression)', async (t) => {
  const wall = steppableWallClock(t);
  // The gateway's own clock (the default), with 50 ms for a minute.
  const w = new NowAndThen(undefined, 50);
  t.same(w.due('a'), { heldBack: 0 });
  wall.step(-HOUR_MS);
  await sleep(80);
  t.same(w.due('a'), { heldBack: 0 }, 'written again, not silent for an hour');
});
