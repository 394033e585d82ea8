// The tenants the configuration names, made sure of in the ledger before the gateway serves: each
// key's tenant, each `tenants[]` entry, and `local` when there are no keys (every request is then
// that tenant, and the operator API should find it like any other).
//
// A monthly budget written in the config is the operator's declared state: it is applied at every
// start, over what the ledger holds, so that editing the file and restarting takes effect. A budget
// changed through the operator API holds until then. A tenant with no budget in the config keeps
// the one in the ledger.

import type { FastifyBaseLogger } from 'fastify';
import type { Config } from './config.js';
import type { Ledger } from '../metering/ledger.js';
import { OPEN_TENANT } from './auth.js';

/** Each configured tenant with the budget the config gives it (`tenants[]` over a key's; null: none). */
export function configuredTenants(config: Config): Map<string, number | null> {
  const budgets = new Map<string, number | null>();
  if (config.auth.keys.length === 0) budgets.set(OPEN_TENANT, null);
  for (const k of config.auth.keys) budgets.set(k.tenant, k.monthlyBudgetUsd ?? budgets.get(k.tenant) ?? null);
  for (const t of config.tenants) budgets.set(t.id, t.monthlyBudgetUsd ?? budgets.get(t.id) ?? null);
  return budgets;
}

export async function applyConfiguredTenants(ledger: Ledger, config: Config, log: FastifyBaseLogger): Promise<void> {
  for (const [id, budget] of configuredTenants(config)) {
    const stored = await ledger.getTenant(id);
    if (!stored) {
      await ledger.upsertTenant({ id, monthlyBudgetUsd: budget });
    } else if (budget !== null && stored.monthlyBudgetUsd !== budget) {
      await ledger.setTenantBudget(id, budget);
      log.info({ tenant: id, from: stored.monthlyBudgetUsd, to: budget }, 'monthly budget set from the config');
    }
  }
}
