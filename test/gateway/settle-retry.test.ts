// A ledger that cannot take a settlement when its request ends (a full disk, PostgreSQL away): the
// upstream has answered, so the client gets the answer — not a 500 its SDK would retry, calling the
// model again — and the settlement is written once the ledger takes it, without a restart.
import t, { type Test } from 'tap';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { openStore } from '../../metering/stores/open-store.js';
import { collect } from '../helpers/stores.js';
import { HOUR_MS, sleep, steppableWallClock } from '../helpers/wall-clock.js';
import type { Ledger } from '../../metering/ledger.js';
import { copyFileSync, mkdtempSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { LedgerFileIdentity, LEDGER_FILE_REPLACED } from '../../metering/stores/sqlite-file-identity.js';

/** An SQLite ledger whose next `failures` settlements fail as a full disk does. */
async function failingLedger(t: Test, failures: number): Promise<{ ledger: Ledger; failed: () => number }> {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-settle-retry-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ledger = await openStore({ kind: 'sqlite', path: join(dir, 'ledger.db') });
  const settle = ledger.settle.bind(ledger);
  let failed = 0;
  ledger.settle = async (...args) => {
    if (failed < failures) {
      failed++;
      throw Object.assign(new Error('database or disk is full'), { name: 'SqliteError', code: 'SQLITE_FULL' });
    }
    return settle(...args);
  };
  return { ledger, failed: () => failed };
}

async function gatewayOn(t: Test, failures: number) {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const { ledger, failed } = await failingLedger(t, failures);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger, settleRetryMs: 50 });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  return { upstream, gw, client, failed };
}

async function settledSoon(gw: { ledger: Ledger }) {
  for (let i = 0; i < 100; i++) {
    const rows = await collect(gw.ledger.exportRows(null, null));
    if (rows.length > 0 && rows.every((r) => r.state !== 'reserved')) return rows;
    await new Promise((r) => setTimeout(r, 20));
  }
  return collect(gw.ledger.exportRows(null, null));
}

t.test('non-streamed: the answer is delivered once, and the settlement written when the ledger takes it', async (t) => {
  const { upstream, gw, client, failed } = await gatewayOn(t, 3);
  const { data, response } = await client.chat.completions
    .create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 })
    .withResponse();
  t.equal(response.status, 200, 'not a 500');
  t.ok(data.choices[0]?.message.content, 'the answer came');
  t.equal(upstream.requests.length, 1, 'the model was called once (no SDK retry)');
  t.equal(response.headers.get('x-tollgate-refund-tokens'), '15', 'the figures the ledger will hold');
  const rows = await settledSoon(gw);
  t.ok(failed() >= 2, `the ledger refused ${failed()} times`);
  t.equal(rows.length, 1);
  t.match(rows[0], { state: 'settled', status: 200, generated_tokens: 5, refund_tokens: 15 }, 'settled with its real figures, not recovered in full');
  t.equal(gw.app.gateway.inFlight.size, 0);
  t.equal(gw.app.gateway.settleRetry.size, 0);
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200, 'ready again by itself');
});

t.test('a settlement written late is stamped when it is written, so an export by settlement time read meanwhile cannot miss it', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const { ledger } = await failingLedger(t, 1);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger, settleRetryMs: 300, clock: true });
  const t0 = gw.now.ms;
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 });
  // A billing job reads the window up to now while the settlement waits for the store.
  gw.now.ms = t0 + 60_000;
  t.same(await collect(gw.ledger.exportRows(null, t0 + 60_000, 'settled')), [], 'not settled yet');
  const rows = await settledSoon(gw);
  t.match(rows[0], { state: 'settled', finished_at: new Date(t0 + 60_000).toISOString() }, 'stamped when written');
  t.same((await collect(gw.ledger.exportRows(t0 + 60_000, null, 'settled'))).map((r) => r.id), [rows[0]!.id], 'in the next window');
});

t.test('streamed: the stream ends whole (closing comment, [DONE]), and is settled later', async (t) => {
  const { gw, client } = await gatewayOn(t, 2);
  const stream = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? '';
  t.ok(text.length > 0, 'the answer streamed to its end (the SDK saw [DONE])');
  const rows = await settledSoon(gw);
  t.match(rows[0], { state: 'settled', status: 200, generated_tokens: 5 });
});

t.test('a gateway stopping with a settlement unwritten says so and leaves it to recovery', async (t) => {
  const { gw, client } = await gatewayOn(t, 1_000_000);
  const res = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 });
  t.ok(res.choices[0]);
  t.equal(gw.app.gateway.settleRetry.size, 1);
  t.match(gw.app.gateway.settleRetry.lastError, /disk is full/);
  t.ok(gw.app.gateway.inFlight.size === 1, 'still in flight: kept alive, not swept as a crash');
  const rows = await collect(gw.ledger.exportRows(null, null));
  t.equal(rows[0]?.state, 'reserved', 'left reserved: the next start settles it in full');
  const ready = await fetch(`${gw.url}/readyz`);
  t.equal(ready.status, 503, 'not ready while the ledger refuses writes');
  t.match(await ready.json(), { status: 'not ready', store: { ok: false, error: 'the ledger refuses writes (SQLITE_FULL)', settlements_waiting: 1 } });
});

