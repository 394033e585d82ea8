// Every statement of the SQLite ledger, prepared once per connection (preparing per call would
// re-parse SQL on the hot path of every request).
import type Database from 'better-sqlite3';
import { RESERVATION_COLUMNS, SETTLEMENT_COLUMNS } from './ledger-row.js';

export function prepareSqlite(db: Database.Database) {
  const s = (sql: string) => db.prepare(sql);
  return {
    // Admission writes only once it has admitted (a refusal changes nothing): each reserve
    // statement creates its row or adds to it. The request's own conversation is claimed (an owner
    // and a first parent are never replaced); a parent, and each conversation above it, is drawn
    // on, and claimed only if no tenant owns it yet (a conversation the operator capped before any
    // request: its first user owns it, as conversation or as parent).
    reserveConversation: s(`INSERT INTO conversations (id, tenant, parent, reserved_usd)
      VALUES (@id, @tenant, @parent, @reserved)
      ON CONFLICT (id) DO UPDATE SET tenant = COALESCE(conversations.tenant, excluded.tenant),
        parent = COALESCE(conversations.parent, excluded.parent),
        reserved_usd = reserved_usd + excluded.reserved_usd`),
    reserveParent: s(`INSERT INTO conversations (id, tenant, reserved_usd) VALUES (@id, @tenant, @reserved)
      ON CONFLICT (id) DO UPDATE SET tenant = COALESCE(conversations.tenant, excluded.tenant),
        reserved_usd = reserved_usd + excluded.reserved_usd`),
    getConversation: s(`SELECT id, tenant, parent, cap_usd AS capUsd, spent_usd AS spentUsd,
      tasks_usd AS tasksUsd, reserved_usd AS reservedUsd, saved_usd, plan_turns, plan_work_usd, turns,
      room_ceiling_mtok AS roomCeilingMtok, unpriced_turns, tasks_unpriced_turns
      FROM conversations WHERE id = ?`),
    settleConversation: s(`UPDATE conversations SET reserved_usd = reserved_usd - @release,
      spent_usd = spent_usd + @cost, saved_usd = saved_usd + @saved, turns = turns + @turn,
      plan_turns = plan_turns + @plan_turn, plan_work_usd = plan_work_usd + @plan_work,
      unpriced_turns = unpriced_turns + @unpriced
      WHERE id = @id`),
    // A parent, or a conversation above it: what those below spend is its tasks_usd (ADR 0018).
    settleParent: s(`UPDATE conversations SET reserved_usd = reserved_usd - @release,
      tasks_usd = tasks_usd + @cost, tasks_unpriced_turns = tasks_unpriced_turns + @unpriced WHERE id = @id`),
    addModelTurn: s(`INSERT INTO conversation_models (conversation, model, turns, spent_usd, unpriced_turns)
      VALUES (@conversation, @model, 1, @cost, @unpriced)
      ON CONFLICT (conversation, model) DO UPDATE SET turns = turns + 1,
        spent_usd = spent_usd + excluded.spent_usd, unpriced_turns = unpriced_turns + excluded.unpriced_turns`),
    modelSpend: s('SELECT model, turns, spent_usd, unpriced_turns FROM conversation_models WHERE conversation = ? ORDER BY model'),
    setCap: s(`INSERT INTO conversations (id, tenant, cap_usd) VALUES (@id, @tenant, @cap)
      ON CONFLICT (id) DO UPDATE SET cap_usd = excluded.cap_usd, room_ceiling_mtok = NULL,
        tenant = COALESCE(conversations.tenant, excluded.tenant)
      WHERE excluded.tenant IS NULL OR conversations.tenant IS NULL OR conversations.tenant = excluded.tenant`),
    offerCapRoom: s(`UPDATE conversations SET room_ceiling_mtok = MAX(COALESCE(room_ceiling_mtok, 0), @ceiling)
      WHERE id = @id AND cap_usd = @cap`),
    getOwner: s('SELECT tenant FROM conversations WHERE id = ?'),

    // A run starts (its clock and its budget) with its first admitted request.
    reserveRun: s(`INSERT INTO runs (id, conversation, started_at, budget_tokens, used_tokens)
      VALUES (@id, @conversation, @started_at, @budget_tokens, @tokens)
      ON CONFLICT (id) DO UPDATE SET used_tokens = used_tokens + excluded.used_tokens`),
    getRun: s('SELECT budget_tokens, used_tokens FROM runs WHERE id = ?'),
    getRunState: s('SELECT id, conversation, started_at, budget_tokens, used_tokens FROM runs WHERE id = ?'),
    addRunTokens: s('UPDATE runs SET used_tokens = used_tokens + ? WHERE id = ?'),

    ensureMonth: s('INSERT INTO tenant_months (tenant, month) VALUES (?, ?) ON CONFLICT DO NOTHING'),
    getMonth: s('SELECT spent_usd, reserved_usd, unpriced_turns FROM tenant_months WHERE tenant = ? AND month = ?'),
    reserveMonth: s(`INSERT INTO tenant_months (tenant, month, reserved_usd) VALUES (?, ?, ?)
      ON CONFLICT (tenant, month) DO UPDATE SET reserved_usd = reserved_usd + excluded.reserved_usd`),
    settleMonth: s(`UPDATE tenant_months SET reserved_usd = reserved_usd - @release,
      spent_usd = spent_usd + @cost, unpriced_turns = unpriced_turns + @unpriced
      WHERE tenant = @tenant AND month = @month RETURNING spent_usd`),
    claimNotice: s('INSERT INTO budget_notices (tenant, month) VALUES (?, ?) ON CONFLICT DO NOTHING'),

    getTenant: s('SELECT id, monthly_budget_usd FROM tenants WHERE id = ?'),
    listTenants: s('SELECT id, monthly_budget_usd FROM tenants ORDER BY id'),
    listKeys: s('SELECT id, tenant, name FROM api_keys ORDER BY tenant, id'),
    listTenantKeys: s('SELECT id, tenant, name FROM api_keys WHERE tenant = ? ORDER BY id'),
    createTenant: s('INSERT INTO tenants (id, monthly_budget_usd) VALUES (?, ?) ON CONFLICT (id) DO NOTHING'),
    setTenantBudget: s('UPDATE tenants SET monthly_budget_usd = ? WHERE id = ?'),
    createKey: s('INSERT INTO api_keys (id, tenant, name, hash) VALUES (?, ?, ?, ?)'),
    deleteKey: s('DELETE FROM api_keys WHERE id = ?'),
    findKey: s('SELECT id, tenant, name FROM api_keys WHERE hash = ?'),
    anyKey: s('SELECT 1 FROM api_keys LIMIT 1'),
    // Rows finished before the cut, on the index the settled export reads (migration 8).
    pruneRows: s(`DELETE FROM ledger_rows WHERE id IN (SELECT id FROM ledger_rows
      WHERE finished_at < ? AND state <> 'reserved' ORDER BY finished_at, id LIMIT ?)`),
    // Retention of what rows leave behind (ADR 0005), walked in key order a batch at a time.
    headKeysAfter: s('SELECT conversation FROM heads WHERE conversation > ? ORDER BY conversation LIMIT ?').pluck(),
    pruneHeads: s(`DELETE FROM heads WHERE conversation IN (SELECT value FROM json_each(@keys)) AND time < @until
      AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = heads.conversation AND (c.cap_usd IS NOT NULL OR c.parent IS NOT NULL))`),
    chainEndKeysAfter: s(`SELECT tenant, last_hash, key_id FROM chain_ends WHERE (tenant, last_hash, key_id) > (@tenant, @last_hash, @key_id)
      ORDER BY tenant, last_hash, key_id LIMIT @n`).raw(),
    pruneChainEnds: s(`DELETE FROM chain_ends WHERE (tenant, last_hash, key_id) > (@t0, @h0, @k0) AND (tenant, last_hash, key_id) <= (@t1, @h1, @k1)
      AND time < @until
      AND NOT EXISTS (SELECT 1 FROM conversations c WHERE c.id = chain_ends.conversation AND (c.cap_usd IS NOT NULL OR c.parent IS NOT NULL))`),
    runKeysAfter: s('SELECT id FROM runs WHERE id > ? ORDER BY id LIMIT ?').pluck(),
    pruneRuns: s(`DELETE FROM runs WHERE id IN (SELECT value FROM json_each(@keys)) AND started_at < @until
      AND id NOT IN (SELECT run FROM ledger_rows WHERE state = 'reserved')
      AND NOT EXISTS (SELECT 1 FROM heads h WHERE h.conversation = runs.conversation AND h.time >= @until)`),

    insertRow: s(`INSERT INTO ledger_rows (${RESERVATION_COLUMNS.join(', ')})
      VALUES (${RESERVATION_COLUMNS.map((c) => '@' + c).join(', ')})`),
    getOpenRow: s(`SELECT state, time, run, conversation, parent, grandparents, tenant, month, model, prompt_charge,
      allowance, reserved_tokens, worst_case_usd, billing FROM ledger_rows WHERE id = ?`),
    settleRow: s(`UPDATE ledger_rows SET ${SETTLEMENT_COLUMNS.map((c) => `${c} = @${c}`).join(', ')}
      WHERE id = @id`),
    staleRows: s(`SELECT id FROM ledger_rows WHERE state = 'reserved' AND time < @before
      AND COALESCE(alive_at, time) < @before ORDER BY time`),
    openRows: s(`SELECT id FROM ledger_rows WHERE state = 'reserved' ORDER BY time`),
    keepAlive: s(`UPDATE ledger_rows SET alive_at = @now
      WHERE id IN (SELECT value FROM json_each(@ids)) AND state = 'reserved'`),
    exportPage: s(`SELECT * FROM ledger_rows WHERE time >= @since AND time < @until
      AND (time, id) > (@t, @id) ORDER BY time, id LIMIT @n`),
    exportSettledPage: s(`SELECT * FROM ledger_rows WHERE finished_at >= @since AND finished_at < @until
      AND (finished_at, id) > (@t, @id) ORDER BY finished_at, id LIMIT @n`),

    getHead: s('SELECT * FROM heads WHERE conversation = ?'),
    // Everything but the long columns, for a head whose chain, prefix and digests this process has.
    getHeadScalars: s(`SELECT conversation, key_id, tenant, model, tool_hash, server_id, last_hash,
      last_cost_usd, last_prompt_tokens, last_output_tokens, time FROM heads WHERE conversation = ?`),
    putHead: s(`INSERT INTO heads (conversation, key_id, tenant, model, tool_hash, server_id, chain,
        prefix, prefix_digests, last_hash, last_cost_usd, last_prompt_tokens, last_output_tokens, time)
      VALUES (@conversation, @key_id, @tenant, @model, @tool_hash, @server_id, @chain, @prefix,
        @prefix_digests, @last_hash, @last_cost_usd, @last_prompt_tokens, @last_output_tokens, @time)
      ON CONFLICT (conversation) DO UPDATE SET key_id = excluded.key_id, tenant = excluded.tenant,
        model = excluded.model, tool_hash = excluded.tool_hash, server_id = excluded.server_id,
        chain = excluded.chain,
        prefix = excluded.prefix, prefix_digests = excluded.prefix_digests, last_hash = excluded.last_hash,
        last_cost_usd = excluded.last_cost_usd, last_prompt_tokens = excluded.last_prompt_tokens,
        last_output_tokens = excluded.last_output_tokens, time = excluded.time`),
    // Where a request's list ended (migration 9): the most recent request there wins.
    putChainEnd: s(`INSERT INTO chain_ends (tenant, last_hash, key_id, conversation, time)
      VALUES (@tenant, @last_hash, @key_id, @conversation, @time)
      ON CONFLICT (tenant, last_hash, key_id) DO UPDATE SET conversation = excluded.conversation, time = excluded.time
      WHERE excluded.time >= chain_ends.time`),
    findByKeyChain: s(`SELECT conversation, time FROM chain_ends WHERE tenant = @tenant
      AND last_hash IN (SELECT value FROM json_each(@hashes)) AND key_id = @key ORDER BY time DESC LIMIT 1`),
    findByTenantChain: s(`SELECT conversation, time FROM chain_ends WHERE tenant = @tenant
      AND last_hash IN (SELECT value FROM json_each(@hashes)) ORDER BY time DESC LIMIT 1`),
  };
}

export type SqliteStatements = ReturnType<typeof prepareSqlite>;
