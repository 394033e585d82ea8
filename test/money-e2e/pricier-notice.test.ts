// Switching a conversation to a pricier model says so (SPEC §7): a reply like the last one on the
// new model, at list price and uncached, estimated; the notice only when that is ≥ $0.25 and ≥ 2×
// what the last reply cost.

import t from 'tap';
import { ALICE, admission, chat, costHeader, listUsd, moneyWorld } from './money-fixture.js';
import { formatUsdFigure } from '../../pricing/usd-format.js';

const long = 'word '.repeat(3000);

t.test('a switch to a model whose reply would cost ≥ $0.25 and ≥ 2× the last one is announced', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 8 } });
  const conv = { 'x-tollgate-conversation': 'switch' };
  const first = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: long }], max_tokens: 50 };
  const prompt = (await admission(gw, ALICE, first, conv)).sum_tokens;
  metered.options.promptTokens = () => prompt;

  // 1. A long turn on the cheap model: about $0.003.
  const r1 = await chat(gw, ALICE, first, conv);
  t.equal(r1.status, 200);
  t.equal(r1.headers.get('x-tollgate-notice'), null, 'no notice on a first turn');
  const last = costHeader(r1)!;
  t.equal(last, listUsd('gpt-4o-mini', prompt, 0, 8));

  // 2. The next turn on gpt-4o: a reply like the last would cost ~$0.30, a hundred times more.
  const second = {
    model: 'gpt-4o',
    messages: [...first.messages, { role: 'assistant', content: ' hi'.repeat(8) }, { role: 'user', content: 'and now in depth' }],
    max_tokens: 50,
  };
  // /v1/admission says it before the dearer model is called (seed 004: before an expensive step).
  const before = metered.requests.length;
  const planned = await admission(gw, ALICE, second, conv);
  t.equal(metered.requests.length, before, 'asking calls no model');
  const r2 = await chat(gw, ALICE, second, conv);
  t.equal(r2.status, 200);
  t.same(planned.notices, [r2.headers.get('x-tollgate-notice')], 'the notice the response then carries');
  const estimate = listUsd('gpt-4o', prompt, 0, 8);
  t.ok(estimate >= 0.25);
  t.equal(r2.headers.get('x-tollgate-notice'), `pricier; estimate_usd=${formatUsdFigure(estimate)}; last_usd=${formatUsdFigure(last)}`);
  t.match(r2.headers.get('x-tollgate-notice'), /^pricier; estimate_usd=0\.3\d; last_usd=0\.00\d+$/);

  // 3. Staying on it, or going back to the cheap one, says nothing.
  const third = { ...second, messages: [...second.messages, { role: 'assistant', content: 'ok' }, { role: 'user', content: 'more' }] };
  t.same((await admission(gw, ALICE, third, conv)).notices, []);
  t.equal((await chat(gw, ALICE, third, conv)).headers.get('x-tollgate-notice'), null);
  t.equal((await chat(gw, ALICE, { ...third, model: 'gpt-4o-mini' }, conv)).headers.get('x-tollgate-notice'), null);
});

t.test('no notice for a short conversation, a free model, or a last reply already as dear', async (t) => {
  const { gw, metered } = await moneyWorld(t, { metered: { completionTokens: 8 } });
  const turn = (model: string, content: string) => ({ model, messages: [{ role: 'user', content }], max_tokens: 50 });

  // 1. Short: gpt-4o is 100× dearer, but a reply like the last costs a few cents at most.
  t.equal((await chat(gw, ALICE, turn('gpt-4o-mini', 'hi'), { 'x-tollgate-conversation': 'short' })).status, 200);
  const short = await chat(gw, ALICE, turn('gpt-4o', 'hi'), { 'x-tollgate-conversation': 'short' });
  t.equal(short.status, 200);
  t.equal(short.headers.get('x-tollgate-notice'), null);

  // 2. To this machine's model: it costs nothing.
  const prompt = (await admission(gw, ALICE, turn('gpt-4o-mini', long), {})).sum_tokens;
  metered.options.promptTokens = () => prompt;
  t.equal((await chat(gw, ALICE, turn('gpt-4o-mini', long), { 'x-tollgate-conversation': 'to-local' })).status, 200);
  const local = await chat(gw, ALICE, turn('llama-local', long), { 'x-tollgate-conversation': 'to-local' });
  t.equal(local.status, 200);
  t.equal(local.headers.get('x-tollgate-notice'), null);

  // 3. The last reply cost $0.20 (the provider's figure): ~$0.30 is not twice that.
  metered.options.providerCost = 0.2;
  t.equal((await chat(gw, ALICE, turn('gpt-4o-mini', long), { 'x-tollgate-conversation': 'dear' })).status, 200);
  delete metered.options.providerCost;
  const dear = await chat(gw, ALICE, turn('gpt-4o', long), { 'x-tollgate-conversation': 'dear' });
  t.equal(dear.status, 200);
  t.ok(listUsd('gpt-4o', prompt, 0, 8) >= 0.25, 'the estimate alone would pass the $0.25 floor');
  t.equal(dear.headers.get('x-tollgate-notice'), null);
});
