// One digest per message (metering/message-digest.ts): canonical, so a re-serialised message is
// recognised, and distinct for anything the model would read differently.

import t from 'tap';
import { messageDigest } from '../metering/message-digest.js';
import { chainLink } from '../metering/runs/run-state.js';

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

// Digests feed the prefix-chain hashes kept in the ledger, so a new version must give the same
// digest (and chain link) for the same message: these were computed by the streamed (Hash object)
// implementation.
// Short messages are now hashed in one call and long ones streamed; both must give these bytes.
t.test('digests are stable across versions, short (one call) and long (streamed) alike', async (t) => {
  const long = 'x'.repeat(5000);
  const pinned: Array<[object, string]> = [
    [{ role: 'user', content: 'hello', name: 'a' }, 'WupUZz864EBBu41eyIjG2c3fx84='],
    [{ role: 'user', content: 1 }, 'hNs4fMcZ1+NiLJma1pv+zxBWucw='],
    [{ role: 'user', content: '' }, 'Vb8ZRjSRAwFWmxggKDHTKT/Btb8='],
    [{ role: 'user', content: 'héllo — 👋' }, 'uTzaIi5m6qAOapgJxxPUNgY0Ikw='],
    [{ role: 'user', content: long }, 'GjgK5UAMePIKsiHlNq/TAjaY0Y8='],
    [{ role: 'assistant', content: null, tool_calls: [{ id: 'c1', type: 'function', function: { name: 'f', arguments: '{}' } }] }, 'Ayc4Qi/56TNu5sLP7ZlNCMO/1rU='],
    [{ role: 'user', content: [{ type: 'text', text: long }] }, 'N9ipI98kH81nbvS4nU07SR9aGuI='],
  ];
  for (const [message, digest] of pinned) t.equal(messageDigest(message), digest, JSON.stringify(message).slice(0, 60));
  t.equal(chainLink('', 'WupUZz864EBBu41eyIjG2c3fx84='), 'DnjAe-i3zLwOr-mvoFwa5h');
  t.equal(chainLink('abc', 'def'), 'De9oJuWRr7t7RDHaqm8qeM');
});
