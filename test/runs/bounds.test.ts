import t from 'tap';
import type { ChatMessage } from '../../metering/types.js';
import {
  DEFAULT_RUN_BOUNDS,
  answerReserveFor,
  decideMode,
  mergeRunBounds,
  validateRunBounds,
  type ModeInput,
  type RunBounds,
} from '../../metering/runs/bounds.js';
import { inspectRun } from '../../metering/runs/run-state.js';
import { CLOCK_SKEW_TOLERANCE_MS } from '../../metering/clock-skew.js';

const T0 = 1_700_000_000_000;

/** A request in the middle of a run with nothing near any bound, unless overridden. */
type Over = Partial<Omit<ModeInput, 'bounds' | 'run'>> & { bounds?: Partial<RunBounds>; run?: ModeInput['run'] };
function input(over: Over = {}): ModeInput {
  return {
    offersTools: true,
    now: T0,
    runStartedAt: T0,
    remainingTokens: 60_000,
    neededTokens: 2_000,
    ...over,
    run: { toolRounds: 1, identicalStreak: 1, ...over.run },
    bounds: mergeRunBounds(DEFAULT_RUN_BOUNDS, over.bounds),
  };
}

t.test('defaults', async (t) => {
  t.same(DEFAULT_RUN_BOUNDS, { maxToolRounds: 12, tokenBudget: 65_536, timeBudgetSeconds: 300, patience: 3, answerReserveTokens: null });
  t.ok(Object.isFrozen(DEFAULT_RUN_BOUNDS));
});

t.test('the answer reserve: as configured, else 1,024 whatever the budget (SPEC §11)', async (t) => {
  const withBudget = (answerReserveTokens: number | null, tokenBudget: number | null): RunBounds => ({ ...DEFAULT_RUN_BOUNDS, answerReserveTokens, tokenBudget });
  t.equal(answerReserveFor(withBudget(null, 65_536)), 1024);
  t.equal(answerReserveFor(withBudget(null, 4096)), 1024);
  t.equal(answerReserveFor(withBudget(null, 3000)), 1024);
  t.equal(answerReserveFor(withBudget(null, 1000)), 1024);
  t.equal(answerReserveFor(withBudget(null, null)), 1024);
  t.equal(answerReserveFor(withBudget(300, 1000)), 300);
  t.equal(answerReserveFor(withBudget(0, 1000)), 0);
});

t.test('validateRunBounds names the bad field', async (t) => {
  const bad = validateRunBounds({ maxToolRounds: 65, patience: 2.5, answerReserveTokens: null, maxToolRound: 3 });
  t.equal(bad.ok, false);
  if (bad.ok) return;
  t.match(bad.errors, [
    /^runs\.maxToolRounds: must be an integer from 1 to 64/,
    /^runs\.patience: must be an integer from 1 to 100/,
    /^runs\.answerReserveTokens: must be an integer from 0 to 1048576$/,
    /^runs\.maxToolRound: unknown field$/,
  ]);

  const keyPath = validateRunBounds({ timeBudgetSeconds: 0 }, 'auth.keys[2].runs');
  t.same(keyPath.ok ? [] : keyPath.errors, ['auth.keys[2].runs.timeBudgetSeconds: must be an integer from 1 to 86400, or null to turn it off']);

  const reserve = validateRunBounds({ tokenBudget: 1000, answerReserveTokens: 1000 });
  t.same(reserve.ok ? [] : reserve.errors, ['runs.answerReserveTokens: must be less than runs.tokenBudget (1000)']);

  t.same(validateRunBounds('12'), { ok: false, errors: ['runs: must be an object'] });
});

t.test('validateRunBounds accepts in-range values, null to turn a bound off, and writeTools', async (t) => {
  t.same(validateRunBounds({ maxToolRounds: 64, tokenBudget: null, patience: null, writeTools: ['save'] }), {
    ok: true,
    value: { maxToolRounds: 64, tokenBudget: null, patience: null },
  });
  t.same(validateRunBounds({ maxToolRounds: 1 }), { ok: true, value: { maxToolRounds: 1 } });
  t.same(validateRunBounds(undefined), { ok: true, value: {} });
});

t.test('mergeRunBounds: later overrides win; undefined keeps, null turns off', async (t) => {
  const tenant = { maxToolRounds: 6, patience: null };
  const key = { maxToolRounds: 8, timeBudgetSeconds: undefined };
  const merged = mergeRunBounds(DEFAULT_RUN_BOUNDS, tenant, undefined, key);
  t.same(merged, { ...DEFAULT_RUN_BOUNDS, maxToolRounds: 8, patience: null });
  t.equal(DEFAULT_RUN_BOUNDS.maxToolRounds, 12, 'base untouched');
});

t.test('rounds: with N=2 the request after the 2nd round is the final answer', async (t) => {
  const q: ChatMessage[] = [{ role: 'user', content: 'q' }];
  const roundMsgs = (n: number, answer: string): ChatMessage[] => [
    { role: 'assistant', tool_calls: [{ id: `c${n}`, type: 'function', function: { name: 'search', arguments: `{"n":${n}}` } }] },
    { role: 'tool', tool_call_id: `c${n}`, content: answer },
  ];
  const bounds = { maxToolRounds: 2 };
  // 1. the question alone, 2. after one round: normal; 3. after the second round: final.
  t.same(decideMode(input({ bounds, run: inspectRun(q, []) })), { mode: 'normal' });
  t.same(decideMode(input({ bounds, run: inspectRun([...q, ...roundMsgs(1, 'a')], []) })), { mode: 'normal' });
  t.same(decideMode(input({ bounds, run: inspectRun([...q, ...roundMsgs(1, 'a'), ...roundMsgs(2, 'b')], []) })), {
    mode: 'final-answer',
    reason: 'rounds',
  });
});

