// Ledger ids (metering/ids.ts): version 7 UUIDs whose text sorts in the order they were made, so
// the ledger's keys grow with time (ADR 0015).

import t from 'tap';
import { uuidV7 } from '../metering/ids.js';
import { startOpenAiDouble } from './doubles/openai.js';
import { startGateway, openaiUpstream } from './helpers/gateway.js';
import type { LedgerRow } from '../metering/ledger.js';

const UUID_V7 = /^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;
const timeOf = (id: string) => parseInt(id.slice(0, 8) + id.slice(9, 13), 16);

t.test('an RFC 9562 version 7 UUID carrying the time in ms', async (t) => {
  const now = Date.UTC(2026, 10, 30, 1, 2, 3, 456);
  const id = uuidV7(now + 10_000_000); // later than anything made before in this process
  t.match(id, UUID_V7);
  t.equal(timeOf(id), now + 10_000_000);
});

t.test('ids made one after another sort in that order, within a millisecond too', async (t) => {
  const base = Date.now() + 20_000_000;
  const ids: string[] = [];
  // 3 ms with 5,000 ids each: more than the 12-bit counter holds, so it must roll over in order.
  for (const ms of [base, base + 1, base + 2]) for (let i = 0; i < 5000; i++) ids.push(uuidV7(ms));
  t.ok(ids.every((id) => UUID_V7.test(id)), 'every one a version 7 UUID');
  const sorted = [...ids].sort();
  t.same(sorted, ids, 'text order is creation order');
  t.equal(new Set(ids).size, ids.length, 'no two alike');
});

t.test('a clock that steps back never makes an id sort before an earlier one', async (t) => {
  const base = Date.now() + 30_000_000;
  const a = uuidV7(base);
  const b = uuidV7(base - 5000);
  t.ok(b > a, `${b} after ${a}`);
  t.ok(timeOf(b) >= base);
});

t.test('the gateway names new conversations and requests with them; a run id starts with its conversation', async (t) => {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)] });
  const conversations: string[] = [];
  for (const content of ['first question', 'second question']) {
    const res = await fetch(`${gw.url}/v1/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model: 'gpt-4o-mini', max_tokens: 8, messages: [{ role: 'user', content }] }),
    });
    t.equal(res.status, 200);
    conversations.push(res.headers.get('x-tollgate-conversation') ?? '');
  }
  for (const c of conversations) t.match(c, /^conv-[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-/);
  t.ok(conversations[1]! > conversations[0]!, 'the later conversation sorts later');
  const rows: LedgerRow[] = [];
  for await (const r of gw.ledger.exportRows(null, null)) rows.push(r);
  t.equal(rows.length, 2);
  rows.forEach((r, i) => {
    t.match(r.id, /^req-[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-/);
    t.equal(r.conversation, conversations[i]);
    t.ok(r.run.startsWith(`${conversations[i]}/`), `run ${r.run}`);
  });
  t.ok(rows[1]!.id > rows[0]!.id);
});
