// One digest per message (metering/message-digest.ts): canonical, so a re-serialised message is
// recognised, and distinct for anything the model would read differently.

import t from 'tap';
import { messageDigest } from '../metering/message-digest.js';

t.test('canonical: key order and null-vs-absent do not matter', async (t) => {
  const d = messageDigest({ role: 'user', content: 'hello' });
  t.equal(messageDigest({ content: 'hello', role: 'user' }), d);
  t.equal(messageDigest({ role: 'user', content: 'hello', name: null }), d);
  t.equal(messageDigest({ role: 'user', content: 'hello', name: undefined }), d);
});

t.test('distinct for different content, roles, names and shapes', async (t) => {
  const all = [
    { role: 'user', content: 'hello' },
    { role: 'user', content: 'hello ' },
    { role: 'system', content: 'hello' },
    { role: 'user', content: 'hello', name: 'a' },
    { role: 'user', content: [{ type: 'text', text: 'hello' }] },
    // length prefixes keep field boundaries apart
    { role: 'user', content: 'ab', name: 'c' },
    { role: 'user', content: 'a', name: 'bc' },
    { role: 'user', content: 1 },
    { role: 'user', content: '1' },
  ];
  t.equal(new Set(all.map((m) => messageDigest(m))).size, all.length);
});

t.test('nested messages are canonical too', async (t) => {
  const a = { role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] };
  const b = { tool_calls: [{ function: { arguments: '{}', name: 'f' }, type: 'function', id: 'c1' }], role: 'assistant' };
  t.equal(messageDigest(a), messageDigest(b));
});