t.test('patience', async (t) => {
  t.same(decideMode(input({ run: { toolRounds: 3, identicalStreak: 2 } })), { mode: 'normal' });
  t.same(decideMode(input({ run: { toolRounds: 3, identicalStreak: 3 } })), { mode: 'final-answer', reason: 'patience' });
  t.same(decideMode(input({ run: { toolRounds: 9, identicalStreak: 9 }, bounds: { patience: null } })), { mode: 'normal' }, 'off');
});

t.test('time, with an injected clock', async (t) => {
  const started = T0 - 300_000;
  t.same(decideMode(input({ runStartedAt: started, now: T0 - 1 })), { mode: 'normal' });
  t.same(decideMode(input({ runStartedAt: started, now: T0 })), { mode: 'final-answer', reason: 'time' });
  t.same(decideMode(input({ runStartedAt: null, now: T0 })), { mode: 'normal' }, 'the first request starts the clock');
  t.same(decideMode(input({ runStartedAt: started, now: T0, bounds: { timeBudgetSeconds: null } })), { mode: 'normal' }, 'off');
});

t.test('time: a start further ahead than clocks differ (a clock stepped back) ends the run with its answer; a replica a little ahead does not', async (t) => {
  const hour = 3_600_000;
  // The clock stepped back an hour after the run began, and ten real minutes passed.
  t.same(decideMode(input({ runStartedAt: T0 + hour - 600_000, now: T0 })), { mode: 'final-answer', reason: 'time' }, 'not a run without a time bound');
  t.same(decideMode(input({ runStartedAt: T0 + CLOCK_SKEW_TOLERANCE_MS, now: T0 })), { mode: 'normal' }, 'begun on a replica a little ahead: just begun');
  t.same(decideMode(input({ runStartedAt: T0 + hour, now: T0, bounds: { timeBudgetSeconds: null } })), { mode: 'normal' }, 'no time bound: nothing to end');
});

t.test('tokens: a tools request must leave the answer reserve', async (t) => {
  // remaining 5000, reserve 1024: a round may use 3976.
  t.same(decideMode(input({ remainingTokens: 5000, neededTokens: 3976 })), { mode: 'normal' });
  t.same(decideMode(input({ remainingTokens: 5000, neededTokens: 3977 })), { mode: 'final-answer', reason: 'tokens' });
  t.same(decideMode(input({ remainingTokens: 5000, neededTokens: 5000 })), { mode: 'final-answer', reason: 'tokens' }, 'uses the reserve');
  t.same(decideMode(input({ remainingTokens: 5000, neededTokens: 5001 })), {
    mode: 'refuse-tokens',
    remainingTokens: 5000,
    neededTokens: 5001,
  });
  t.same(
    decideMode(input({ remainingTokens: 5000, neededTokens: 5200, finalNeededTokens: 4800 })),
    { mode: 'final-answer', reason: 'tokens' },
    'the final request, without tool definitions, fits',
  );
  t.same(decideMode(input({ remainingTokens: null, neededTokens: 10_000_000 })), { mode: 'normal' }, 'no budget');
  t.same(decideMode(input({ remainingTokens: 5000, neededTokens: 4500, bounds: { answerReserveTokens: 0 } })), { mode: 'normal' });
});

t.test('a request without tools is an answer: no reserve, only room for itself', async (t) => {
  t.same(decideMode(input({ offersTools: false, remainingTokens: 5000, neededTokens: 5000 })), { mode: 'normal' });
  t.same(decideMode(input({ offersTools: false, remainingTokens: 5000, neededTokens: 5001 })), {
    mode: 'refuse-tokens',
    remainingTokens: 5000,
    neededTokens: 5001,
  });
  t.same(
    decideMode(input({ offersTools: false, run: { toolRounds: 40, identicalStreak: 10 }, runStartedAt: 0 })),
    { mode: 'normal' },
    'bounds reached, but nothing to take away',
  );
});

t.test('a final answer that cannot fit even the whole remainder is refused', async (t) => {
  t.same(decideMode(input({ run: { toolRounds: 12, identicalStreak: 1 }, remainingTokens: 900, neededTokens: 1200, finalNeededTokens: 901 })), {
    mode: 'refuse-tokens',
    remainingTokens: 900,
    neededTokens: 901,
  });
});

t.test('precedence: rounds, patience, time, tokens', async (t) => {
  const all = { run: { toolRounds: 12, identicalStreak: 3 }, runStartedAt: T0 - 400_000, remainingTokens: 2000, neededTokens: 1500 };
  t.same(decideMode(input(all)), { mode: 'final-answer', reason: 'rounds' });
  t.same(decideMode(input({ ...all, run: { toolRounds: 5, identicalStreak: 3 } })), { mode: 'final-answer', reason: 'patience' });
  t.same(decideMode(input({ ...all, run: { toolRounds: 5, identicalStreak: 1 } })), { mode: 'final-answer', reason: 'time' });
  t.same(decideMode(input({ ...all, run: { toolRounds: 5, identicalStreak: 1 }, runStartedAt: T0 })), {
    mode: 'final-answer',
    reason: 'tokens',
  });
});

t.test('every bound off: research is unbounded', async (t) => {
  const off = { maxToolRounds: null, tokenBudget: null, timeBudgetSeconds: null, patience: null };
  t.same(
    decideMode(input({ bounds: off, run: { toolRounds: 500, identicalStreak: 500 }, runStartedAt: 0, remainingTokens: null })),
    { mode: 'normal' },
  );
});
