// The tenants the config names, at start (server/configured-tenants.ts): each key's tenant and each
// `tenants[]` entry exist in the ledger before the first request, and so does `local` when there
// are no keys. A budget written in the config is applied at every start, over the ledger's; a
// tenant the config gives no budget keeps the one set through the operator API.

import t from 'tap';
import { buildApp } from '../../server/app.js';
import { parseConfig } from '../../server/config.js';
import type { Ledger } from '../../metering/ledger.js';
import { storeFactories } from '../helpers/stores.js';
import { startGateway } from '../helpers/gateway.js';

const upstreams = [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9', models: ['*'] }];

/** Builds (and closes) a gateway on `ledger` with this config, as one start of the process would. */
async function start(ledger: Ledger, raw: Record<string, unknown>): Promise<void> {
  const app = await buildApp({ config: parseConfig({ upstreams, logging: { level: 'silent' }, ...raw }, {}), ledger, env: {} });
  await app.close();
}

for (const factory of storeFactories(t)) {
  t.test(`${factory.kind}: a budget in the config applies at every start; one set through the API holds where the config sets none`, async (t) => {
    const { ledger } = await factory.create(t);
    const keys = (budget?: number) => ({ auth: { keys: [{ key: 'tg-alice', tenant: 'alice', ...(budget === undefined ? {} : { monthlyBudgetUsd: budget }) }] } });

    // 1. First start: the key's tenant is made with its budget.
    await start(ledger, keys(50));
    t.same(await ledger.getTenant('alice'), { id: 'alice', monthlyBudgetUsd: 50 });
    // 2. The operator raises it through the API; the config file is then edited to 20 and the
    // gateway restarted: the file is what was declared last.
    await ledger.setTenantBudget('alice', 70);
    await start(ledger, keys(20));
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, 20);
    // 3. A config with no budget for the tenant leaves the API's figure alone across restarts.
    await ledger.setTenantBudget('alice', 70);
    await start(ledger, keys());
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, 70);
    // 4. tenants[] gives a tenant's budget over its key's.
    await start(ledger, { ...keys(20), tenants: [{ id: 'alice', monthlyBudgetUsd: 30 }, { id: 'bob' }] });
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, 30);
    t.same(await ledger.getTenant('bob'), { id: 'bob', monthlyBudgetUsd: null });
    t.equal(await ledger.getTenant('local'), null, 'with keys, no `local` tenant is made');
  });

  t.test(`${factory.kind}: \`monthlyBudgetUsd: null\` in the config removes a budget; on tenants[] it wins over a key's`, async (t) => {
    const { ledger } = await factory.create(t);
    const key = (budget?: number | null) => ({ key: 'tg-alice', tenant: 'alice', ...(budget === undefined ? {} : { monthlyBudgetUsd: budget }) });
    await start(ledger, { auth: { keys: [key(1)] } });
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, 1);
    await start(ledger, { auth: { keys: [key(null)] } });
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, null, 'null on the key: no budget');
    await start(ledger, { auth: { keys: [key(1)] } });
    await start(ledger, { auth: { keys: [key(5)] }, tenants: [{ id: 'alice', monthlyBudgetUsd: null }] });
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, null, "null on tenants[] wins over the key's 5");
    await start(ledger, { auth: { keys: [key(5)] }, tenants: [{ id: 'alice' }] });
    t.equal((await ledger.getTenant('alice'))?.monthlyBudgetUsd, 5, "a tenants[] entry without a budget leaves the key's");
  });

  t.test(`${factory.kind}: without keys the tenant \`local\` exists from the start`, async (t) => {
    const { ledger } = await factory.create(t);
    await start(ledger, {});
    t.same(await ledger.getTenant('local'), { id: 'local', monthlyBudgetUsd: null });
    await ledger.setTenantBudget('local', 5);
    await start(ledger, {});
    t.equal((await ledger.getTenant('local'))?.monthlyBudgetUsd, 5, 'and keeps a budget set through the API');
  });
}

t.test('without keys the operator API finds `local` before any request, and its budget holds', async (t) => {
  const gw = await startGateway(t, { upstreams });
  const admin = { authorization: 'Bearer admin-secret', 'content-type': 'application/json' };
  const spend = await fetch(`${gw.url}/admin/tenants/local/spend`, { headers: admin });
  t.equal(spend.status, 200);
  t.match(await spend.json(), { tenant: 'local', spent_usd: 0 });
  const put = await fetch(`${gw.url}/admin/tenants/local/budget`, { method: 'PUT', headers: admin, body: JSON.stringify({ monthly_budget_usd: 0.5 }) });
  t.equal(put.status, 200);
  t.equal((await gw.ledger.getTenant('local'))?.monthlyBudgetUsd, 0.5);
});
