// The operator API (SPEC §11): tenants, keys, budgets, conversation caps, spend and the ledger
// export. Every route needs TOLLGATE_ADMIN_TOKEN; a client key gets 403, no token 401. Only here can
// a limit be raised.

import { randomBytes, randomUUID } from 'node:crypto';
import type { FastifyPluginAsync } from 'fastify';
import { requireAdmin } from '../server/auth-hooks.js';
import { hashKey } from '../server/auth.js';
import { roundUsd } from '../pricing/model-price.js';
import { GatewayError } from '../server/errors.js';
import { unstorableText } from '../server/storable-text.js';
import { TENANT_ID, TENANT_ID_RULE } from '../server/config.js';
import { MAX_CONVERSATION_ID_LENGTH, isConversationId, monthOf } from '../server/pipeline/plan.js';
import { spendView } from './spend.js';

type Body = Record<string, unknown>;

/**
 * The route's JSON body, holding only the fields it takes. A field it does not take is refused
 * before anything changes, as the config reader refuses one: a misspelt `monthly_budget` must not
 * pass as "no budget".
 */
function body(value: unknown, fields: readonly string[]): Body {
  if (typeof value !== 'object' || value === null || Array.isArray(value)) {
    throw new GatewayError('invalid_request', 'request body must be a JSON object');
  }
  for (const field of Object.keys(value)) {
    if (!fields.includes(field)) {
      throw new GatewayError('invalid_request', `${field}: unknown field (expected ${fields.join(', ')})`, {}, field);
    }
  }
  return value as Body;
}

function usdOrNull(b: Body, field: string, required: boolean): number | null | undefined {
  const v = b[field];
  if (v === undefined && !required) return undefined;
  if (v === null) return null;
  if (typeof v !== 'number' || !Number.isFinite(v) || v < 0) {
    throw new GatewayError('invalid_request', `${field}: must be a non-negative number or null`, {}, field);
  }
  return v;
}

function id(b: Body, field: string): string {
  const v = b[field];
  if (typeof v !== 'string' || !TENANT_ID.test(v)) {
    throw new GatewayError('invalid_request', `${field}: ${TENANT_ID_RULE}`, {}, field);
  }
  return v;
}

// An ISO 8601 date, or date and time with an optional fraction and zone. Anything else `Date.parse`
// would guess at ("-5" is May 2001), so it is refused. A time without a zone is UTC, as the
// ledger's times are (`Date.parse` would read it in the server's own time zone).
const ISO_TIME = /^(\d{4})-(\d{2})-(\d{2})(?:T(\d{2}):(\d{2})(?::(\d{2})(?:\.\d{1,9})?)?(Z|[+-]\d{2}:\d{2})?)?$/;

/**
 * A query string holds only the parameters the route takes: one it does not (`tenant=` on the
 * ledger's retention, a misspelt `untill=`) is a 400 naming it, not ignored — a filter that is not
 * there must not look as if it applied, least of all to a deletion.
 */
function onlyQuery(query: unknown, allowed: readonly string[]): void {
  for (const [name, value] of Object.entries((query ?? {}) as Record<string, unknown>)) {
    if (!allowed.includes(name)) {
      const takes = allowed.length === 0 ? 'this route takes no query parameters' : `this route takes ${allowed.join(', ')}`;
      throw new GatewayError('invalid_request', `${name}: unknown query parameter (${takes}); nothing was done`, {}, name);
    }
    if (Array.isArray(value)) throw new GatewayError('invalid_request', `${name}: given ${value.length} times, give it once; nothing was done`, {}, name);
  }
}

