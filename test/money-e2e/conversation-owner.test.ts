// Conversation ids are global, and the first tenant to use one owns it (SPEC §6: a tenant spends
// and reads only its own conversations). A conversation the operator capped before its first
// request is owned by the first tenant that uses it — as its conversation or as a parent — or by
// the tenant the operator names with the cap; and two tenants' first requests at the same moment
// cannot both get in: the atomic admission holds the owner too.

import t from 'tap';
import { ADMIN, ALICE, BOB, admission, call, chat, moneyWorld, type ErrorBody } from './money-fixture.js';
import type { LedgerRow } from '../../metering/ledger.js';

const ask = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'Next step?' }], max_tokens: 5 };
const spendOf = (url: string, key: string, id: string) => call(url, 'GET', `/v1/conversations/${id}/spend`, { authorization: `Bearer ${key}` });

t.test("a capped conversation used only as a parent is its first user's (regression: anyone could draw on it and read its cap)", async (t) => {
  const { gw } = await moneyWorld(t);
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/proj-a/cap', ADMIN, { cap_usd: 5 })).status, 200);
  const child = await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'a-task-1', 'x-tollgate-parent': 'proj-a' });
  t.equal(child.status, 200);
  t.equal((await spendOf(gw.url, ALICE, 'proj-a')).status, 200, "alice reads her project's spend (it was nobody's: 404)");
  t.match((await call(gw.url, 'GET', '/admin/conversations/proj-a/spend', ADMIN)).body, { tenant: 'alice', cap_usd: 5 });

  // Bob can neither hang a child under it, nor take it, nor see its figures.
  const under = await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'b-task', 'x-tollgate-parent': 'proj-a' });
  t.equal(under.status, 400);
  t.match((under.body as unknown as ErrorBody).error, { code: 'invalid_request', param: 'x-tollgate-parent', message: 'conversation "proj-a" belongs to another tenant: choose another id' });
  t.equal((await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'proj-a' })).status, 400);
  const looked = await admission(gw, BOB, ask, { 'x-tollgate-conversation': 'b-task', 'x-tollgate-parent': 'proj-a' });
  t.equal(looked.verdict.status, 400);
  t.equal((await spendOf(gw.url, BOB, 'proj-a')).status, 404);
  t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'a-task-2', 'x-tollgate-parent': 'proj-a' })).status, 200, 'alice goes on');
});

t.test('the operator may name the owner with the cap; a conversation already owned keeps its owner', async (t) => {
  const { gw } = await moneyWorld(t);
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/proj-b/cap', ADMIN, { cap_usd: 2, tenant: 'bob' })).status, 200);
  t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'proj-b' })).status, 400, "bob's before any request");
  t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'a-child', 'x-tollgate-parent': 'proj-b' })).status, 400);
  t.equal((await chat(gw, BOB, ask, { 'x-tollgate-conversation': 'proj-b' })).status, 200);
  const moved = await call(gw.url, 'PUT', '/admin/conversations/proj-b/cap', ADMIN, { cap_usd: 3, tenant: 'alice' });
  t.equal(moved.status, 400);
  t.match(moved.body, { error: { param: 'tenant', message: 'conversation "proj-b" already belongs to tenant "bob"' } });
  t.match((await call(gw.url, 'GET', '/admin/conversations/proj-b/spend', ADMIN)).body, { tenant: 'bob', cap_usd: 2 }, 'nothing changed');
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/proj-b/cap', ADMIN, { cap_usd: 4 })).status, 200, 'a cap alone changes the cap');
  t.match((await call(gw.url, 'GET', '/admin/conversations/proj-b/spend', ADMIN)).body, { tenant: 'bob', cap_usd: 4 });
  // A tenant that does not exist (misspelt) cannot be named: it would own the conversation for good.
  const misspelt = await call(gw.url, 'PUT', '/admin/conversations/proj-d/cap', ADMIN, { cap_usd: 2, tenant: 'alcie' });
  t.equal(misspelt.status, 404);
  t.match(misspelt.body, { error: { code: 'not_found', param: 'tenant', message: 'no tenant "alcie"' } });
  t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'proj-d' })).status, 200, 'alice can still take it');
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/proj-d/cap', ADMIN, { cap_usd: 2, tenant: 'alice' })).status, 200);
  // An id no client can send (spaces at its ends: a header is trimmed) is no conversation to cap.
  const spaced = await call(gw.url, 'PUT', `/admin/conversations/${encodeURIComponent(' proj-c ')}/cap`, ADMIN, { cap_usd: 1 });
  t.equal(spaced.status, 400);
});

t.test("two tenants' first requests on one new id at the same moment: only one tenant gets in (regression: both did)", async (t) => {
  const { gw } = await moneyWorld(t);
  for (let round = 0; round < 5; round++) {
    const id = `race-${round}`;
    const sent = Array.from({ length: 30 }, (_, i) => chat(gw, i % 2 ? BOB : ALICE, ask, { 'x-tollgate-conversation': id }));
    const replies = await Promise.all(sent);
    const rows: LedgerRow[] = [];
    for await (const r of gw.ledger.exportRows(null, null)) if (r.conversation === id) rows.push(r);
    const tenants = new Set(rows.map((r) => r.tenant));
    t.equal(tenants.size, 1, `round ${round}: the conversation's rows are one tenant's (${[...tenants].join(', ')})`);
    const owner = [...tenants][0];
    const ownerKey = owner === 'alice' ? ALICE : BOB;
    replies.forEach((r, i) => {
      const key = i % 2 ? BOB : ALICE;
      if (key === ownerKey) t.equal(r.status, 200);
      else t.match({ status: r.status, error: (r.body as unknown as ErrorBody).error?.message }, { status: 400, error: /belongs to another tenant/ });
    });
    t.equal((await chat(gw, ownerKey, ask, { 'x-tollgate-conversation': id })).status, 200, 'and its owner goes on');
  }
});
