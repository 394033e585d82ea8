// End to end (ADR 0009): a large prompt sent through the openai SDK is counted in a worker thread,
// the gateway charges exactly what the inline count gives, and closing the app ends the workers.
import t from 'tap';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';
import { CountPoolError } from '../../metering/tokenizers/count-pool.js';
import { TokenCache } from '../../metering/token-cache.js';
import { prose } from './worker-texts.js';

t.test('a 60 KB prompt is counted off the main thread, exactly, and close() ends the pool', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], tokenCache: { workers: 2 } });
  const route = gw.app.gateway.upstreams.route('gpt-4o');
  if (route === null) throw new Error('gpt-4o has no upstream');
  const counter = gw.app.gateway.counters.forModel(route, 'gpt-4o');
  if (!(counter instanceof TiktokenCounter)) throw new Error('gpt-4o is not counted with tiktoken');

  // 1. the request, through the SDK
  const messages = [
    { role: 'system' as const, content: 'Summarise.' },
    { role: 'user' as const, content: prose(60_000, 21) },
  ];
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-anything', maxRetries: 0 });
  const { data, response } = await client.chat.completions
    .create({ model: 'gpt-4o', messages, max_tokens: 10 })
    .withResponse();
  t.equal(data.choices[0].message.content, ' hi hi hi');

  // 2. counted in the pool, labelled as tiktoken, and the reservation is the exact inline count
  t.equal(counter.stats().pooled, 1, 'the prompt went to a worker');
  const exact = new TiktokenCounter('o200k_base', { cache: new TokenCache() }).countChatSync({ model: 'gpt-4o', messages });
  t.equal(response.headers.get('x-tollgate-count-method'), 'tiktoken:o200k_base');
  t.equal(Number(response.headers.get('x-tollgate-reserved-tokens')), exact.tokens + 10, 'prompt + allowance');

  // 3. app.close() (server shutdown) closes the pool: a large count can no longer reach a worker
  await gw.app.close();
  await t.rejects(counter.countText(prose(64_000, 22)), CountPoolError);
});
