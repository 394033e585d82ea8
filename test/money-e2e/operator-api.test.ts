// The operator API (SPEC §8, §9, §11): the admin token and nothing else; keys made here work as
// client keys, are stored only as hashes, and can be revoked; the ledger exports as NDJSON.

import { existsSync, readFileSync } from 'node:fs';
import { createHash } from 'node:crypto';
import t from 'tap';
import { ADMIN, ALICE, admission, call, chat, moneyWorld } from './money-fixture.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway } from '../helpers/gateway.js';
import { reservation, settlement } from '../helpers/stores.js';

const ask = { model: 'llama-local', messages: [{ role: 'user', content: 'hello' }], max_tokens: 5 };

t.test('no token is 401, a client key is 403, the admin token passes', async (t) => {
  const { gw } = await moneyWorld(t);
  const routes: Array<[string, string, unknown]> = [
    ['GET', '/admin/ledger', undefined],
    ['POST', '/admin/keys', { tenant: 'mallory' }],
    ['PUT', '/admin/tenants/alice/budget', { monthly_budget_usd: 1000 }],
    ['PUT', '/admin/conversations/x/cap', { cap_usd: null }],
    ['GET', '/admin/tenants/alice/spend', undefined],
  ];
  for (const [method, path, body] of routes) {
    const none = await call(gw.url, method, path, {}, body);
    t.equal(none.status, 401, `${method} ${path} without a token`);
    t.match(none.body, { error: { code: 'admin_token_required', type: 'authentication_error' } });
    t.equal((await call(gw.url, method, path, { authorization: 'Bearer not-the-token' }, body)).status, 401);
    const client = await call(gw.url, method, path, { authorization: `Bearer ${ALICE}` }, body);
    t.equal(client.status, 403, `${method} ${path} with a client key`);
    t.match(client.body, { error: { code: 'forbidden', type: 'permission_error' } });
  }
  // Nothing the refused calls asked for happened.
  const alice = await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN);
  t.equal(alice.status, 200);
  t.equal(alice.body.monthly_budget_usd, null);
});

