// Several gateway processes on one PostgreSQL share one set of budgets (SPEC §9): 200 concurrent
// requests split between two replicas against a budget that fits exactly K → exactly K admitted;
// a replica killed with SIGKILL mid-load leaves the other serving and nothing lost.

import t from 'tap';
import type { ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';
import pg from 'pg';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGatewayProcess as replica } from '../helpers/process.js';

const PG = process.env.TOLLGATE_TEST_PG_URL;

if (!PG) {
  t.comment('PostgreSQL variant NOT RUN: set TOLLGATE_TEST_PG_URL (.ci/run does)');
} else {
  t.test('two replicas on one PostgreSQL', async (t) => {
    const schema = `replicas_${randomBytes(4).toString('hex')}`;
    const admin = new pg.Client({ connectionString: PG });
    await admin.connect();
    t.teardown(async () => {
      await admin.query(`DROP SCHEMA IF EXISTS ${schema} CASCADE`);
      await admin.end();
    });
    await admin.query(`CREATE SCHEMA ${schema}`);
    const upstream = await startOpenAiDouble({ completionTokens: 20, delayMs: 2 });
    t.teardown(upstream.close);
    const dir = mkdtempSync(join(tmpdir(), 'tollgate-replicas-'));
    t.teardown(() => rmSync(dir, { recursive: true, force: true }));
    const children: ChildProcess[] = [];
    t.teardown(() => children.forEach((c) => c.kill('SIGKILL')));
    const write = (tokenBudget: number) => {
      const path = join(dir, `config-${tokenBudget}.json`);
      writeFileSync(
        path,
        JSON.stringify({
          store: { kind: 'postgres', url: PG, schema },
          upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstream.url}/v1`, models: ['gpt-*'], billing: 'local', prefixCache: false }],
          runs: { tokenBudget, answerReserveTokens: 0 },
          logging: { level: 'silent' },
        }),
      );
      return path;
    };
    const body = { model: 'gpt-4o', max_tokens: 20, messages: [{ role: 'user', content: 'One more round, please.' }] };
    const post = (url: string, conv: string) =>
      fetch(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'x-tollgate-conversation': conv }, body: JSON.stringify(body) }).then(
        (r) => r.status,
        () => 0,
      );

    // 1. what one request needs
    const probe = await replica(write(65536));
    children.push(probe.child);
    const plan = (await (await fetch(`${probe.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request: body }) })).json()) as { charge: { prompt: number; allowance: number } };
    const each = plan.charge.prompt + plan.charge.allowance;
    probe.child.kill('SIGKILL');

    // 2. two replicas, budget for exactly K, 200 requests split between them
    const K = 53;
    const config = write(K * each + each - 1);
    const a = await replica(config);
    const b = await replica(config);
    children.push(a.child, b.child);
    for (const round of [1, 2]) {
      const conv = `burst-${round}`;
      const statuses = await Promise.all(Array.from({ length: 200 }, (_, i) => post(i % 2 === 0 ? a.url : b.url, conv)));
      t.equal(statuses.filter((s) => s === 200).length, K, `round ${round}: exactly ${K} admitted across both replicas`);
      t.equal(statuses.filter((s) => s === 402).length, 200 - K, 'the rest refused');
      const sums = await admin.query(
        `SELECT count(*)::int AS n, sum(reserved_tokens)::int AS reserved, sum(refund_tokens)::int AS refunds FROM ${schema}.ledger_rows WHERE conversation = $1`,
        [conv],
      );
      const run = await admin.query(`SELECT budget_tokens::int AS budget, used_tokens::int AS used FROM ${schema}.runs WHERE conversation = $1`, [conv]);
      t.equal(sums.rows[0].n, K);
      t.equal(run.rows[0].used, sums.rows[0].reserved - sums.rows[0].refunds, 'used = Σcharges − Σrefunds');
      t.ok(run.rows[0].used <= run.rows[0].budget);
    }

    // 3. kill replica A mid-load: B keeps serving; A restarts; nothing is lost
    upstream.options.delayMs = 20;
    const load = Array.from({ length: 40 }, (_, i) => post(i % 2 === 0 ? a.url : b.url, `kill-${i}`));
    while (upstream.requests.length < 120) await new Promise((r) => setTimeout(r, 5));
    a.child.kill('SIGKILL');
    const statuses = await Promise.all(load);
    const fromB = statuses.filter((_, i) => i % 2 === 1);
    t.ok(fromB.every((s) => s === 200), 'the other replica kept serving');
    const again = await replica(config);
    children.push(again.child);
    t.equal(await post(b.url, 'after-kill'), 200);
    t.equal(await post(again.url, 'after-kill-2'), 200, 'the restarted replica serves');
    const rows = await admin.query(`SELECT conversation, state, reserved_tokens::int AS reserved, charge_tokens::int AS charge, refund_tokens::int AS refund FROM ${schema}.ledger_rows WHERE conversation LIKE 'kill-%'`);
    const answered = statuses.map((s, i) => (s === 200 ? `kill-${i}` : null)).filter(Boolean);
    const have = new Set(rows.rows.map((r: { conversation: string }) => r.conversation));
    for (const c of answered) t.ok(have.has(c!), `${c} is in the ledger`);
    for (const r of rows.rows as Array<{ state: string; reserved: number; charge: number | null; refund: number | null }>) {
      // An open reservation is still counted in full against its run: nothing vanished.
      if (r.state !== 'reserved') t.equal(r.reserved, (r.charge ?? 0) + (r.refund ?? 0));
    }
    const runs = await admin.query(`SELECT r.used_tokens::int AS used, coalesce(sum(CASE WHEN l.state = 'reserved' THEN l.reserved_tokens ELSE l.charge_tokens END), 0)::int AS held FROM ${schema}.runs r JOIN ${schema}.ledger_rows l ON l.run = r.id WHERE r.conversation LIKE 'kill-%' GROUP BY r.id, r.used_tokens`);
    for (const r of runs.rows as Array<{ used: number; held: number }>) t.equal(r.used, r.held, 'run invariant holds after the kill');
  });
}
