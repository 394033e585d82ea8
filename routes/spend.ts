// GET /v1/conversations/{id}/spend — what a conversation spent, by what (SPEC §11). Only the tenant
// that owns the conversation sees it; to anyone else it does not exist (404).

import type { FastifyPluginAsync } from 'fastify';
import { requireClient } from '../server/auth-hooks.js';
import { GatewayError } from '../server/errors.js';
import type { ConversationSpend } from '../metering/ledger.js';
import { roundUsd } from '../pricing/model-price.js';
import { isConversationId } from '../server/pipeline/plan.js';

/**
 * A conversation's spend as the API shows it: sums of many turns, rounded like each turn (1e-10 USD).
 * Each sum of money sums the known costs; beside it, `unpriced_turns` counts the turns whose cost is
 * unknown and it leaves out (SPEC §2: unknown is not $0; ADR 0006).
 */
export function spendView(s: ConversationSpend) {
  // A model's entry is SPEC §11's `{turns, spent_usd}`; `unpriced_turns` joins it only for a model
  // with turns of unknown cost, so a priced or local model's entry keeps the contract's shape.
  const byModel: Record<string, { turns: number; spent_usd: number; unpriced_turns?: number }> = {};
  for (const [model, v] of Object.entries(s.byModel)) {
    byModel[model] = { turns: v.turns, spent_usd: roundUsd(v.spentUsd), ...(v.unpricedTurns > 0 ? { unpriced_turns: v.unpricedTurns } : {}) };
  }
  return {
    conversation: s.conversation,
    spent_usd: roundUsd(s.spentUsd),
    unpriced_turns: s.unpricedTurns,
    saved_usd: roundUsd(s.savedUsd),
    plan_turns: s.planTurns,
    plan_work_usd: roundUsd(s.planWorkUsd),
    tasks_usd: roundUsd(s.tasksUsd),
    tasks_unpriced_turns: s.tasksUnpricedTurns,
    turns: s.turns,
    cap_usd: s.capUsd,
    by_model: byModel,
  };
}

const route: FastifyPluginAsync = async (app) => {
  app.get<{ Params: { id: string } }>('/v1/conversations/:id/spend', { preHandler: requireClient }, async (request) => {
    // An id no client could have sent (server/pipeline/plan.ts) names no conversation.
    const spend = isConversationId(request.params.id) ? await app.gateway.ledger.conversationSpend(request.params.id) : null;
    if (!spend || spend.tenant !== request.principal!.tenant) {
      throw new GatewayError('not_found', `no conversation "${request.params.id}" for this key`);
    }
    return spendView(spend);
  });
};

export default route;
