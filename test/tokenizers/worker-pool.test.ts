// The counting worker pool on its own (ADR 0009): lazy start, same counts as the main thread,
// errors reject, a crashed worker is replaced, close() ends the workers, and an idle pool never
// keeps a process alive.
import t from 'tap';
import { spawn } from 'node:child_process';
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import { countBounded } from '../../metering/tokenizers/bounded-encode.js';
import { CountPool, CountPoolError, LARGE_JOB_CHARS } from '../../metering/tokenizers/count-pool.js';
import { base64, multiByte, noSpaceRuns, prose, rng } from './worker-texts.js';

t.test('workers start lazily and count exactly what countBounded counts inline', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  t.same(pool.stats(), { jobs: 0, started: 0, crashed: 0, live: 0, inFlight: 0 }, 'no worker before the first job');

  const texts = [prose(40_000), base64(40_000), noSpaceRuns(20_000), multiByte(20_000), '', 'hi'];
  for (const encoding of ['o200k_base', 'cl100k_base'] as const) {
    const inWorker = await pool.count(encoding, texts);
    t.same(inWorker, texts.map((text) => countBounded(encoding, text)), `${encoding}: identical to inline`);
  }
  t.match(pool.stats(), { jobs: 2, started: 1, live: 1, inFlight: 0 }, 'one worker, reused by both jobs');
});

t.test('size is 1 or 2; a second worker starts only while the first is busy', async (t) => {
  t.throws(() => new CountPool({ size: 0 }), RangeError);
  t.throws(() => new CountPool({ size: 3 }), RangeError);
  const pool = new CountPool({ size: 2 });
  t.teardown(() => pool.close());
  const big = base64(200_000);
  const counts = await Promise.all([1, 2, 3].map(() => pool.count('o200k_base', [big])));
  t.equal(new Set(counts.map((c) => c[0].tokens)).size, 1, 'every worker gives the same count');
  t.match(pool.stats(), { jobs: 3, started: 2, live: 2 }, 'three concurrent jobs, never more than two workers');
});

t.test('an error inside a worker rejects that count and leaves the worker serving', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  const unknown: string = 'no_such_encoding';
  await t.rejects(pool.count(unknown as TiktokenEncoding, ['text']), CountPoolError);
  t.same(await pool.count('o200k_base', ['hello world']), [{ tokens: 2, split: false }]);
  t.match(pool.stats(), { started: 1, crashed: 0, live: 1 }, 'same worker, not replaced');
});

t.test('a crashed worker rejects its jobs in flight and is replaced by the next job', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  // 1. warm the worker, then queue a count behind a crash on the same (only) worker
  await pool.count('o200k_base', ['warm']);
  const crash = pool.crashOne();
  const queued = t.rejects(pool.count('o200k_base', [prose(10_000)]), { name: 'CountPoolError', message: /exited with code 70/ });
  await crash;
  // 2. the queued job fails rather than hangs
  await queued;
  t.match(pool.stats(), { crashed: 1, live: 0, inFlight: 0 });
  // 3. the next job starts a fresh worker and counts correctly
  const text = multiByte(5_000);
  t.same(await pool.count('cl100k_base', [text]), [countBounded('cl100k_base', text)]);
  t.match(pool.stats(), { started: 2, crashed: 1, live: 1 });
});

t.test('close() ends the workers, rejects jobs in flight, and refuses later jobs', async (t) => {
  const pool = new CountPool({ size: 2 });
  await pool.count('o200k_base', ['warm']);
  const inFlight = t.rejects(pool.count('o200k_base', [base64(500_000)]), CountPoolError);
  await pool.close();
  await inFlight;
  t.match(pool.stats(), { live: 0, inFlight: 0, crashed: 0 }, 'a requested end is not a crash');
  await t.rejects(pool.count('o200k_base', ['after close']), { message: /closed/ });
});

t.test('an idle pool never keeps the process alive (workers are unref’d)', async (t) => {
  // A child process counts through a pool it never closes; it must still exit by itself, and
  // print the count (the worker was ref'd while its job was in flight).
  const poolUrl = new URL('../../metering/tokenizers/count-pool.ts', import.meta.url).href;
  const code = `
    import { CountPool } from ${JSON.stringify(poolUrl)};
    const pool = new CountPool();
    const [c] = await pool.count('o200k_base', ['hello world']);
    console.log(JSON.stringify(c));
  `;
  const child = spawn(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', code], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr.on('data', (b: Buffer) => (err += b.toString()));
  const exitCode = await new Promise<number | null>((resolve) => child.on('exit', resolve));
  t.equal(exitCode, 0, err);
  t.same(JSON.parse(out), { tokens: 2, split: false });
});

// An outside audit: one request with 30 MB of random words held the only counting worker for 14 s,
// and every other request with more than 16 KiB of new text waited behind it (13 s for 45 KB).
t.test('a job over 1 Mi characters has a worker of its own: smaller counts are not queued behind it', async (t) => {
  const pool = new CountPool();
  t.teardown(() => pool.close());
  // Random words of 12 letters: byte-pair encoding's slowest common case (about 2 MB a second).
  const r = rng(7);
  const words: string[] = [];
  for (let n = 0; n <= 3 * LARGE_JOB_CHARS; n += 13) words.push(Array.from({ length: 12 }, () => String.fromCharCode(97 + Math.floor(r() * 26))).join(''));
  const huge = words.join(' ');
  await pool.count('o200k_base', [prose(20_000)]); // the worker for ordinary counts is up
  const finished: string[] = [];
  const big = pool.count('o200k_base', [huge]).then((c) => {
    finished.push('huge');
    return c;
  });
  const small = pool.count('o200k_base', [prose(40_000, 3)]).then((c) => {
    finished.push('small');
    return c;
  });
  const [bigCount, smallCount] = await Promise.all([big, small]);
  t.same(finished, ['small', 'huge'], 'the small count did not wait for the huge one');
  t.same(bigCount, [countBounded('o200k_base', huge)], 'the huge count is exact all the same');
  t.same(smallCount, [countBounded('o200k_base', prose(40_000, 3))]);
  t.match(pool.stats(), { started: 2, live: 2, inFlight: 0 }, 'one worker for each');
});