t.test('a key made by the operator works, is stored hashed, and can be revoked', async (t) => {
  const { gw } = await moneyWorld(t);
  // 1. Made for a new tenant; shown once.
  const made = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave', name: 'ci' });
  t.equal(made.status, 201);
  const { id, key } = made.body as { id: string; key: string };
  t.match(key, /^tg-.{20,}$/);
  t.ok(id && id !== key);
  const named = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave', name: 5 });
  t.equal(named.status, 400, 'a name that is not a string is refused, not turned into one');
  t.match(named.body, { error: { code: 'invalid_request', param: 'name' } });
  // A name past 200 characters is refused, not cut (an audit: cut inside an emoji, it was no text).
  const long = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave', name: 'x'.repeat(199) + '\u{1F600}' });
  t.equal(long.status, 400);
  t.match(long.body, { error: { code: 'invalid_request', param: 'name', message: 'name: has 201 characters, the most is 200' } });
  t.equal((await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave', name: 'x'.repeat(200) })).status, 201, '200 is taken');

  // 2. It works as a client key, for its own tenant.
  const r = await chat(gw, key, ask, { 'x-tollgate-conversation': 'daves' });
  t.equal(r.status, 200);
  t.equal((await call(gw.url, 'GET', '/v1/conversations/daves/spend', { authorization: `Bearer ${key}` })).status, 200);
  t.equal((await call(gw.url, 'GET', '/v1/conversations/daves/spend', { authorization: `Bearer ${ALICE}` })).status, 404);
  // …and it is a client key: the operator API refuses it.
  t.equal((await call(gw.url, 'GET', '/admin/ledger', { authorization: `Bearer ${key}` })).status, 403);

  // 3. The raw key is nowhere on disk; its SHA-256 is (so the right files were read). Checked on
  // the SQLite file; the PostgreSQL store writes the same hash column (test/ledger/records.test.ts).
  if (gw.ledger.kind === 'sqlite') {
    const files = [gw.dbPath, `${gw.dbPath}-wal`, `${gw.dbPath}-shm`].filter((f) => existsSync(f));
    const bytes = Buffer.concat(files.map((f) => readFileSync(f)));
    t.notOk(bytes.includes(Buffer.from(key)), 'the raw key is not stored');
    t.ok(bytes.includes(Buffer.from(createHash('sha256').update(key).digest('hex'))), 'its hash is');
  }

  // 4. Revoked: refused at once; revoking again is a 404.
  const del = await call(gw.url, 'DELETE', `/admin/keys/${id}`, ADMIN);
  t.equal(del.status, 200);
  const after = await chat(gw, key, ask);
  t.equal(after.status, 401);
  t.match(after.body, { error: { code: 'invalid_api_key' } });
  t.equal((await call(gw.url, 'DELETE', `/admin/keys/${id}`, ADMIN)).status, 404);
});

// An outside audit: there was no way to list what exists, and a key's id, shown once, was the
// only way to revoke it; a misspelt tenant on a new key made a new tenant without a word.
t.test('the operator lists tenants and keys (ids, never keys), and is told when a key made a tenant', async (t) => {
  const { gw } = await moneyWorld(t);
  const made = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave', name: 'ci' });
  t.equal((made.body as { tenant_created: boolean }).tenant_created, true, 'a new tenant');
  const again = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'dave' });
  t.equal((again.body as { tenant_created: boolean }).tenant_created, false, 'one that exists');
  await call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'erin', monthly_budget_usd: 3 });

  const tenants = await call(gw.url, 'GET', '/admin/tenants', ADMIN);
  t.equal(tenants.status, 200);
  const list = (tenants.body as { tenants: Array<{ id: string; monthly_budget_usd: number | null }> }).tenants;
  t.same(list.map((x) => x.id), [...list.map((x) => x.id)].sort(), 'by id');
  t.ok(['alice', 'bob', 'dave', 'erin'].every((id) => list.some((x) => x.id === id)), 'every tenant');
  t.same(list.find((x) => x.id === 'erin'), { id: 'erin', monthly_budget_usd: 3 });
  t.same(list.find((x) => x.id === 'dave'), { id: 'dave', monthly_budget_usd: null });

  const keys = await call(gw.url, 'GET', '/admin/keys', ADMIN);
  t.equal(keys.status, 200);
  const all = (keys.body as { keys: Array<{ id: string; tenant: string; name: string | null; source: string }> }).keys;
  const hash = (k: string) => `cfg-${createHash('sha256').update(k).digest('hex').slice(0, 12)}`;
  t.same(all.filter((k) => k.source === 'config').map((k) => [k.id, k.tenant]), [[hash(ALICE), 'alice'], [hash('tg-bob'), 'bob']], "the config's keys, by their ids");
  t.same(all.filter((k) => k.source === 'api').map((k) => [k.id, k.tenant, k.name]).sort(), [[(made.body as { id: string }).id, 'dave', 'ci'], [(again.body as { id: string }).id, 'dave', null]].sort());
  t.notMatch(JSON.stringify(keys.body), /tg-/, 'no key in the list');
  // A config key listed here is revoked in the config file: the API says so (regression: "no key").
  const configKey = await call(gw.url, 'DELETE', `/admin/keys/${hash(ALICE)}`, ADMIN);
  t.equal(configKey.status, 400);
  t.match(configKey.body, { error: { code: 'invalid_request', message: /comes from the configuration file \(auth\.keys\): revoke it by removing it there/ } });
  t.equal((await chat(gw, ALICE, ask)).status, 200, 'the config key still works');
  const daves = await call(gw.url, 'GET', '/admin/keys?tenant=dave', ADMIN);
  t.equal((daves.body as { keys: unknown[] }).keys.length, 2);
  t.equal((await call(gw.url, 'GET', '/admin/keys?tenant=nobody', ADMIN)).status, 404);
  t.equal((await call(gw.url, 'GET', '/admin/keys?tennant=dave', ADMIN)).status, 400, 'a misspelt filter is no filter');
  t.equal((await call(gw.url, 'GET', '/admin/keys', { authorization: `Bearer ${ALICE}` })).status, 403);
  // A review: every operator route refuses a query parameter it does not take, before it acts.
  const id = (made.body as { id: string }).id;
  const dry = await call(gw.url, 'DELETE', `/admin/keys/${id}?dry_run=true`, ADMIN);
  t.equal(dry.status, 400);
  t.match(dry.body, { error: { param: 'dry_run', message: 'dry_run: unknown query parameter (this route takes no query parameters); nothing was done' } });
  t.equal((await chat(gw, (made.body as { key: string }).key, ask)).status, 200, 'the key was not revoked');
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/conv-q/cap?tenant=dave', ADMIN, { cap_usd: 1 })).status, 400, 'an owner given in the query is not taken for one');
  t.equal((await call(gw.url, 'POST', '/admin/tenants?monthly_budget_usd=5', ADMIN, { id: 'fred' })).status, 400);
  const twice = await call(gw.url, 'GET', '/admin/keys?tenant=dave&tenant=erin', ADMIN);
  t.equal(twice.status, 400);
  t.match(twice.body, { error: { param: 'tenant', message: 'tenant: given 2 times, give it once; nothing was done' } });
  t.equal((await call(gw.url, 'DELETE', `/admin/keys/${id}?dry_run=true`, {})).status, 401, 'the token first');
});