t.test('a store failure before the upstream is called is a 503 ledger_unavailable, and nothing is sent; a bug stays a 500', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const { ledger } = await failingLedger(t, 0);
  const admit = ledger.admit.bind(ledger);
  let fail: Error | null = Object.assign(new Error('database or disk is full'), { name: 'SqliteError', code: 'SQLITE_FULL' });
  ledger.admit = async (r) => {
    if (fail) throw fail;
    return admit(r);
  };
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger });
  const post = () => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 }) });
  const res = await post();
  t.equal(res.status, 503);
  t.same(await res.json(), { error: { message: 'the ledger could not be read or written (SQLITE_FULL); try again shortly', type: 'server_error', param: null, code: 'ledger_unavailable' } });
  t.equal(res.headers.get('x-should-retry'), null, 'a store that is away may be back: the SDKs keep their retries');
  // The ping reads and succeeds; the admission's write failed: not ready.
  const unready = await fetch(`${gw.url}/readyz`);
  t.equal(unready.status, 503, 'not ready while admissions fail, though a read answers');
  t.match(await unready.json(), { status: 'not ready', store: { ok: false, error: 'the ledger failed a request in the last 10 s (SQLITE_FULL)' } });
  fail = new TypeError("Cannot read properties of undefined (reading 'x')");
  const bug = await post();
  t.equal(bug.status, 500);
  t.match(await bug.json(), { error: { code: 'internal_error' } });
  t.equal((await fetch(`${gw.url}/readyz`)).status, 503, 'a bug is not the store coming back');
  fail = null;
  t.equal((await post()).status, 200, 'served again once the store is');
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200, 'ready again once an admission went through');
  t.equal(upstream.requests.filter((r) => r.method === 'POST').length, 1, 'only the admitted request reached the upstream');
});

t.test('a store failure while a key is looked up is a 503 too', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const { ledger } = await failingLedger(t, 0);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger });
  ledger.findKeyByHash = async () => {
    throw Object.assign(new Error('database is locked'), { name: 'SqliteError', code: 'SQLITE_BUSY' });
  };
  const res = await fetch(`${gw.url}/v1/models`, { headers: { authorization: 'Bearer tg-some-key' } });
  t.equal(res.status, 503);
  t.match(await res.json(), { error: { code: 'ledger_unavailable', message: 'the ledger could not be read or written (SQLITE_BUSY); try again shortly' } });
});

t.test('a retried settlement whose row was recovered meanwhile (another replica swept it) leaves the recovery standing', async (t) => {
  const { gw, client, failed } = await gatewayOn(t, 1_000_000);
  await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 });
  t.equal(gw.app.gateway.settleRetry.size, 1);
  // What a replica's sweep does with a reservation not said alive for its threshold.
  t.equal(await gw.ledger.recoverStale(0, Date.now() + 60_000), 1);
  // The store takes writes again.
  (gw.ledger as unknown as { settle: unknown }).settle = Object.getPrototypeOf(gw.ledger).settle;
  t.ok(failed() >= 1);
  for (let i = 0; i < 100 && gw.app.gateway.settleRetry.size > 0; i++) await new Promise((r) => setTimeout(r, 20));
  t.equal(gw.app.gateway.settleRetry.size, 0, 'no longer waiting');
  t.equal(gw.app.gateway.inFlight.size, 0);
  const [row] = await collect(gw.ledger.exportRows(null, null));
  t.match(row, { state: 'recovered', charge_tokens: row!.reserved_tokens }, 'recovered in full, once');
});

t.test('SQLite errors that say the file cannot be used now are store failures; a violated constraint is a bug', async (t) => {
  const { storeFailureCode } = await import('../../server/ledger-guard.js');
  const sqlite = (code: string) => Object.assign(new Error(code), { name: 'SqliteError', code });
  for (const code of ['SQLITE_FULL', 'SQLITE_BUSY', 'SQLITE_IOERR_WRITE', 'SQLITE_READONLY', 'SQLITE_CANTOPEN']) t.equal(storeFailureCode(sqlite(code)), code);
  for (const code of ['SQLITE_CONSTRAINT_PRIMARYKEY', 'SQLITE_ERROR', 'SQLITE_MISMATCH', 'SQLITE_RANGE']) t.equal(storeFailureCode(sqlite(code)), null, code);
  t.equal(storeFailureCode(new TypeError('x')), null);
});

