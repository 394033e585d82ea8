// The tenants the configuration names, made sure of in the ledger before the gateway serves: each
// key's tenant, each `tenants[]` entry, and `local` when there are no keys (every request is then
// that tenant, and the operator API should find it like any other).
//
// A monthly budget written in the config is the operator's declared state: it is applied at every
// start, over what the ledger holds, so that editing the file and restarting takes effect — `null`
// included, which removes a budget. A budget changed through the operator API holds until then. A
// tenant the config gives no budget at all (the field left out) keeps the one in the ledger, and
// the start says so: leaving the field out is not "no budget".

import type { FastifyBaseLogger } from 'fastify';
import type { Config, ConfiguredBudget } from './config.js';
import type { Ledger } from '../metering/ledger.js';
import { OPEN_TENANT } from './auth.js';

/** Each configured tenant with the budget the config gives it (`tenants[]` over a key's; undefined: none given). */
export function configuredTenants(config: Config): Map<string, ConfiguredBudget> {
  const budgets = new Map<string, ConfiguredBudget>();
  const give = (tenant: string, budget: ConfiguredBudget) => {
    if (budget !== undefined || !budgets.has(tenant)) budgets.set(tenant, budget);
  };
  if (config.auth.keys.length === 0) give(OPEN_TENANT, undefined);
  for (const k of config.auth.keys) give(k.tenant, k.monthlyBudgetUsd);
  for (const t of config.tenants) give(t.id, t.monthlyBudgetUsd);
  return budgets;
}

export async function applyConfiguredTenants(ledger: Ledger, config: Config, log: FastifyBaseLogger): Promise<void> {
  for (const [id, budget] of configuredTenants(config)) {
    const stored = await ledger.getTenant(id);
    if (!stored) {
      // Another replica starting at the same time may make it first, with the same config.
      await ledger.createTenant({ id, monthlyBudgetUsd: budget ?? null });
    } else if (budget !== undefined && stored.monthlyBudgetUsd !== budget) {
      await ledger.setTenantBudget(id, budget);
      log.info({ tenant: id, from: stored.monthlyBudgetUsd, to: budget }, 'monthly budget set from the config');
    } else if (budget === undefined && stored.monthlyBudgetUsd !== null) {
      log.info({ tenant: id, budget: stored.monthlyBudgetUsd }, 'monthly budget kept from the ledger: the config gives none (monthlyBudgetUsd: null removes it)');
    }
  }
}