t.test('the ledger exports as NDJSON, one row per request, between since and until', async (t) => {
  const { gw } = await moneyWorld(t, { clock: true });
  const t0 = gw.now.ms;
  const hour = 3_600_000;
  // 1. Three requests an hour apart.
  for (let i = 0; i < 3; i++) {
    gw.now.ms = t0 + i * hour;
    t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': `hour-${i}` })).status, 200);
  }
  const ledger = async (query: string) => {
    const res = await fetch(`${gw.url}/admin/ledger${query}`, { headers: ADMIN });
    t.equal(res.status, 200);
    t.match(res.headers.get('content-type'), /^application\/x-ndjson/);
    const text = await res.text();
    t.ok(text === '' || text.endsWith('\n'));
    return text
      .split('\n')
      .filter((l) => l.length > 0)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  };
  const all = await ledger('');
  t.same(all.map((r) => r.conversation), ['hour-0', 'hour-1', 'hour-2']);
  for (const row of all) {
    for (const field of ['id', 'time', 'tenant', 'conversation', 'run', 'model', 'upstream', 'status', 'reserved_tokens', 'charge_tokens', 'refund_tokens', 'cost_usd']) {
      t.ok(field in row, `row has ${field}`);
    }
    t.match(row, { tenant: 'alice', model: 'llama-local', upstream: 'box', status: 200, cost_usd: 0 });
    t.equal((row.charge_tokens as number) + (row.refund_tokens as number), row.reserved_tokens);
  }
  t.equal(all[1].time, new Date(t0 + hour).toISOString());

  // 2. since is inclusive, until exclusive; ISO times and epoch milliseconds alike.
  const iso = (ms: number) => new Date(ms).toISOString();
  t.same((await ledger(`?since=${iso(t0 + hour)}`)).map((r) => r.conversation), ['hour-1', 'hour-2']);
  t.same((await ledger(`?until=${iso(t0 + hour)}`)).map((r) => r.conversation), ['hour-0']);
  t.same((await ledger(`?since=${t0 + hour}&until=${t0 + 2 * hour}`)).map((r) => r.conversation), ['hour-1']);
  t.same(await ledger(`?since=${iso(t0 + 3 * hour)}`), []);
  // A time written without a zone is UTC, like the ledger's, wherever the gateway runs.
  const tz = process.env.TZ;
  process.env.TZ = 'America/New_York';
  try {
    const zoneless = iso(t0 + hour).replace(/Z$/, '');
    t.same((await ledger(`?since=${zoneless}`)).map((r) => r.conversation), ['hour-1', 'hour-2'], 'a zone-less since is read as UTC');
    t.same((await ledger(`?until=${zoneless.slice(0, 16)}`)).map((r) => r.conversation), ['hour-0'], 'so is one without seconds');
  } finally {
    if (tz === undefined) delete process.env.TZ;
    else process.env.TZ = tz;
  }
  // 3. A time that is not one is a 400 naming the parameter.
  const bad = await call(gw.url, 'GET', '/admin/ledger?since=yesterday', ADMIN);
  t.equal(bad.status, 400);
  t.match(bad.body, { error: { param: 'since' } });
  // Nor is what Date.parse would guess at ("-5" is May 2001), a day past its month's end, or two values.
  for (const q of ['since=-5', 'since=1.5', 'since=x%202026', 'until=2026-02-31', 'since=1&since=2', 'since=99999999999999999999', 'until=9223372036854775808', 'until=8640000000000001']) {
    const r = await call(gw.url, 'GET', `/admin/ledger?${q}`, ADMIN);
    t.equal(r.status, 400, `${q}: 400`);
  }
  t.equal((await call(gw.url, 'GET', '/admin/ledger?until=8640000000000000', ADMIN)).status, 200, 'the last time a Date holds is one');
  t.equal((await call(gw.url, 'GET', '/admin/ledger?since=2026-11-01', ADMIN)).status, 200, 'a date alone is a time');
  // Epoch seconds and compact dates are not read as milliseconds of 1970; an unencoded + is named.
  for (const [q, message] of [
    ['since=1764547200', 'since: 1764547200 is not epoch milliseconds (those have 12 or more digits, such as 1764547200000); write a date as 2026-12-01'],
    ['until=20261201', 'until: 20261201 is not epoch milliseconds (those have 12 or more digits, such as 1764547200000); write a date as 2026-12-01'],
    ['since=2026-12-01T00:00:00+01:00', 'since: "2026-12-01T00:00:00 01:00" has a space before its zone offset: write the offset\'s + as %2B in the URL (or use Z)'],
    ['since=2026-12-01T00:00+01:00', 'since: "2026-12-01T00:00 01:00" has a space before its zone offset: write the offset\'s + as %2B in the URL (or use Z)'],
    // A date and a time with a space between them (as SQL writes them) has no offset to encode.
    ['since=2026-11-15%2012:00', 'since: "2026-11-15 12:00" has a space between its date and time: write a T there (2026-11-15T12:00:00Z)'],
    ['until=2026-11-15%2012:00:00', 'until: "2026-11-15 12:00:00" has a space between its date and time: write a T there (2026-11-15T12:00:00Z)'],
  ]) {
    const refused = await call(gw.url, 'GET', `/admin/ledger?${q}`, ADMIN);
    t.equal(refused.status, 400, q);
    t.match(refused.body, { error: { code: 'invalid_request', message } }, q);
  }
  t.equal((await call(gw.url, 'GET', '/admin/ledger?since=0', ADMIN)).status, 200, '0 is the start');
  // A long value is refused at once: no pattern reads it (regression: 15,000 T's held the event
  // loop for most of a second in the one that looks for an unencoded +).
  let worst = 0;
  let last = performance.now();
  const tick = setInterval(() => {
    worst = Math.max(worst, performance.now() - last);
    last = performance.now();
  }, 5);
  const long = await call(gw.url, 'GET', `/admin/ledger?since=${'T'.repeat(15_000)}`, ADMIN);
  clearInterval(tick);
  t.equal(long.status, 400);
  t.ok(worst < 150, `the event loop waited ${worst.toFixed(0)} ms at most`);
  // HEAD (a probe, `curl -I`) gets the head of an export without one being read: no body, its
  // parameters checked as GET's are, and the ledger not read.
  const reads = gw.ledger.exportRows;
  let exported = 0;
  gw.ledger.exportRows = (...args) => {
    exported++;
    return reads.apply(gw.ledger, args);
  };
  const head = await fetch(`${gw.url}/admin/ledger`, { method: 'HEAD', headers: ADMIN });
  t.equal(head.status, 200);
  t.match(head.headers.get('content-type'), /^application\/x-ndjson/);
  // No length: the GET's (chunked, with rows here) is not known, and 0 would say "empty" (RFC 9110 §8.6).
  t.equal(head.headers.get('content-length'), null, 'no content-length of 0');
  t.equal(await head.text(), '');
  t.equal((await fetch(`${gw.url}/admin/ledger?since=yesterday`, { method: 'HEAD', headers: ADMIN })).status, 400, 'a bad parameter is a 400 for HEAD too');
  t.equal((await fetch(`${gw.url}/admin/ledger`, { method: 'HEAD' })).status, 401, 'and it needs the token');
  t.equal(exported, 0, 'HEAD read no row');
  t.equal((await call(gw.url, 'GET', '/admin/ledger', ADMIN)).status, 200);
  t.equal(exported, 1, 'GET does');
  gw.ledger.exportRows = reads;
  t.equal((await call(gw.url, 'GET', '/admin/ledger?since=2026-11-01T12:00:00.5%2B01:00', ADMIN)).status, 200, 'so is one with a fraction and a zone');
  // And an operator can cap only a conversation id a client can send; a month is a month.
  t.equal((await call(gw.url, 'PUT', `/admin/conversations/${'c'.repeat(257)}/cap`, ADMIN, { cap_usd: 1 })).status, 400);
  t.equal((await call(gw.url, 'GET', '/admin/tenants/alice/spend?month=2026-13', ADMIN)).status, 400);
});