t.test('a settlement that fails for another reason than the store being away is not retried, and leaves the gateway ready', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const { ledger } = await failingLedger(t, 0);
  ledger.settle = async () => {
    throw Object.assign(new Error('UNIQUE constraint failed: heads.conversation'), { name: 'SqliteError', code: 'SQLITE_CONSTRAINT_PRIMARYKEY' });
  };
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { ledger, settleRetryMs: 50 });
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-any' });
  const res = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 });
  t.ok(res.choices[0], 'the answer still came');
  t.equal(upstream.requests.length, 1);
  t.equal(gw.app.gateway.settleRetry.size, 0, 'not kept to retry');
  t.equal(gw.app.gateway.inFlight.size, 0, 'left to recovery');
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200, 'one bad settlement does not take the gateway out');
  const [row] = await collect(gw.ledger.exportRows(null, null));
  t.equal(row?.state, 'reserved', 'the reservation stays for recovery to charge in full');
});

t.test('readiness forgets a store failure once the same call succeeds, or after 10 s; other calls and pings do not clear it', async (t) => {
  const { StoreFailures, guardLedger, RECENT_FAILURE_MS } = await import('../../server/ledger-guard.js');
  let now = 1_000_000;
  const failures = new StoreFailures(() => now);
  const full = Object.assign(new Error('database or disk is full'), { name: 'SqliteError', code: 'SQLITE_FULL' });
  let admitFails = true;
  const store = {
    ping: async () => {},
    findKey: async () => null,
    admit: async () => {
      if (admitFails) throw full;
      return 'ok';
    },
  };
  const guarded = guardLedger(store as unknown as Ledger, failures) as unknown as typeof store;
  await t.rejects(guarded.admit(), { code: 'ledger_unavailable' });
  t.equal(failures.recent(), 'SQLITE_FULL');
  await guarded.ping();
  await guarded.findKey();
  t.equal(failures.recent(), 'SQLITE_FULL', 'a read succeeding is not the write coming back');
  now += RECENT_FAILURE_MS + 1;
  t.equal(failures.recent(), null, 'forgotten after 10 s, so that traffic is let back in to try');
  await t.rejects(guarded.admit());
  admitFails = false;
  await guarded.admit();
  t.equal(failures.recent(), null, 'cleared by the same call succeeding');
});

t.test('readiness forgets a store failure on time though the wall clock is stepped back an hour (regression)', async (t) => {
  const { StoreFailures } = await import('../../server/ledger-guard.js');
  const wall = steppableWallClock(t);
  // The gateway's own: its clock is the default one, not a test's.
  const failures = new StoreFailures();
  failures.failed('admit', 'SQLITE_FULL');
  // 1. NTP steps the wall clock back an hour.
  wall.step(-HOUR_MS);
  t.equal(failures.recent(50), 'SQLITE_FULL', 'recent just after');
  // 2. The failure's time (50 ms here, 10 s in the gateway) passes.
  await sleep(80);
  t.equal(failures.recent(50), null, 'forgotten once its time has passed, not an hour later (the gateway stayed unready that long)');
});

t.test('a ledger file deleted or replaced under a running gateway: not ready, and new requests refused, since their rows would be lost', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { store: 'sqlite' });
  const post = () => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20 }) });
  t.equal((await post()).status, 200);
  t.equal((await fetch(`${gw.url}/readyz`)).status, 200);
  // 1. A restore copied over the ledger (a new file at the same path).
  renameSync(gw.dbPath, `${gw.dbPath}.old`);
  copyFileSync(`${gw.dbPath}.old`, gw.dbPath);
  const ready = await fetch(`${gw.url}/readyz`);
  t.equal(ready.status, 503);
  t.match(await ready.json(), { status: 'not ready', store: { ok: false, error: 'the ledger did not answer (LEDGER_FILE_REPLACED)' } });
  const refused = await post();
  t.equal(refused.status, 503);
  t.same(await refused.json(), { error: { message: 'the ledger could not be read or written (LEDGER_FILE_REPLACED); its file was deleted or replaced while the gateway ran, and no retry helps until the gateway is restarted', type: 'server_error', param: null, code: 'ledger_unavailable' } });
  t.equal(refused.headers.get('x-should-retry'), 'false', 'and the SDKs are told not to retry it at once');
  t.equal(upstream.requests.filter((r) => r.method === 'POST').length, 1, 'the refused request was not sent');
});

t.test('admissions see a replaced ledger file within a second, though the wall clock is stepped back an hour (regression)', async (t) => {
  const wall = steppableWallClock(t);
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-file-identity-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'ledger.db');
  writeFileSync(path, 'a ledger');
  const file = new LedgerFileIdentity(path);
  file.check();
  // 1. The wall clock is stepped back an hour; 2. a restore copies another file over the ledger.
  wall.step(-HOUR_MS);
  renameSync(path, `${path}.old`);
  copyFileSync(`${path}.old`, path);
  // 3. A second passes: the next admission looks at the file again.
  await sleep(1_100);
  t.throws(() => file.check(), { code: LEDGER_FILE_REPLACED }, 'seen, not an hour later');
});