function timeParam(v: unknown, name: string): number | null {
  if (v === undefined || v === '') return null;
  const bad = () => new GatewayError('invalid_request', `${name}: must be one ISO 8601 time (2026-11-01 or 2026-11-01T12:00:00Z) or epoch milliseconds`, {}, name);
  if (typeof v !== 'string') throw bad();
  if (/^\d+$/.test(v)) {
    // Epoch milliseconds within the times a Date can hold (±8.64e15), as every store can compare.
    const ms = Number(v);
    if (ms > MAX_TIME_MS) throw bad();
    // Epoch seconds (1764547200) or a compact date (20261201) read as milliseconds would be a
    // moment in 1970, and the export would silently start there: refused. Any time in the ledger
    // is later than 1973, when epoch milliseconds reach 12 digits; 0 is the start.
    if (ms !== 0 && ms < MIN_EPOCH_MS) {
      throw new GatewayError('invalid_request', `${name}: ${v} is not epoch milliseconds (those have 12 or more digits, such as 1764547200000); write a date as 2026-12-01`, {}, name);
    }
    return ms;
  }
  // No time is longer (2026-11-15T12:00:00.123456789+01:00 is 35): the patterns below read no more.
  if (v.length > 40) throw bad();
  // A `+` left unencoded in a query string arrives as a space (after a time: 2026-11-15T12:00 01:00).
  if (/^[^ T]*T[^ ]* \d{2}:\d{2}$/.test(v)) {
    throw new GatewayError('invalid_request', `${name}: "${v}" has a space before its zone offset: write the offset's + as %2B in the URL (or use Z)`, {}, name);
  }
  // A date and a time with a space between them, as SQL writes them.
  if (/^\d{4}-\d{2}-\d{2} \d{2}:\d{2}/.test(v)) {
    throw new GatewayError('invalid_request', `${name}: "${v}" has a space between its date and time: write a T there (2026-11-15T12:00:00Z)`, {}, name);
  }
  const m = ISO_TIME.exec(v);
  const ms = Date.parse(m && m[4] !== undefined && m[7] === undefined ? `${v}Z` : v);
  if (!m || !Number.isFinite(ms)) throw bad();
  // A day past its month's end (2026-02-31) parses as another day: refused, not rolled over.
  const [, y, mo, d] = m;
  const day = new Date(Date.UTC(Number(y), Number(mo) - 1, Number(d)));
  if (day.getUTCFullYear() !== Number(y) || day.getUTCMonth() !== Number(mo) - 1 || day.getUTCDate() !== Number(d)) throw bad();
  return ms;
}

/**
 * Control characters: never in an id the gateway made or took (ids that break a rule they were
 * made by are not found without asking the store — PostgreSQL cannot even hold a NUL), nor in a
 * key's name.
 */
const CONTROL = /[\u0000-\u001f\u007f]/;

/** An export gives the event loop a turn at least this often (ms of its own work), or after a 'drain'. */
const EXPORT_YIELD_MS = 5;
/** Rows between two looks at the clock. */
const EXPORT_CLOCK_ROWS = 32;
/** Rows deleted per transaction by `DELETE /admin/ledger`: each batch is a few milliseconds of writing. */
const PRUNE_BATCH_ROWS = 2000;
/**
 * Conversation heads and runs go only once a day old, whatever `until` says: a run still going
 * (its time budget turned off) would start again with a fresh budget, and a conversation paused
 * for an hour would lose its shared prefix.
 */
const HISTORY_KEPT_MS = 86_400_000;
/**
 * Heads and runs looked at per statement: a head is a large row in three indexes, ~60 µs to delete
 * (measured on a 1.5 M-request ledger), so batches are smaller than the rows'.
 */
const PRUNE_BATCH_HISTORY = 250;
const MAX_TIME_MS = 8.64e15;
/** The longest name a key may be given (UTF-16 units, as JavaScript counts them). */
const MAX_KEY_NAME_CHARS = 200;
/** The smallest epoch-milliseconds value taken besides 0: 1e11 is March 1973, and 12 digits. */
const MIN_EPOCH_MS = 1e11;

