// Predicted Outputs: the part of a `prediction` the model does not use is billed as output, beyond
// `max_tokens`, so admission's worst case holds the prediction whole (regression: a 3,200-token
// prediction with max_tokens 10 was reserved at 10 and its cost passed the cap threefold).

import t from 'tap';
import { get_encoding } from '@dqbd/tiktoken';
import { ADMIN, ALICE, admission, call, chat, close, moneyWorld, type ErrorBody } from './money-fixture.js';

t.test("a prediction's tokens are in the money worst case, at the output price", async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 8 } });
  const code = Array.from({ length: 400 }, (_, i) => `export const value${i} = computeSomething(${i}, "label ${i}");`).join('\n');
  const enc = get_encoding('o200k_base');
  const predicted = enc.encode_ordinary(code).length;
  enc.free();
  const ask = { model: 'gpt-4o', messages: [{ role: 'user', content: 'Rename computeSomething to compute.' }], max_tokens: 10 };
  const plain = await admission(gw, ALICE, ask);
  const withPrediction = await admission(gw, ALICE, { ...ask, prediction: { type: 'content', content: code } });
  t.ok(close(withPrediction.cost_usd.worst_case! - plain.cost_usd.worst_case!, (predicted * 400) / 1e6), `${predicted} predicted tokens at $400/M output`);
  const parts = await admission(gw, ALICE, { ...ask, prediction: { type: 'content', content: [{ type: 'text', text: code }] } });
  t.equal(parts.cost_usd.worst_case, withPrediction.cost_usd.worst_case, 'text parts alike');

  // Under a cap the prediction alone would cross, the request is refused before the model is called.
  t.equal((await call(gw.url, 'PUT', '/admin/conversations/edit/cap', ADMIN, { cap_usd: 1 })).status, 200);
  t.ok(withPrediction.cost_usd.worst_case! > 1);
  const refused = await chat(gw, ALICE, { ...ask, prediction: { type: 'content', content: code } }, { 'x-tollgate-conversation': 'edit' });
  t.equal(refused.status, 402);
  t.match((refused.body as unknown as ErrorBody).error, { code: 'conversation_cap_reached', needed_usd: withPrediction.cost_usd.worst_case });
  const asked = await admission(gw, ALICE, { ...ask, prediction: { type: 'content', content: code } }, { 'x-tollgate-conversation': 'edit' });
  t.equal(asked.max_affordable_allowance, 0, 'no max_tokens makes room for the prediction');
  t.equal(metered.requests.length, 0);
  t.equal((await chat(gw, ALICE, ask, { 'x-tollgate-conversation': 'edit' })).status, 200, 'without it, the request goes');
});
