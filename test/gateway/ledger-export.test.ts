// A large ledger export lets other requests through while it runs (found by an outside audit: a
// client that reads as fast as the gateway writes never made the export loop wait, so a
// 600,000-row export held /healthz for 40 s). The gateway runs as its own process, so this test's
// reading does not share its event loop; what is asserted is an order, not a time.

import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { openStore } from '../../metering/stores/open-store.js';
import { reservation, settlement } from '../helpers/stores.js';
import { startGatewayProcess } from '../helpers/process.js';

t.test('a health check sent during a 30,000-row export is answered before the export ends', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-export-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const path = join(dir, 'ledger.db');
  const ledger = await openStore({ kind: 'sqlite', path });
  await Promise.all(
    Array.from({ length: 30_000 }, async (_, i) => {
      const r = reservation({ tenant: 'acme', conversation: `bulk-${i % 50}`, run: `bulk-run-${i % 50}`, time: Date.UTC(2025, 5, 10) + i });
      await ledger.admit(r);
      await ledger.settle(r.id, settlement(r, 1));
    }),
  );
  await ledger.close();
  const configPath = join(dir, 'config.json');
  writeFileSync(configPath, JSON.stringify({ store: { kind: 'sqlite', path }, logging: { level: 'silent' } }));
  const { url, child } = await startGatewayProcess(configPath);
  t.teardown(() => child.kill('SIGKILL'));

  const order: string[] = [];
  const res = await fetch(`${url}/admin/ledger`, { headers: { authorization: 'Bearer admin-secret' } });
  const reader = res.body!.getReader();
  await reader.read(); // the export's first rows are out: its loop is running
  const health = fetch(`${url}/healthz`).then((r) => {
    order.push('healthz');
    return r.status;
  });
  let lines = 0;
  const decoder = new TextDecoder();
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    lines += (decoder.decode(value, { stream: true }).match(/\n/g) ?? []).length;
  }
  order.push('export');
  t.equal(await health, 200);
  t.ok(lines > 10_000, `${lines} more rows after the first read`);
  t.same(order, ['healthz', 'export'], 'the health check did not wait for the export');
});
