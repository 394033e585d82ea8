// Stage 3's second look (ADR 0019): a budget decision that rests on an upper bound — a 402, or a
// run sent as its final answer for want of tokens — is taken again on an exact count. (A size
// refusal gets its exact count inside `plan`, before it is thrown.) Used by the real request and
// by /v1/admission alike, so both still agree.

import type { Gateway } from '../gateway.js';
import type { Principal } from '../auth.js';
import type { ValidRequest } from './endpoints.js';
import { checkAdmission } from '../../metering/stores/admission-check.js';
import { plan, recountable, type Headers, type Plan, type PlanOptions } from './plan.js';
import { budgetsOf } from './budgets.js';
import { reservationOf } from './admit.js';

export async function planRequest(gw: Gateway, valid: ValidRequest, principal: Principal, headers: Headers, opts: PlanOptions = {}): Promise<Plan> {
  const first = await plan(gw, valid, principal, headers, opts);
  // Only text can be counted more exactly: an image bound stays one (ADR 0022).
  if (!first.rows.textUpperBound || first.countedExactly || !recountable(valid)) return first;
  if (!(await budgetDecides(gw, first))) return first;
  return plan(gw, valid, principal, headers, { ...opts, exact: true });
}

/**
 * Whether the plan's prompt count decides against it: the run's tokens refuse it or switch it to
 * its final answer, or a budget would refuse it now (read without reserving; the store's atomic
 * step decides again at admission).
 */
async function budgetDecides(gw: Gateway, p: Plan): Promise<boolean> {
  if (p.tokenRefusal !== null || p.finalReason === 'tokens') return true;
  const { state } = await budgetsOf(gw, p);
  return !checkAdmission(reservationOf(p), state).ok;
}
