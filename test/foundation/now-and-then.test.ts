import t from 'tap';
import { NowAndThen } from '../../server/log-now-and-then.js';

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
