// The stream meter: counts lazily with the tokenizer, yet never lets a choice pass its allowance,
// and its total is the exact count of what was let through.

import t from 'tap';
import { OutputMeter } from '../../server/pipeline/output-meter.js';
import { TiktokenCounter } from '../../metering/tokenizers/tiktoken-counter.js';

const counter = new TiktokenCounter('o200k_base');

t.test('under the allowance: every piece passes and the total is exact', async (t) => {
  const meter = new OutputMeter('tokenizer', counter, 1000);
  const pieces = ['Hello', ',', ' world', '! How', ' are you', ' today?'];
  for (const p of pieces) t.ok(meter.add(0, p));
  t.equal(meter.total(), counter.countOutput(pieces.join('')));
  t.equal(meter.total(), counter.countOutput(pieces.join('')), 'total can be read twice');
});

t.test('at the allowance: the piece that would pass it is refused, and so is everything after', async (t) => {
  const meter = new OutputMeter('tokenizer', counter, 7);
  let passed = 0;
  for (let i = 0; i < 20; i++) if (meter.add(0, ' hi')) passed++;
  t.equal(passed, 7, 'exactly the allowance of one-token pieces');
  t.equal(meter.total(), 7);
  t.notOk(meter.add(0, 'x'), 'closed');
});

t.test('choices are metered apart; llama.cpp counts a token per chunk; the estimate counts bytes', async (t) => {
  const meter = new OutputMeter('tokenizer', counter, 3);
  for (let i = 0; i < 5; i++) {
    meter.add(0, ' hi');
    meter.add(1, ' hi');
  }
  t.equal(meter.total(), 6);
  const llama = new OutputMeter('chunk', counter, 2);
  t.same([llama.add(0, 'ab'), llama.add(0, 'cd'), llama.add(0, 'ef')], [true, true, false]);
  t.equal(llama.method, 'llamacpp');
  // Without a tokenizer: four bytes a token is the estimate recorded, eight a token the cut.
  const bytes = new OutputMeter('bytes', counter, 2);
  t.same([bytes.add(0, 'abcd'), bytes.add(0, 'efgh'), bytes.add(0, 'ijklmnop'), bytes.add(0, 'q')], [true, true, true, false]);
  t.equal(bytes.total(), 2);
  t.equal(bytes.method, 'estimate:bytes');
});

// Regression: a model no tokenizer here knows, writing long words, was cut at 19 of its 30 words
// of a 100-token allowance (the estimate passed the allowance first) and charged it all.
t.test('a stream counted by bytes is not cut while its words are long; the estimate stays within the allowance', async (t) => {
  const meter = new OutputMeter('bytes', counter, 100);
  let passed = 0;
  for (let i = 0; i < 60; i++) if (meter.add(0, ' internationalization')) passed++; // 21 bytes, ~3 tokens
  t.equal(passed, 38, 'cut only past 800 bytes: 38 pieces of 21');
  t.equal(meter.total(), 100);
  const honest = new OutputMeter('bytes', counter, 100);
  for (let i = 0; i < 30; i++) t.ok(honest.add(0, ' internationalization'), `piece ${i}`);
  t.equal(honest.total(), 100, '630 bytes: an estimate of 158, capped at the allowance');
});

// Regression: near the allowance each piece was counted apart from the text before it, so a stream
// whose pieces end inside words (a server that re-chunks) was counted a token too many at every
// such end: 45 tokens in 3-character pieces came to 50, and the answer was cut four words early.
t.test('pieces that end inside words are counted as the text they make, up to the allowance', async (t) => {
  const text = ' word'.repeat(45);
  t.equal(counter.countOutput(text), 45);
  for (const size of [1, 2, 3, 4, 7]) {
    const meter = new OutputMeter('tokenizer', counter, 50);
    let passed = '';
    for (let i = 0; i < text.length; i += size) if (meter.add(0, text.slice(i, i + size))) passed += text.slice(i, i + size);
    t.equal(passed, text, `pieces of ${size}: none cut`);
    t.equal(meter.total(), 45, `pieces of ${size}: the exact count`);
  }
  // And the cut still comes at the allowance exactly: 45 tokens against 40.
  const tight = new OutputMeter('tokenizer', counter, 40);
  let passed = '';
  for (let i = 0; i < text.length; i += 3) if (tight.add(0, text.slice(i, i + 3))) passed += text.slice(i, i + 3);
  t.ok(counter.countOutput(passed) <= 40 && counter.countOutput(passed) >= 39, `${counter.countOutput(passed)} tokens let through`);
  t.equal(tight.total(), 40, 'the whole allowance is charged');
});

t.test('a piece that crosses the allowance leaves the start that fits in cutText (whole characters)', async (t) => {
  const meter = new OutputMeter('tokenizer', counter, 4);
  t.ok(meter.add(0, ' one two'));
  t.notOk(meter.add(0, ' three four five'), 'five tokens against four');
  t.equal(meter.cutText, ' three four', 'the two tokens that still fit');
  t.equal(meter.total(), 4, 'the choice counts its whole allowance');
  // By bytes (no tokenizer): 4 tokens are cut past 32 bytes; a multi-byte character is never split.
  const bytes = new OutputMeter('bytes', counter, 4);
  t.ok(bytes.add(0, 'abcdefghijklmnopqrstuvwxyz'));
  t.notOk(bytes.add(0, 'éééé'));
  t.equal(bytes.cutText, 'ééé', '6 bytes were left: three two-byte characters');
  // A long piece is not re-encoded on the event loop: dropped whole, as before.
  const long = new OutputMeter('tokenizer', counter, 2);
  t.notOk(long.add(0, 'x'.repeat(5000)));
  t.equal(long.cutText, '');
});

t.test("a completion's echoed prompt is passed on uncounted; what follows it is metered (regression: cut before the answer)", async (t) => {
  const prompts = ['The quick brown fox jumps over the lazy dog. '.repeat(8), 'Once upon a time'];
  const meter = new OutputMeter('tokenizer', counter, 5, (index) => prompts[Math.floor(index / 2)] ?? '');
  // The echo arrives whole, or in pieces, then the model's own text.
  t.ok(meter.add(0, prompts[0]!), 'a 80-token echo passes an allowance of 5');
  t.ok(meter.add(0, ' And'));
  t.ok(meter.add(1, prompts[0]!.slice(0, 100)));
  t.ok(meter.add(1, prompts[0]!.slice(100) + ' And then'), 'the echo and the first words in one piece');
  t.ok(meter.add(2, 'Once upon'));
  t.ok(meter.add(2, ' a time there was'), 'the rest of the echo, then own text');
  t.equal(meter.total(), counter.countOutput(' And') + counter.countOutput(' And then') + counter.countOutput(' there was'));
  // Past the allowance, the cut keeps the echo ahead of what still fits.
  t.notOk(meter.add(3, 'Once upon a time, in a land far away, there lived a king'));
  t.equal(meter.cutText, 'Once upon a time' + counter.leadingText(', in a land far away, there lived a king', 5));
  t.equal(meter.cutText, 'Once upon a time, in a land far');
  // Text that parts from the prompt ends the echo: a model that does not echo is metered whole.
  const plain = new OutputMeter('tokenizer', counter, 3, () => 'Hello there');
  t.ok(plain.add(0, 'Hi'));
  t.notOk(plain.add(0, ' Hello there friend, how are you'), 'no echo once the text parted from the prompt');
});
