import t from 'tap';
import { get_encoding } from '@dqbd/tiktoken';

t.test('tiktoken loads under tsx', async (t) => {
  const enc = get_encoding('o200k_base');
  t.equal(enc.encode_ordinary('hello world').length, 2);
  enc.free();
});
