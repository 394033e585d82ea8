// One gateway process per SQLite ledger file (ADR 0016): a second gateway started on a file that
// another one is serving waits for it and then refuses — it never takes the first one's requests in
// flight for a crash and charges them in full.

import t from 'tap';
import { Registry } from 'prom-client';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import type { LedgerRow } from '../../metering/ledger.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { openaiUpstream, startGateway } from '../helpers/gateway.js';
import { HOUR_MS, sleep, steppableWallClock } from '../helpers/wall-clock.js';
import { acquireOwnerLock } from '../../metering/stores/sqlite-owner-lock.js';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

async function rowsOf(ledger: { exportRows(a: null, b: null): AsyncIterable<LedgerRow> }): Promise<LedgerRow[]> {
  const rows: LedgerRow[] = [];
  for await (const r of ledger.exportRows(null, null)) rows.push(r);
  return rows;
}

t.test('a second gateway on a served SQLite file refuses to start, and settles nothing of the first', async (t) => {
  // A stream of 5 tokens, 150 ms apart: in flight while the second gateway tries to start.
  const upstream = await startOpenAiDouble({ completionTokens: 5, delayMs: 150 });
  t.teardown(upstream.close);
  const raw = { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] };
  const first = await startGateway(t, raw, { store: 'sqlite' });

  const inFlight = fetch(`${first.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'x-tollgate-conversation': 'owner-1' },
    body: JSON.stringify({ model: 'gpt-4o', max_tokens: 100, stream: true, messages: [{ role: 'user', content: 'hello there' }] }),
  });
  while (upstream.requests.length < 1) await new Promise((r) => setTimeout(r, 5));

  const config = parseConfig({ store: { kind: 'sqlite', path: first.dbPath }, logging: { level: 'silent' }, ...raw }, {});
  const startedAt = Date.now();
  await t.rejects(
    buildApp({ config, registry: new Registry(), env: {}, ledgerLockWaitMs: 300 }),
    { name: 'LedgerInUseError', message: new RegExp(`SQLite ledger ${first.dbPath.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')} is in use by another Tollgate process`) },
    'the second gateway is refused, naming the file',
  );
  t.ok(Date.now() - startedAt >= 250, 'it waited for the first to let go before giving up');

  const res = await inFlight;
  t.equal(res.status, 200);
  t.match(await res.text(), /: tollgate \{"charge_tokens":\d+,"refund_tokens":95,/, 'the first gateway settled its own request: 5 of 100 generated');
  const rows = await rowsOf(first.ledger);
  t.equal(rows.length, 1);
  t.equal(rows[0]!.state, 'settled', 'the request in flight was not taken for a crash');
  t.equal(rows[0]!.charge_tokens, rows[0]!.prompt_charge + 5, 'charged what was generated, not the whole allowance');
});

t.test('a gateway waiting for the file starts once the process holding it stops (a rolling restart)', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 5 });
  t.teardown(upstream.close);
  const raw = { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] };
  const first = await startGateway(t, raw, { store: 'sqlite' });
  const config = parseConfig({ store: { kind: 'sqlite', path: first.dbPath }, logging: { level: 'silent' }, ...raw }, {});

  const second = buildApp({ config, registry: new Registry(), env: {}, ledgerLockWaitMs: 10_000 });
  let startedSecond = false;
  void second.then(() => (startedSecond = true), () => undefined);
  await new Promise((r) => setTimeout(r, 400));
  t.notOk(startedSecond, 'the second gateway waits while the first serves the file');
  await first.app.close();
  const app = await second;
  t.teardown(() => app.close());
  await app.listen({ host: '127.0.0.1', port: 0 });
  const address = app.server.address();
  const url = `http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}`;
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', max_tokens: 10, messages: [{ role: 'user', content: 'hi' }] }),
  });
  t.equal(res.status, 200, 'and serves once it has the file');
});

t.test('a gateway waiting for the file gives up after its wait, though the wall clock is stepped back an hour meanwhile (regression)', async (t) => {
  const wall = steppableWallClock(t);
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-owner-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'ledger.db');
  const held = await acquireOwnerLock(path);
  t.teardown(() => held.release());
  const waiting = acquireOwnerLock(path, { waitMs: 300 });
  // 1. While it waits, the wall clock is stepped back an hour.
  await sleep(50);
  wall.step(-HOUR_MS);
  // 2. Well past its wait (300 ms), it has given up.
  const outcome = await Promise.race([waiting.then(() => 'took the lock', (err: unknown) => err), sleep(3_000).then(() => 'still waiting')]);
  t.match(outcome, { name: 'LedgerInUseError' }, 'refused after its wait, not an hour later');
});