const route: FastifyPluginAsync = async (app) => {
  // Every route of this plugin (it is encapsulated: the hook holds for these routes alone) needs the
  // admin token, checked before its body is read. Not decided from `request.url`: that is the raw
  // request target, which `/%61dmin/…` or an absolute `http://host/admin/…` also routes here.
  app.addHook('onRequest', requireAdmin);
  // Then its query: only the parameters the route names (`config.query`), each once.
  app.addHook('preValidation', async (request) => {
    onlyQuery(request.query, (request.routeOptions.config as { query?: readonly string[] }).query ?? []);
  });
  const ledger = () => app.gateway.ledger;

  app.post('/admin/tenants', async (request, reply) => {
    const b = body(request.body, ['id', 'monthly_budget_usd']);
    const tenant = id(b, 'id');
    // Posting a tenant that exists changes only what the body says: without monthly_budget_usd its
    // budget stays (a repeated set-up script must not lift a limit by leaving a field out). Each
    // write is one step in the store, never a budget read earlier written back: a budget another
    // operator call sets meanwhile (or a key's call making the tenant) is not undone.
    const given = usdOrNull(b, 'monthly_budget_usd', false);
    const created = await ledger().createTenant({ id: tenant, monthlyBudgetUsd: given ?? null });
    if (!created && given !== undefined) await ledger().setTenantBudget(tenant, given);
    const budget = given !== undefined ? given : ((await ledger().getTenant(tenant))?.monthlyBudgetUsd ?? null);
    reply.code(created ? 201 : 200);
    return { id: tenant, monthly_budget_usd: budget };
  });

  app.put<{ Params: { id: string } }>('/admin/tenants/:id/budget', async (request) => {
    const b = body(request.body, ['monthly_budget_usd']);
    const budget = usdOrNull(b, 'monthly_budget_usd', true) ?? null;
    if (!TENANT_ID.test(request.params.id) || !(await ledger().setTenantBudget(request.params.id, budget))) {
      throw new GatewayError('not_found', `no tenant "${request.params.id}"`);
    }
    return { id: request.params.id, monthly_budget_usd: budget };
  });

  app.post('/admin/keys', async (request, reply) => {
    const b = body(request.body, ['tenant', 'name']);
    const tenant = id(b, 'tenant');
    if (b.name !== undefined && b.name !== null && typeof b.name !== 'string') {
      throw new GatewayError('invalid_request', 'name: must be a string (or null)', {}, 'name');
    }
    const nameText = typeof b.name === 'string' ? unstorableText(b.name) : '';
    if (nameText) throw new GatewayError('invalid_request', `name: ${nameText}`, {}, 'name');
    // Refused, not cut: a name cut short (or cut inside a character) is not the name given.
    if (typeof b.name === 'string' && b.name.length > MAX_KEY_NAME_CHARS) {
      throw new GatewayError('invalid_request', `name: has ${b.name.length} characters, the most is ${MAX_KEY_NAME_CHARS}`, {}, 'name');
    }
    const name = typeof b.name === 'string' ? b.name : null;
    // A tenant made here has no budget; one that exists keeps its own (one step in the store). The
    // answer says which, so that a misspelt tenant does not pass unseen.
    const tenantCreated = await ledger().createTenant({ id: tenant, monthlyBudgetUsd: null });
    const key = `tg-${randomBytes(24).toString('base64url')}`;
    const keyId = `key-${randomUUID()}`;
    await ledger().createKey({ id: keyId, tenant, name, hash: hashKey(key) });
    // A gateway that had no keys needs them from now on (server/auth.ts).
    app.gateway.auth.keysChanged();
    reply.code(201);
    // The key is shown this once; only its hash is kept.
    return { id: keyId, key, tenant, name, tenant_created: tenantCreated };
  });

  // What exists, for an operator who has lost an id (a key can be revoked only by its id).
  app.get('/admin/tenants', async () => {
    const tenants = await ledger().listTenants();
    return { tenants: tenants.map((t) => ({ id: t.id, monthly_budget_usd: t.monthlyBudgetUsd })) };
  });

  app.get<{ Querystring: { tenant?: string } }>('/admin/keys', { config: { query: ['tenant'] } }, async (request) => {
    const tenant = request.query.tenant;
    if (tenant !== undefined && !(TENANT_ID.test(tenant) && (await ledger().getTenant(tenant)))) throw new GatewayError('not_found', `no tenant "${tenant}"`);
    // The config file's keys (revoked by editing it) and the operator API's (revoked here).
    const configured = app.gateway.auth
      .configuredKeys()
      .filter((k) => tenant === undefined || k.tenant === tenant)
      .map((k) => ({ id: k.id, tenant: k.tenant, name: null, source: 'config' as const }));
    const made = (await ledger().listKeys(tenant)).map((k) => ({ id: k.id, tenant: k.tenant, name: k.name, source: 'api' as const }));
    return { keys: [...configured, ...made] };
  });

  app.delete<{ Params: { id: string } }>('/admin/keys/:id', async (request) => {
    // A key the listing shows as the config file's is not the API's to revoke: said, not "no key".
    if (app.gateway.auth.configuredKeys().some((k) => k.id === request.params.id)) {
      throw new GatewayError('invalid_request', `key "${request.params.id}" comes from the configuration file (auth.keys): revoke it by removing it there and restarting the gateway; nothing was changed`);
    }
    if (CONTROL.test(request.params.id) || !(await ledger().deleteKey(request.params.id))) throw new GatewayError('not_found', `no key "${request.params.id}"`);
    app.gateway.auth.keysChanged();
    // The last key gone from a gateway whose config has none: it is a development setup again
    // (ADR 0002), open to every loopback client as tenant `local`. Said, so that no operator
    // revoking a key takes that for a closed gateway.
    if (await app.gateway.auth.open()) {
      request.log.warn('the last API key was deleted and the config has none: the gateway now serves every loopback client as tenant "local"');
      return { id: request.params.id, deleted: true, gateway_open: true };
    }
    return { id: request.params.id, deleted: true };
  });

  app.put<{ Params: { id: string } }>('/admin/conversations/:id/cap', async (request) => {
    // Only an id a client can send (x-tollgate-conversation) can ever meet this cap.
    if (!isConversationId(request.params.id)) {
      throw new GatewayError('invalid_request', `conversation id: must be at most ${MAX_CONVERSATION_ID_LENGTH} printable ASCII characters`, {}, 'id');
    }
    const b = body(request.body, ['cap_usd', 'tenant']);
    const cap = usdOrNull(b, 'cap_usd', true) ?? null;
    // Ids are global, and the first tenant to use one owns it: the operator may say whose a
    // conversation capped before its first request is, so no other tenant can take it.
    const tenant = b.tenant === undefined || b.tenant === null ? null : id(b, 'tenant');
    // An owner cannot be changed once set, so a misspelt tenant would lock the conversation away
    // from the one meant: only a tenant that exists may be named, as for its budget.
    if (tenant !== null && !(await ledger().getTenant(tenant))) throw new GatewayError('not_found', `no tenant "${tenant}"`, {}, 'tenant');
    // One step in the store: a conversation another tenant owns is left as it is.
    const owner = await ledger().setConversationCap(request.params.id, tenant, cap);
    if (tenant !== null && owner !== tenant) {
      throw new GatewayError('invalid_request', `conversation "${request.params.id}" already belongs to ${owner === null ? 'another tenant' : `tenant "${owner}"`}`, {}, 'tenant');
    }
    return { conversation: request.params.id, cap_usd: cap };
  });

  app.get<{ Params: { id: string } }>('/admin/conversations/:id/spend', async (request) => {
    const s = isConversationId(request.params.id) ? await ledger().conversationSpend(request.params.id) : null;
    if (!s) throw new GatewayError('not_found', `no conversation "${request.params.id}"`);
    return { ...spendView(s), tenant: s.tenant || null, parent: s.parent };
  });

  app.get<{ Params: { id: string }; Querystring: { month?: string } }>('/admin/tenants/:id/spend', { config: { query: ['month'] } }, async (request) => {
    const tenant = TENANT_ID.test(request.params.id) ? await ledger().getTenant(request.params.id) : null;
    if (!tenant) throw new GatewayError('not_found', `no tenant "${request.params.id}"`);
    const month = request.query.month ?? monthOf(app.gateway.clock());
    if (!/^\d{4}-(0[1-9]|1[0-2])$/.test(month)) throw new GatewayError('invalid_request', 'month: must be YYYY-MM', {}, 'month');
    const m = await ledger().tenantMonth(tenant.id, month);
    return {
      tenant: tenant.id,
      month,
      // Sums of many turns: rounded like each turn, so no float dust shows (0.000945, not 0.0009450000000000001).
      spent_usd: roundUsd(m.spentUsd),
      // Turns of the month whose cost is unknown: spent_usd leaves them out (ADR 0006).
      unpriced_turns: m.unpricedTurns,
      reserved_usd: roundUsd(m.reservedUsd),
      monthly_budget_usd: tenant.monthlyBudgetUsd,
      remaining_usd: tenant.monthlyBudgetUsd === null ? null : roundUsd(Math.max(0, tenant.monthlyBudgetUsd - m.spentUsd - m.reservedUsd)),
    };
  });

  // Retention: the rows of requests that finished before `until` (exclusive, as the export's; on
  // `finished_at`, as a `by=settled` export's windows are) are deleted, a batch per transaction so other requests run between them. Open reservations stay;
  // spend, budgets and caps keep their own counters and do not change. Then what the rows leave
  // behind: conversation heads last moved, and runs started, before `until` and more than a day
  // ago (ADR 0005). Conversations themselves stay (owners, caps, spend).
  app.delete<{ Querystring: { until?: string } }>('/admin/ledger', { config: { query: ['until'] } }, async (request) => {
    const until = timeParam(request.query.until, 'until');
    if (until === null) throw new GatewayError('invalid_request', 'until: required: the rows of requests before this time are deleted', {}, 'until');
    // Deletion cannot be undone: a time to come (2099 for "everything") is refused, not read as now.
    const now = app.gateway.clock();
    if (until > now) {
      throw new GatewayError(
        'invalid_request',
        `until: ${new Date(until).toISOString()} is later than now (${new Date(now).toISOString()}): give a time up to now; nothing was deleted`,
        {},
        'until',
      );
    }
    const turn = () => new Promise((r) => setImmediate(r));
    let deleted = 0;
    for (;;) {
      const n = await ledger().pruneRows(until, PRUNE_BATCH_ROWS);
      deleted += n;
      if (n < PRUNE_BATCH_ROWS) break;
      await turn();
    }
    const historyUntil = Math.min(until, app.gateway.clock() - HISTORY_KEPT_MS);
    const history = { heads: 0, chain_ends: 0, runs: 0 };
    for (const table of ['heads', 'chain_ends', 'runs'] as const) {
      for (let after: string | null = ''; after !== null; ) {
        const batch = await ledger().pruneHistory(table, historyUntil, after, PRUNE_BATCH_HISTORY);
        history[table] += batch.deleted;
        after = batch.next;
        await turn();
      }
    }
    request.log.info({ until: new Date(until).toISOString(), deleted, heads_deleted: history.heads, chain_ends_deleted: history.chain_ends, runs_deleted: history.runs }, 'ledger rows deleted');
    return { deleted, heads_deleted: history.heads, runs_deleted: history.runs, until: new Date(until).toISOString() };
  });

  app.get<{ Querystring: { since?: string; until?: string; by?: string } }>('/admin/ledger', { config: { query: ['since', 'until', 'by'] } }, async (request, reply) => {
    const since = timeParam(request.query.since, 'since');
    const until = timeParam(request.query.until, 'until');
    if (since !== null && until !== null && since > until) {
      throw new GatewayError('invalid_request', `since: ${new Date(since).toISOString()} is later than until (${new Date(until).toISOString()}): the window holds nothing`, {}, 'since');
    }
    // `by=settled`: the window is on when each request was settled, so exports read back to back
    // (each `since` the last `until`) see every settled row once — by the time a request began, one
    // still running at a cut is exported open, and its settled figures fall in no later window.
    const by = request.query.by ?? 'time';
    if (by !== 'time' && by !== 'settled') throw new GatewayError('invalid_request', `by: must be "time" (when each request began; the default) or "settled" (when it was settled)`, {}, 'by');
    // HEAD (Fastify answers it with this handler): the head alone, without reading a row.
    // Written raw: Fastify would say `content-length: 0`, and the GET's length is not known.
    if (request.method === 'HEAD') {
      reply.hijack();
      reply.raw.writeHead(200, { 'content-type': 'application/x-ndjson; charset=utf-8' });
      reply.raw.end();
      return;
    }
    const rows = ledger().exportRows(since, until, by)[Symbol.asyncIterator]();
    // The first page is read before the head is written: a store that fails at once is answered
    // like every other error (a 500 in the envelope), not with a 200 that never ends.
    let next = await rows.next();
    reply.hijack();
    const raw = reply.raw;
    raw.writeHead(200, { 'content-type': 'application/x-ndjson; charset=utf-8' });
    // A client that leaves ends the export (else a full socket would wait on a 'drain' for ever).
    const gone = new Promise<void>((r) => raw.once('close', r));
    let rowsSinceLook = 0;
    let turnAt = performance.now();
    try {
      while (!next.done && !raw.destroyed) {
        if (!raw.write(`${JSON.stringify(next.value)}\n`)) {
          await Promise.race([new Promise((r) => raw.once('drain', r)), gone]);
          turnAt = performance.now();
        }
        // A socket that takes every write never makes the loop wait: every 5 ms the event loop
        // gets a turn, or a large export would hold up every other request until it ended (every
        // 1,000 rows was ~30 ms of JSON a turn: requests beside an export waited 150 ms, p50).
        if (++rowsSinceLook === EXPORT_CLOCK_ROWS) {
          rowsSinceLook = 0;
          if (performance.now() - turnAt >= EXPORT_YIELD_MS) {
            await new Promise((r) => setImmediate(r));
            turnAt = performance.now();
          }
        }
        next = await rows.next();
      }
      raw.end();
    } catch (err) {
      // The head has gone: the export is cut off (the client sees a body that did not end), never
      // passed off as whole.
      request.log.error({ err }, 'the ledger export failed part way');
      raw.destroy();
    } finally {
      if (!next.done) await rows.return?.();
    }
  });
};

export default route;
