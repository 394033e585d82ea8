// An upstream's refusal of a prompt past its context window, told apart from its other 400s, and
// the window it names (server/pipeline/forward.ts): a research round so refused goes as its final
// answer, within that window (server/pipeline/run-request.ts).
import t from 'tap';
import { readFileSync } from 'node:fs';
import { isContextOverflow, normaliseUpstreamError, windowInOverflow } from '../../server/pipeline/forward.js';

const fixtures = new URL('../../../shared/fixtures/llamacpp/', import.meta.url);
const recorded = (name: string) => normaliseUpstreamError(400, readFileSync(new URL(name, fixtures), 'utf8'), 'box');

t.test("llama.cpp's recorded refusals, as the gateway normalises them", async (t) => {
  for (const name of ['error-context-overflow-chat.response.json', 'error-prompt-equals-ctx.response.json', 'p2-error-context-overflow-5000.response.json']) {
    const body = recorded(name);
    t.ok(isContextOverflow(400, body), name);
    t.equal(windowInOverflow(body), (body.error as { n_ctx: number }).n_ctx, `${name}: its n_ctx`);
  }
  for (const name of ['error-bad-role.response.json', 'error-missing-messages.response.json', 'error-wrong-type-max-tokens.response.json']) {
    t.notOk(isContextOverflow(400, recorded(name)), `${name} is another 400`);
  }
});

t.test("OpenAI's and vLLM's words for it, and the window they name", async (t) => {
  const openai = normaliseUpstreamError(
    400,
    JSON.stringify({ error: { message: "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. Please reduce the length of the messages.", type: 'invalid_request_error', param: 'messages', code: 'context_length_exceeded' } }),
    'openai',
  );
  t.ok(isContextOverflow(400, openai));
  t.equal(windowInOverflow(openai), 128000);
  const vllm = normaliseUpstreamError(400, JSON.stringify({ object: 'error', message: "This model's maximum context length is 4096 tokens. However, you requested 4954 tokens (4904 in the messages, 50 in the completion).", type: 'BadRequestError', param: null, code: 400 }), 'vllm');
  t.ok(isContextOverflow(400, vllm));
  t.equal(windowInOverflow(vllm), 4096);
  t.notOk(isContextOverflow(500, openai), 'a 5xx is no refusal of the prompt');
  const other = normaliseUpstreamError(400, JSON.stringify({ error: { message: 'Invalid value for temperature', type: 'invalid_request_error', code: 'invalid_value' } }), 'openai');
  t.notOk(isContextOverflow(400, other));
  t.equal(windowInOverflow(other), null);
});
