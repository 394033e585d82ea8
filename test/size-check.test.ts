import t from 'tap';
import { checkSizes, DEFAULT_SIZE_LIMITS } from '../metering/size-check.js';
import { planRows, type RowPlanInput } from '../metering/row-plan.js';

const input: RowPlanInput = {
  kind: 'completions',
  rowTokens: [10],
  countMethod: 'tiktoken:o200k_base',
  upperBound: false,
  maxTokens: null,
  n: 1,
  defaultMaxTokens: 4096,
  contextWindow: null,
};
const plan = (over: Partial<RowPlanInput>) => planRows({ ...input, ...over });

t.test('defaults are the SPEC figures', async (t) => {
  t.same(DEFAULT_SIZE_LIMITS, { maxRows: 1024, maxRowTokens: 36864, maxRequestTokens: 1048576 });
  t.equal(checkSizes(plan({ rowTokens: [10, 20] })), null);
});

t.test('too_many_rows', async (t) => {
  const r = checkSizes(plan({ rowTokens: new Array<number>(1025).fill(1) }));
  t.same(r, {
    code: 'too_many_rows',
    message: 'too many rows: 1025, the limit is 1024',
    details: { rows: 1025, limit: 1024 },
  });
  t.equal(checkSizes(plan({ rowTokens: new Array<number>(1024).fill(1) })), null, '1024 rows are fine');
});

t.test('row_too_large names the first row over the limit', async (t) => {
  const r = checkSizes(plan({ rowTokens: [5, 38029, 40000] }));
  t.same(r, {
    code: 'row_too_large',
    message: 'too many tokens: one row has 38029 tokens, the limit is 36864 per row',
    details: { row_index: 1, row_tokens: 38029, limit: 36864, count_method: 'tiktoken:o200k_base' },
  });
  t.equal(checkSizes(plan({ rowTokens: [36864] })), null, 'exactly the limit is fine');
});

t.test('request_tokens_exceeded', async (t) => {
  // 29 rows of 36,864 + one of 16,688 = 1,085,744 tokens.
  const rows = [...new Array<number>(29).fill(36864), 16688];
  const r = checkSizes(plan({ rowTokens: rows, countMethod: 'tiktoken:cl100k_base' }));
  t.same(r, {
    code: 'request_tokens_exceeded',
    message: 'too many tokens: the rows add up to 1085744 tokens, the limit is 1048576',
    details: { rows: 30, sum_tokens: 1085744, limit: 1048576, count_method: 'tiktoken:cl100k_base' },
  });
});

t.test('a figure from the byte estimate is said to be one, in every size refusal (SPEC §2: never a guess presented as a measurement)', async (t) => {
  const why = ' (an estimate, UTF-8 bytes ÷ 4: no tokenizer here knows this model)';
  const rows = [...new Array<number>(29).fill(36864), 16688];
  t.same(checkSizes(plan({ rowTokens: rows, countMethod: 'estimate:bytes' })), {
    code: 'request_tokens_exceeded',
    message: `too many tokens: the rows add up to about 1085744 tokens, the limit is 1048576${why}`,
    details: { rows: 30, sum_tokens: 1085744, limit: 1048576, count_method: 'estimate:bytes' },
  });
  t.same(checkSizes(plan({ rowTokens: [5, 38029], countMethod: 'estimate:bytes' })), {
    code: 'row_too_large',
    message: `too many tokens: one row has about 38029 tokens, the limit is 36864 per row${why}`,
    details: { row_index: 1, row_tokens: 38029, limit: 36864, count_method: 'estimate:bytes' },
  });
  t.same(checkSizes(plan({ kind: 'chat', rowTokens: [49], countMethod: 'estimate:bytes', contextWindow: 16 }), {}, 16), {
    code: 'context_window_exceeded',
    message: `request too large: the prompt needs about 49 tokens, more than the model's context window of 16 tokens${why}`,
    details: { row_index: 0, prompt_tokens: 49, allowance: 0, context_window: 16, count_method: 'estimate:bytes' },
  });
});

t.test('context_window_exceeded: a prompt that leaves nothing, with no explicit allowance', async (t) => {
  const r = checkSizes(plan({ kind: 'chat', rowTokens: [49], contextWindow: 16 }), {}, 16);
  t.same(r, {
    code: 'context_window_exceeded',
    message: "request too large: the prompt needs 49 tokens, more than the model's context window of 16 tokens",
    details: { row_index: 0, prompt_tokens: 49, allowance: 0, context_window: 16, count_method: 'tiktoken:o200k_base' },
  });
  // prompt ≥ window is refused (llama.cpp answers 400 for exactly that); one token less is admitted
  // with the default allowance clamped to 1.
  t.equal(checkSizes(plan({ kind: 'chat', rowTokens: [16], contextWindow: 16 }), {}, 16)?.code, 'context_window_exceeded');
  const fits = plan({ kind: 'chat', rowTokens: [15], contextWindow: 16 });
  t.equal(fits.allowance, 1);
  t.equal(checkSizes(fits, {}, 16), null);
});

