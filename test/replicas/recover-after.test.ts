// `store.recoverAfterSeconds` (PostgreSQL, ADR 0011): how long a reservation no replica says alive
// stays counted before it is taken for one left by a replica that went away, charged in full and
// flagged. Ten minutes by default; an operator may shorten it. Checked at a replica's start, where
// the sweep first runs, so that nothing here waits on time.

import t from 'tap';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { openStore } from '../../metering/stores/open-store.js';
import { reservation } from '../helpers/stores.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import type { LedgerRow } from '../../metering/ledger.js';

const PG = process.env.TOLLGATE_TEST_PG_URL;

if (!PG) {
  t.comment('PostgreSQL variant NOT RUN: set TOLLGATE_TEST_PG_URL (.ci/run does)');
} else {
  t.test('a replica recovers reservations not said alive for store.recoverAfterSeconds, not before', async (t) => {
    const schema = `recover_after_${randomBytes(4).toString('hex')}`;
    const admin = new pg.Client({ connectionString: PG });
    await admin.connect();
    t.teardown(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    const upstream = await startOpenAiDouble();
    t.teardown(upstream.close);

    // 1. A replica that went away left two reservations: one last said alive 2 minutes ago, one 30 s ago.
    const dead = await openStore({ kind: 'postgres', url: PG, schema });
    const twoMinutes = reservation({ run: 'gone', time: Date.now() - 180_000 });
    const halfMinute = reservation({ run: 'gone', time: Date.now() - 60_000 });
    for (const r of [twoMinutes, halfMinute]) t.same(await dead.admit(r), { ok: true });
    await dead.close();
    const aliveAgo = (id: string, ms: number) =>
      admin.query(`UPDATE ${schema}.ledger_rows SET alive_at = (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $2::bigint WHERE id = $1`, [id, ms]);
    await aliveAgo(twoMinutes.id, 120_000);
    await aliveAgo(halfMinute.id, 30_000);
    const states = async () => {
      const { rows } = await admin.query<Pick<LedgerRow, 'id' | 'state'>>(`SELECT id, state FROM ${schema}.ledger_rows ORDER BY id`);
      return Object.fromEntries(rows.map((r) => [r.id, r.state]));
    };
    const start = (store: Record<string, unknown>) =>
      // `store: 'sqlite'` only keeps the helper from making a PostgreSQL ledger of its own: the config's is used.
      startGateway(t, { store: { kind: 'postgres', url: PG, schema, ...store }, upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { store: 'sqlite' });

    // 2. With the default ten minutes, a replica starting now leaves both counted.
    const first = await start({});
    t.same(await states(), { [twoMinutes.id]: 'reserved', [halfMinute.id]: 'reserved' });
    await first.app.close();

    // 3. With one minute, the one not said alive for two is recovered; the other is not yet.
    await start({ recoverAfterSeconds: 60 });
    t.same(await states(), { [twoMinutes.id]: 'recovered', [halfMinute.id]: 'reserved' });
  });
}