t.test('posting a tenant again changes only what the body says', async (t) => {
  const { gw } = await moneyWorld(t);
  const made = await call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'erin', monthly_budget_usd: 10 });
  t.equal(made.status, 201, 'created');
  t.same(made.body, { id: 'erin', monthly_budget_usd: 10 });
  const again = await call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'erin' });
  t.equal(again.status, 200, 'it existed');
  t.same(again.body, { id: 'erin', monthly_budget_usd: 10 }, 'the budget stays when the field is left out');
  const lifted = await call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'erin', monthly_budget_usd: null });
  t.same(lifted.body, { id: 'erin', monthly_budget_usd: null }, 'an explicit null lifts it');
  t.equal((await call(gw.url, 'GET', '/admin/tenants/erin/spend', ADMIN)).body.monthly_budget_usd, null);
});

t.test('operator calls at the same time never write back a budget read before the other changed it', async (t) => {
  const { gw } = await moneyWorld(t);
  const budgetOf = async (tenant: string) => (await call(gw.url, 'GET', `/admin/tenants/${tenant}/spend`, ADMIN)).body.monthly_budget_usd;
  // A set-up script making a tenant with its budget and a key for it, both at once.
  const made = await Promise.all(
    Array.from({ length: 40 }, async (_, i) => {
      const [tenant, key] = await Promise.all([
        call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: `cust${i}`, monthly_budget_usd: 5 }),
        call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: `cust${i}` }),
      ]);
      return { tenant, key, budget: await budgetOf(`cust${i}`) };
    }),
  );
  t.same(made.filter((m) => m.budget !== 5).length, 0, 'every tenant keeps the budget it was made with');
  t.ok(made.every((m) => m.key.status === 201 && [200, 201].includes(m.tenant.status)));
  t.equal(made.filter((m) => m.tenant.status === 201).length + made.filter((m) => m.tenant.status === 200).length, 40);
  // A budget lowered while the same script posts the tenant again without one.
  await call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'alice2', monthly_budget_usd: 50 });
  let undone = 0;
  for (let i = 0; i < 20; i++) {
    await call(gw.url, 'PUT', '/admin/tenants/alice2/budget', ADMIN, { monthly_budget_usd: 50 });
    await Promise.all([
      call(gw.url, 'PUT', '/admin/tenants/alice2/budget', ADMIN, { monthly_budget_usd: 1 }),
      call(gw.url, 'POST', '/admin/tenants', ADMIN, { id: 'alice2' }),
    ]);
    if ((await budgetOf('alice2')) !== 1) undone++;
  }
  t.equal(undone, 0, 'a lowered budget is never put back');
});

