// The counters' invariants across streams that end part way (an upstream that errs, drops or
// stalls, a client that leaves, llama.cpp streams): one count and one line per request, and
// reserved − refunded = generated.
import t from 'tap';
import { Writable } from 'node:stream';
import { startGateway, openaiUpstream, llamaUpstream } from '../helpers/gateway.js';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startLlamaCppDouble } from '../doubles/llamacpp.js';

t.test('mid-stream paths', async (t) => {
  let out = '';
  const stream = new Writable({ write(c: Buffer, _e, d) { out += c.toString(); d(); } });
  const lines = () => out.split('\n').filter(Boolean).map((l) => JSON.parse(l) as Record<string, any>);
  const double = await startOpenAiDouble({ completionTokens: 8 });
  t.teardown(double.close);
  const llama = await startLlamaCppDouble({ completionTokens: 4, slots: 4 });
  t.teardown(llama.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(double.url, { timeoutMs: 400 }), llamaUpstream(llama.url, { models: ['llama-*'] })] }, { logStream: stream, env: { DOUBLE_KEY: 'sk-up-123456789', TOLLGATE_ADMIN_TOKEN: 'a' } });
  const post = async (body: Record<string, unknown>, path = '/v1/chat/completions') => {
    const r = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    const text = await r.text();
    return { status: r.status, text };
  };
  const chat = (x: Record<string, unknown> = {}) => ({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 20, ...x });
  const steps: Array<[string, () => void, Record<string, unknown>, string?]> = [
    ['error after 3', () => (double.options.errorAfterChunks = { chunks: 3, as: 'data', error: { message: 'overloaded', type: 'server_error' } }), chat({ stream: true })],
    ['error event after 0', () => (double.options.errorAfterChunks = { chunks: 0, as: 'event', error: { message: 'overloaded', type: 'server_error' } }), chat({ stream: true })],
    ['drop after 2', () => { double.options.errorAfterChunks = undefined; double.options.dropAfterChunks = 2; }, chat({ stream: true })],
    ['drop after 0', () => (double.options.dropAfterChunks = 0), chat({ stream: true })],
    ['stall after 2 (timeout)', () => { double.options.dropAfterChunks = undefined; double.options.stallAfterChunks = 2; }, chat({ stream: true })],
    ['hang non-stream (timeout)', () => { double.options.stallAfterChunks = undefined; double.options.hang = true; }, chat()],
    ['n=2 stream cut', () => { double.options.hang = false; double.options.ignoreMaxTokens = true; double.options.completionTokens = 30; }, chat({ stream: true, n: 2, max_tokens: 4 })],
    ['completions stream', () => {}, { model: 'gpt-4o-mini', prompt: 'hello', max_tokens: 6, stream: true }, '/v1/completions'],
    ['embeddings', () => {}, { model: 'gpt-4o-mini', input: ['a', 'b'] }, '/v1/embeddings'],
    ['llama prompt array', () => {}, { model: 'llama-x', prompt: ['hello', 'there you'], max_tokens: 3 }, '/v1/completions'],
    ['llama n=2 stream', () => {}, { model: 'llama-x', messages: [{ role: 'user', content: 'hi' }], max_tokens: 3, n: 2, stream: true }],
  ];
  for (const [name, set, body, path] of steps) {
    set();
    const seen = lines().length;
    const r = await post(body, path);
    await new Promise((res) => setTimeout(res, 200));
    const got = lines().slice(seen);
    t.comment(`=== ${name}: ${r.status} ${r.text.slice(-300).replace(/\n/g, '⏎')}`);
    for (const l of got) t.comment(`   ${JSON.stringify(l)}`);
  }
  const settled = lines().filter((l) => l.msg === 'request settled');
  for (const l of settled) t.equal(l.charge_tokens + l.refund_tokens, l.reserved_tokens, `charge+refund=reserved ${l.id}`);
  const m = await gw.registry.getMetricsAsJSON();
  const val = (n: string, k?: string) => (m.find((x) => x.name === n)!.values as any[]).filter((v) => k === undefined || v.labels.kind === k).reduce((s, v) => s + v.value, 0);
  t.equal(val('tollgate_output_tokens_total', 'generated'), settled.reduce((s, l) => s + (l.generated_tokens ?? 0), 0), 'generated metric = sum of lines');
  t.equal(val('tollgate_output_tokens_total', 'reserved') - val('tollgate_output_tokens_total', 'refunded'), val('tollgate_output_tokens_total', 'generated'), 'reserved - refunded = generated');
  t.ok(Math.abs(val('tollgate_cost_usd_total') - settled.reduce((s, l) => s + (l.cost_usd ?? 0), 0)) < 1e-12, 'cost metric = sum of lines');
  t.comment((await gw.registry.metrics()).split('\n').filter((l) => l.startsWith('tollgate_') && !l.includes('bucket')).join('\n'));
});
