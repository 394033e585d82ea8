// A gateway on SQLite killed with a request in flight and started again with its clock behind
// (a reboot before NTP sets it): the open reservation is stamped later than the new process's
// clock. One process serves an SQLite file (ADR 0016), so it was still left by the crash, and the
// start-up recovery must settle it — a cutoff on time left it reserved for good, holding the
// month's money and the run's tokens (SPEC §9, ADR 0011).

import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore } from '../../metering/stores/open-store.js';
import { collect, reservation } from '../helpers/stores.js';
import { openaiUpstream, startGateway } from '../helpers/gateway.js';

const RESTART_CLOCK = Date.parse('2026-11-15T12:00:00Z'); // startGateway's test clock

t.test('SQLite: a reservation stamped after the restarted clock is still recovered at start', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-clock-behind-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const ledger = await openStore({ kind: 'sqlite', path: join(dir, 'ledger.db') });

  // 1. The request in flight when the first process died, stamped by a clock 20 s ahead of the
  //    one the second process starts with.
  const lost = reservation({ time: RESTART_CLOCK + 20_000, run: 'run-lost', worstCaseUsd: 0.5, month: '2026-11' });
  t.same(await ledger.admit(lost), { ok: true });

  // 2. The gateway starts on that ledger with its clock behind.
  const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9')] }, { clock: true, ledger });
  t.equal(gw.now.ms, RESTART_CLOCK);

  // 3. Recovered in full at start: nothing stays reserved, the worst case is spent.
  const [row] = await collect(gw.ledger.exportRows(null, null));
  t.match(row, { id: lost.id, state: 'recovered', charge_tokens: lost.promptCharge + lost.allowance, refund_tokens: 0, cost_usd: 0.5 });
  t.same(await gw.ledger.tenantMonth('acme', '2026-11'), { spentUsd: 0.5, reservedUsd: 0, unpricedTurns: 0 }, 'no money left reserved');
  t.equal((await gw.ledger.getRun('run-lost'))?.usedTokens, lost.promptCharge + lost.allowance, 'the run keeps the whole charge');
});