t.test('exports by settlement time, read back to back, see every settled row once, however long a request ran', async (t) => {
  const { gw, metered } = await moneyWorld(t, { clock: true, metered: { completionTokens: 3, delayMs: 60 } });
  const t0 = gw.now.ms;
  const minute = 60_000;
  const ledger = async (query: string) => {
    const res = await fetch(`${gw.url}/admin/ledger${query}`, { headers: ADMIN });
    t.equal(res.status, 200, query);
    return (await res.text())
      .split('\n')
      .filter((l) => l.length > 0)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  };
  const body = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'a long answer' }], max_tokens: 5 };
  // A request settled at once, then one that begins before the first cut and ends after it.
  t.equal((await chat(gw, ALICE, body, { 'x-tollgate-conversation': 'quick' })).status, 200);
  const long = chat(gw, ALICE, { ...body, stream: true }, { 'x-tollgate-conversation': 'long' });
  while (metered.requests.length < 2) await new Promise((r) => setTimeout(r, 5));
  const cut1 = t0 + minute;
  gw.now.ms = t0 + 2 * minute;
  // The billing job's first window: by the request's own time the long one is there, still open…
  const byTime = await ledger(`?until=${cut1}`);
  t.same(byTime.map((r) => [r.conversation, r.state]), [['quick', 'settled'], ['long', 'reserved']]);
  // …and by settlement time only what is settled.
  const first = await ledger(`?by=settled&until=${cut1}`);
  t.same(first.map((r) => r.conversation), ['quick']);
  t.equal((await long).status, 200);
  const cut2 = t0 + 3 * minute;
  gw.now.ms = cut2 + minute;
  // The next window: the long request, settled, once; by its own time it fell in no later window.
  const second = await ledger(`?by=settled&since=${cut1}&until=${cut2}`);
  t.same(second.map((r) => [r.conversation, r.state]), [['long', 'settled']]);
  t.equal(second[0].finished_at, new Date(t0 + 2 * minute).toISOString());
  t.same(await ledger(`?since=${cut1}&until=${cut2}`), [], 'by the time it began, the settled row is in no later window');
  const bad = await call(gw.url, 'GET', '/admin/ledger?by=finished', ADMIN);
  t.equal(bad.status, 400);
  t.match(bad.body, { error: { code: 'invalid_request', param: 'by' } });
});

