// Content the gateway cannot count — a file (PDF), input audio, an earlier audio answer sent back,
// and for a llama.cpp server anything but text — is left out of the count, and the count says so:
// `…:partial` (SPEC §2: never a guess presented as a measurement). An outside audit found a 40 KB
// PDF counted as its 12 tokens of text, labelled exact.

import t, { type Test } from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';
import { startGateway, openaiUpstream, llamaUpstream, type TestGateway } from '../helpers/gateway.js';
import type { LedgerRow } from '../../metering/ledger.js';

type Json = Record<string, unknown>;

const pdf = { type: 'file', file: { filename: 'report.pdf', file_data: `data:application/pdf;base64,${Buffer.from('%PDF-1.4 '.repeat(500)).toString('base64')}` } };
const audio = { type: 'input_audio', input_audio: { data: Buffer.alloc(4000).toString('base64'), format: 'wav' } };
const image = { type: 'image_url', image_url: { url: 'https://example.com/page.png', detail: 'low' } };
const text = { type: 'text', text: 'Summarise this.' };

async function gateway(t: Test, upstream: Json): Promise<TestGateway> {
  return startGateway(t, { upstreams: [upstream] });
}

async function send(gw: TestGateway, model: string, messages: Json[]) {
  const request = { model, messages, max_tokens: 5 };
  const plan = (await (await fetch(`${gw.url}/v1/admission`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify({ endpoint: '/v1/chat/completions', request }) })).json()) as Json;
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(request) });
  await res.text();
  const rows: LedgerRow[] = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  return { status: res.status, header: res.headers.get('x-tollgate-count-method'), plan, row: rows.at(-1)! };
}

t.test('tiktoken: a file, input audio or an audio answer sent back makes the count partial; text and images do not', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await gateway(t, openaiUpstream(upstream.url));
  const cases: Array<[string, Json[], string]> = [
    ['text', [{ role: 'user', content: [text] }], 'tiktoken:o200k_base'],
    ['an image at low detail', [{ role: 'user', content: [text, image] }], 'tiktoken:o200k_base'],
    ['a PDF', [{ role: 'user', content: [pdf, text] }], 'tiktoken:o200k_base:partial'],
    ['input audio', [{ role: 'user', content: [text, audio] }], 'tiktoken:o200k_base:partial'],
    [
      'an earlier audio answer',
      [
        { role: 'user', content: 'Say hello.' },
        { role: 'assistant', content: null, audio: { id: 'audio_abc123' } },
        { role: 'user', content: 'Again.' },
      ],
      'tiktoken:o200k_base:partial',
    ],
  ];
  for (const [what, messages, label] of cases) {
    const r = await send(gw, 'gpt-4o', messages);
    t.equal(r.status, 200, what);
    t.equal(r.header, label, `${what}: the header`);
    t.equal(r.plan.count_method, label, `${what}: admission`);
    t.equal(r.row.count_method, label, `${what}: the ledger`);
  }
  // The file's bytes are not counted as text: the count is the text's.
  const plain = await send(gw, 'gpt-4o', [{ role: 'user', content: [text] }]);
  const withPdf = await send(gw, 'gpt-4o', [{ role: 'user', content: [pdf, text] }]);
  t.equal(withPdf.plan.sum_tokens, plain.plan.sum_tokens);
});

t.test('llama.cpp: the template counts text alone, so an image makes the count partial', async (t) => {
  const llama = await startLlamaCppDouble({ completionTokens: 2 });
  t.teardown(llama.close);
  const gw = await gateway(t, llamaUpstream(llama.url));
  const plain = await send(gw, 'tiny', [{ role: 'user', content: [text] }]);
  t.equal(plain.header, 'llamacpp');
  const seen = await send(gw, 'tiny', [{ role: 'user', content: [text, image] }]);
  t.equal(seen.status, 200);
  t.equal(seen.header, 'llamacpp:partial');
  t.equal(seen.row.count_method, 'llamacpp:partial');
});

t.test('a size refusal on a partial count stands (the whole prompt is more), and says the count is partial', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 2 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url)], limits: { maxRowTokens: 50 } });
  const res = await fetch(`${gw.url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'gpt-4o', max_tokens: 5, messages: [{ role: 'user', content: [pdf, { type: 'text', text: 'word '.repeat(100) }] }] }),
  });
  t.equal(res.status, 413);
  const body = (await res.json()) as { error: Json };
  t.equal(body.error.code, 'row_too_large');
  t.equal(body.error.count_method, 'tiktoken:o200k_base:partial');
  t.equal(upstream.requests.length, 0);
});