t.test('context_window_exceeded: an explicit allowance counts in full', async (t) => {
  const r = checkSizes(plan({ kind: 'chat', rowTokens: [40], maxTokens: 30, contextWindow: 64 }), {}, 64);
  t.same(r, {
    code: 'context_window_exceeded',
    message:
      "request too large: the prompt needs 40 tokens and max_tokens asks for 30 more, more than the model's context window of 64 tokens",
    details: { row_index: 0, prompt_tokens: 40, allowance: 30, context_window: 64, count_method: 'tiktoken:o200k_base' },
  });
  t.equal(checkSizes(plan({ kind: 'chat', rowTokens: [40], maxTokens: 24 }), {}, 64), null, '40 + 24 = 64 fits');
  // Per row, per choice: n does not multiply what one choice needs from the window.
  t.equal(checkSizes(plan({ rowTokens: [40, 10], maxTokens: 24, n: 4 }), {}, 64), null);
  const second = checkSizes(plan({ rowTokens: [10, 41], maxTokens: 24 }), {}, 64);
  t.equal(second?.details.row_index, 1);
});

// Regression (twentieth session): a prompt over the window on its own was said in the second shape
// whenever max_tokens was sent, so SPEC §11's first message never came from a request that named one.
t.test('context_window_exceeded: a prompt over the window is said in the first shape, whatever max_tokens asks', async (t) => {
  const r = checkSizes(plan({ kind: 'chat', rowTokens: [49], maxTokens: 30, contextWindow: 16 }), {}, 16);
  t.equal(r?.message, "request too large: the prompt needs 49 tokens, more than the model's context window of 16 tokens");
  t.same(r?.details, { row_index: 0, prompt_tokens: 49, allowance: 30, context_window: 16, count_method: 'tiktoken:o200k_base' }, 'the allowance asked is still in the details');
  // At the window's size exactly, what max_tokens asks is what crosses it: said so.
  t.equal(
    checkSizes(plan({ kind: 'chat', rowTokens: [16], maxTokens: 30, contextWindow: 16 }), {}, 16)?.message,
    "request too large: the prompt needs 16 tokens and max_tokens asks for 30 more, more than the model's context window of 16 tokens",
  );
});

t.test('the checks run in SPEC order: the first failure answers', async (t) => {
  const everything = plan({ rowTokens: [...new Array<number>(1024).fill(2000), 40000], maxTokens: 10 });
  t.equal(checkSizes(everything, {}, 100)?.code, 'too_many_rows');
  const big = plan({ rowTokens: new Array<number>(40).fill(36864).concat([40000]), maxTokens: 10 });
  t.equal(checkSizes(big, {}, 100)?.code, 'row_too_large');
  const sum = plan({ rowTokens: new Array<number>(40).fill(36864), maxTokens: 10 });
  t.equal(checkSizes(sum, {}, 100)?.code, 'request_tokens_exceeded');
  t.equal(checkSizes(plan({ rowTokens: [200], maxTokens: 10 }), {}, 100)?.code, 'context_window_exceeded');
  t.equal(checkSizes(plan({ rowTokens: [200], maxTokens: 10 }), {}, null), null, 'no window known: no window check');
});

t.test('configured limits replace the defaults; extra config fields are ignored', async (t) => {
  const limits = { maxRows: 2, maxRowTokens: 100, maxRequestTokens: 150, maxBodyBytes: 1 };
  t.equal(checkSizes(plan({ rowTokens: [1, 1, 1] }), limits)?.message, 'too many rows: 3, the limit is 2');
  t.equal(checkSizes(plan({ rowTokens: [101] }), limits)?.message, 'too many tokens: one row has 101 tokens, the limit is 100 per row');
  t.equal(checkSizes(plan({ rowTokens: [100, 51] }), limits)?.message, 'too many tokens: the rows add up to 151 tokens, the limit is 150');
});

t.test('a figure that is an upper bound says so; an exact row keeps its exact label beside one', async (t) => {
  const why = '(an upper bound: text without spaces too long to count exactly)';
  const bound = { countMethod: 'tiktoken:o200k_base:upper-bound' as const, upperBound: true };
  // 1. The row over the limit is the bound: "up to", and the bound's label.
  const r = checkSizes(plan({ ...bound, rowTokens: [5, 53128], rowUpperBound: [false, true] }));
  t.same(r, {
    code: 'row_too_large',
    message: `too many tokens: one row has up to 53128 tokens, the limit is 36864 per row ${why}`,
    details: { row_index: 1, row_tokens: 53128, limit: 36864, count_method: 'tiktoken:o200k_base:upper-bound' },
  });
  // 2. The row over the limit is exact, another row is a bound: SPEC's message, the exact label.
  const exact = checkSizes(plan({ ...bound, rowTokens: [38029, 10], rowUpperBound: [false, true] }));
  t.equal(exact?.message, 'too many tokens: one row has 38029 tokens, the limit is 36864 per row');
  t.equal(exact?.details.count_method, 'tiktoken:o200k_base');
  // 3. A sum and a window resting on a bound.
  const limits = { maxRowTokens: 100, maxRequestTokens: 150 };
  t.equal(checkSizes(plan({ ...bound, rowTokens: [100, 51] }), limits)?.message, `too many tokens: the rows add up to as many as 151 tokens, the limit is 150 ${why}`);
  t.equal(
    checkSizes(plan({ ...bound, kind: 'chat', rowTokens: [40], maxTokens: 30 }), {}, 64)?.message,
    `request too large: the prompt needs up to 40 tokens and max_tokens asks for 30 more, more than the model's context window of 64 tokens ${why}`,
  );
});