t.test('spend views show sums rounded like each turn, with no float dust', async (t) => {
  const { gw } = await moneyWorld(t);
  // Two turns of $0.1 and $0.2 add up to 0.30000000000000004 in floating point.
  for (const [i, cost] of [0.1, 0.2].entries()) {
    const r = reservation({ tenant: 'alice', conversation: 'dust', run: 'dust-run', month: '2025-06', time: Date.UTC(2025, 5, 10) + i });
    t.same(await gw.ledger.admit(r), { ok: true });
    await gw.ledger.settle(r.id, settlement(r, 10, { costUsd: cost }));
  }
  const month = await call(gw.url, 'GET', '/admin/tenants/alice/spend?month=2025-06', ADMIN);
  t.equal(month.body.spent_usd, 0.3);
  const conversation = await call(gw.url, 'GET', '/v1/conversations/dust/spend', { authorization: `Bearer ${ALICE}` });
  t.equal(conversation.body.spent_usd, 0.3);
  t.same(conversation.body.by_model, { 'gpt-4o-mini': { turns: 2, spent_usd: 0.3 } });
  t.equal((await call(gw.url, 'GET', '/admin/conversations/dust/spend', ADMIN)).body.spent_usd, 0.3);
});


t.test('a field a route does not take is a 400 naming it, and changes nothing (a misspelt budget is not "no budget")', async (t) => {
  const { gw } = await moneyWorld(t);
  t.equal((await call(gw.url, 'PUT', '/admin/tenants/alice/budget', ADMIN, { monthly_budget_usd: 7 })).status, 200);
  const cases: Array<[string, string, Record<string, unknown>, string, string]> = [
    ['POST', '/admin/tenants', { id: 'acme', monthly_budget: 5 }, 'monthly_budget', 'monthly_budget: unknown field (expected id, monthly_budget_usd)'],
    ['POST', '/admin/tenants', { id: 'acme', monthlyBudgetUsd: 5 }, 'monthlyBudgetUsd', 'monthlyBudgetUsd: unknown field (expected id, monthly_budget_usd)'],
    ['PUT', '/admin/tenants/alice/budget', { monthly_budget_usd: 1, note: 'x' }, 'note', 'note: unknown field (expected monthly_budget_usd)'],
    ['PUT', '/admin/tenants/alice/budget', { budget_usd: 1 }, 'budget_usd', 'budget_usd: unknown field (expected monthly_budget_usd)'],
    ['POST', '/admin/keys', { tenant: 'x', monthly_budget_usd: 5 }, 'monthly_budget_usd', 'monthly_budget_usd: unknown field (expected tenant, name)'],
    ['PUT', '/admin/conversations/c1/cap', { cap: 1 }, 'cap', 'cap: unknown field (expected cap_usd, tenant)'],
    ['PUT', '/admin/conversations/c1/cap', { cap_usd: 1, tenant: 'a b' }, 'tenant', 'tenant: must be 1–128 letters, digits or . _ : @ -'],
  ];
  for (const [method, path, body, param, message] of cases) {
    const r = await call(gw.url, method, path, ADMIN, body);
    t.equal(r.status, 400, `${method} ${path} ${JSON.stringify(body)}`);
    t.match(r.body, { error: { code: 'invalid_request', type: 'invalid_request_error', param, message } });
  }
  // Nothing the refused calls asked for happened: no tenant acme or x, alice's budget as it was,
  // no cap on c1.
  t.equal((await call(gw.url, 'GET', '/admin/tenants/acme/spend', ADMIN)).status, 404);
  t.equal((await call(gw.url, 'GET', '/admin/tenants/x/spend', ADMIN)).status, 404);
  t.equal((await call(gw.url, 'GET', '/admin/tenants/alice/spend', ADMIN)).body.monthly_budget_usd, 7);
  t.equal((await call(gw.url, 'GET', '/admin/conversations/c1/spend', ADMIN)).status, 404);
});

