// Images in a prompt are reserved at the most their model can bill for them (SPEC §7: admission
// reserves the worst case; ADR 0022). The gateway never fetches an image, so it cannot know its size.

import t from 'tap';
import { ADMIN, ALICE, call, chat, close, moneyWorld, type ErrorBody } from './money-fixture.js';

const page = (detail: string) => ({ type: 'image_url', image_url: { url: 'https://example.com/scan.png', detail } });
type Json = Record<string, unknown>;

async function plan(gw: Awaited<ReturnType<typeof moneyWorld>>['gw'], body: Json, headers: Record<string, string>): Promise<Json> {
  const r = await call(gw.url, 'POST', '/v1/admission', { authorization: `Bearer ${ALICE}`, ...headers }, { endpoint: '/v1/chat/completions', request: body });
  if (r.status !== 200) throw new Error(`/v1/admission answered ${r.status}`);
  return r.body;
}

t.test('three high-detail images cannot cross a conversation cap (regression: reserved at 85 tokens each)', async (t) => {
  // The audit: gpt-4o ($100 / $400 per Mtok here), three `detail: high` scans, a $0.05 cap.
  // Admission said the worst case was $0.028 and admitted it; the provider billed ~1,105 prompt
  // tokens per image and the turn cost $0.33, 6.7× the cap.
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 1, promptTokens: () => 3 * 1105 + 20 } });
  const conv = { 'x-tollgate-conversation': 'scans' };
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/scans/cap', ADMIN, { cap_usd: 0.05 })).status, 200);
  const body = { model: 'gpt-4o', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare the three scans.' }, page('high'), page('high'), page('high')] }] };

  // 1. The plan counts each image at 85 + 8 × 170 = 1,445 and says the count is an upper bound.
  const p = await plan(gw, body, conv);
  const text = await plan(gw, { ...body, messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare the three scans.' }] }] }, conv);
  t.equal(p.sum_tokens, (text.sum_tokens as number) + 3 * 1445);
  t.equal(p.count_method, 'tiktoken:o200k_base:upper-bound');
  t.equal(p.count_is_upper_bound, true);
  const worst = (p.cost_usd as { worst_case: number }).worst_case;
  t.ok(close(worst, ((p.sum_tokens as number) * 100 + 1 * 400) / 1e6), `worst case ${worst}: whole prompt + allowance at list price`);
  t.ok(worst >= ((3 * 1105 + 20) * 100 + 400) / 1e6, 'at least what the provider really bills');

  // 2. The cap refuses it before any model is called.
  t.match(p.verdict, { admit: false, status: 402 });
  const r = await chat(gw, ALICE, body, conv);
  t.equal(r.status, 402);
  t.equal((r.body as unknown as ErrorBody).error.code, 'conversation_cap_reached');
  t.equal(metered.requests.length, 0, 'the provider was never asked');

  // 3. With room for the worst case it goes, and settles at what the provider billed.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/scans/cap', ADMIN, { cap_usd: 1 })).status, 200);
  const ok = await chat(gw, ALICE, body, conv);
  t.equal(ok.status, 200);
  t.equal(ok.headers.get('x-tollgate-count-method'), 'tiktoken:o200k_base:upper-bound');
  t.ok(close(Number(ok.headers.get('x-tollgate-cost-usd')), ((3 * 1105 + 20) * 100 + 400) / 1e6));
});

t.test('a gpt-4o-mini image is bounded by its own, larger figures, and is not refused for size', async (t) => {
  // gpt-4o-mini bills an image as 2,833 + 5,667 per tile: one high-detail image can be 48,169
  // prompt tokens, more than a row may hold (36,864). Its least (one tile) fits: no 413.
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 1, promptTokens: () => 8500 + 10 } });
  const body = { model: 'gpt-4o-mini', max_tokens: 1, messages: [{ role: 'user', content: [{ type: 'text', text: 'What is this?' }, page('high')] }] };
  const p = await plan(gw, body, { 'x-tollgate-conversation': 'mini' });
  t.ok((p.sum_tokens as number) > 48_169, `counted ${p.sum_tokens}`);
  t.same(p.verdict, { admit: true, status: 200, error: null });
  const r = await chat(gw, ALICE, body, { 'x-tollgate-conversation': 'mini' });
  t.equal(r.status, 200);
  t.equal(metered.requests.length, 1);
});