t.test('the operator API cannot be reached around its token: a percent-encoded path or an absolute-form target is 401 too', async (t) => {
  const { gw } = await moneyWorld(t);
  const { connect } = await import('node:net');
  for (const [method, path, body] of [
    ['POST', '/%61dmin/keys', { tenant: 'alice' }],
    ['PUT', '/%61dmin/tenants/alice/budget', { monthly_budget_usd: null }],
    ['GET', '/%61dmin/ledger', undefined],
    ['GET', '/a%64min/tenants/alice/spend', undefined],
  ] as const) {
    const res = await call(gw.url, method, path, { authorization: `Bearer ${ALICE}` }, body);
    t.equal(res.status, 403, `${method} ${path} with a client key`);
    t.equal((await call(gw.url, method, path, {}, body)).status, 401, `${method} ${path} without a token`);
  }
  // The absolute form of a request target (RFC 9112 §3.2.2), over a raw socket.
  const { port } = new URL(gw.url);
  const raw = await new Promise<string>((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1', () => socket.write(`GET http://x/admin/ledger HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n`));
    let text = '';
    socket.on('data', (b) => (text += b.toString()));
    socket.on('end', () => resolve(text));
    socket.on('error', reject);
  });
  t.match(raw, /^HTTP\/1\.1 401 /, 'absolute form without a token');
  // Two Authorization headers, the admin token first: refused, not the first one taken.
  const twice = await new Promise<string>((resolve, reject) => {
    const socket = connect(Number(port), '127.0.0.1', () =>
      socket.write(`GET /admin/tenants/alice/spend HTTP/1.1\r\nHost: x\r\nAuthorization: ${ADMIN.authorization}\r\nAuthorization: Bearer ${ALICE}\r\nConnection: close\r\n\r\n`),
    );
    let text = '';
    socket.on('data', (b) => (text += b.toString()));
    socket.on('end', () => resolve(text));
    socket.on('error', reject);
  });
  t.match(twice, /^HTTP\/1\.1 401 /, 'two Authorization headers');
  t.match(twice, /Authorization sent 2 times: send one token/);
  const spend = await call(gw.url, 'GET', '/admin/tenants/alice/spend', { authorization: `Bearer ${ADMIN}` });
  t.not((spend.body as { monthly_budget_usd: unknown }).monthly_budget_usd, null, "alice's budget is still there");
});

t.test('an id no record can have (a NUL, a broken rule) is not found on every store; a key name with control characters is a 400', async (t) => {
  const { gw } = await moneyWorld(t);
  for (const [method, path, body] of [
    ['GET', '/v1/conversations/%00/spend', undefined],
    ['GET', '/admin/conversations/%00/spend', undefined],
    ['GET', '/admin/tenants/%00/spend', undefined],
    ['PUT', '/admin/tenants/%00/budget', { monthly_budget_usd: 1 }],
    ['DELETE', '/admin/keys/%00', undefined],
  ] as const) {
    const r = await call(gw.url, method, path, method === 'GET' && path.startsWith('/v1') ? { authorization: `Bearer ${ALICE}` } : ADMIN, body);
    t.equal(r.status, 404, `${method} ${path}`);
  }
  const named = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'alice', name: 'a\u0000b' });
  t.equal(named.status, 400);
  t.match(named.body, { error: { param: 'name' } });
});

t.test('a model or key name the stores cannot keep alike (a control character, an unpaired surrogate) is a 400, and nothing is written', async (t) => {
  // PostgreSQL cannot hold a NUL (the request was a 500 there and a 200 on SQLite), and the two
  // stores wrote an unpaired surrogate differently, so spend and exports differed by store.
  const up = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(up.close);
  const gw = await startGateway(t, {
    upstreams: [{ name: 'box', kind: 'openai', baseUrl: `${up.url}/v1`, models: ['gpt-*'], billing: 'local', contextWindow: 128000 }],
    auth: { keys: [{ key: ALICE, tenant: 'alice' }] },
  });
  const messages = [{ role: 'user', content: 'hello' }];
  for (const [model, why] of [
    ['gpt-4o\u0000x', /^model: must not contain control characters \(U\+0000 at character 6\)$/],
    ['gpt-4o\u007f', /control characters \(U\+007F/],
    ['gpt-\ud800x', /^model: must be well-formed text: it holds an unpaired surrogate \(U\+D800 at character 4\)$/],
    ['gpt-x\udc00', /unpaired surrogate \(U\+DC00 at character 5\)/],
  ] as const) {
    const r = await chat(gw, ALICE, { model, messages, max_tokens: 5 });
    t.equal(r.status, 400, JSON.stringify(model));
    t.match(r.body, { error: { code: 'invalid_request', param: 'model', message: why } });
    const planned = await admission(gw, ALICE, { model, messages, max_tokens: 5 });
    t.same(planned.verdict, { admit: false, status: 400, error: r.body }, 'the admission verdict is the real answer');
  }
  t.equal(up.requests.length, 0, 'no model was called');
  const exported = async () => (await (await fetch(`${gw.url}/admin/ledger`, { headers: ADMIN })).text()).split('\n').filter(Boolean).map((l) => JSON.parse(l) as { model: string });
  t.same(await exported(), [], 'the ledger holds no row');
  // A character beyond the first plane is one code point in a well-formed pair: a name may hold it.
  const astral = await chat(gw, ALICE, { model: 'gpt-\u{1F999}', messages, max_tokens: 5 });
  t.equal(astral.status, 200);
  t.same((await exported()).map((r) => r.model), ['gpt-\u{1F999}'], 'kept as sent, on every store');

  const broken = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'alice', name: 'ci \ud83e runner' });
  t.equal(broken.status, 400);
  t.match(broken.body, { error: { param: 'name', message: /^name: must be well-formed text: it holds an unpaired surrogate/ } });
  const made = await call(gw.url, 'POST', '/admin/keys', ADMIN, { tenant: 'alice', name: 'ci \u{1F999} runner' });
  t.equal(made.status, 201);
  t.equal(made.body.name, 'ci \u{1F999} runner');
});

t.test('a ledger export that fails part way is cut off, not passed off as whole; one that fails at once is a 500', async (t) => {
  const { gw } = await moneyWorld(t);
  t.equal((await chat(gw, ALICE, ask)).status, 200);
  const exportRows = gw.ledger.exportRows.bind(gw.ledger);
  let failAfter = 1;
  gw.ledger.exportRows = async function* (since, until) {
    let n = 0;
    for await (const row of exportRows(since, until)) {
      if (n++ === failAfter) break;
      yield row;
    }
    throw new Error('the store went away');
  };
  const outcome = await fetch(`${gw.url}/admin/ledger`, { headers: ADMIN }).then((r) => r.text()).then(() => 'whole', () => 'cut off');
  t.equal(outcome, 'cut off', 'the export does not end as a whole one');
  failAfter = 0;
  t.equal((await call(gw.url, 'GET', '/admin/ledger', ADMIN)).status, 500);
});

// Review of the price table (SPEC §7: every price carries its source and date): a ledger row says
// where its cost came from and which price it used, so a bill can be checked line by line.
t.test('an exported row says where its cost came from, and the price and date it used', async (t) => {
  const { gw } = await moneyWorld(t);
  const { gw: billed } = await moneyWorld(t, { metered: { providerCost: 0.0123 } });
  t.equal((await chat(gw, ALICE, { ...ask, model: 'gpt-4o' })).status, 200);
  t.equal((await chat(gw, ALICE, ask)).status, 200);
  t.equal((await chat(billed, ALICE, { ...ask, model: 'gpt-4o' })).status, 200);
  const rows = async (world: typeof gw) =>
    (await (await fetch(`${world.url}/admin/ledger`, { headers: ADMIN })).text())
      .split('\n')
      .filter((l) => l.length > 0)
      .map((l) => JSON.parse(l) as Record<string, unknown>);
  const [listed, local] = await rows(gw);
  t.match(listed, { model: 'gpt-4o', cost_source: 'list-price', price_source: /^override:.*prices\.json$/, price_date: '2026-01-01' });
  t.match(local, { model: 'llama-local', cost_usd: 0, cost_source: 'local', price_source: null, price_date: null });
  const [provided] = await rows(billed);
  t.match(provided, { cost_usd: 0.0123, cost_source: 'provider', price_source: null, price_date: null }, "the provider's own figure");
});
