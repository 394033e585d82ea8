// Canonical JSON (metering/canonical-json.ts): keys sorted, null members dropped — and every
// member kept, `__proto__` included (it was taken for the prototype and left out of the hash, so
// two tool offers that differ only there hashed alike).
import t from 'tap';
import { canonicalJson } from '../metering/canonical-json.js';

t.test('keys sorted at every depth, null members dropped, array nulls kept', async (t) => {
  t.equal(canonicalJson({ b: 1, a: { d: null, c: [null, 2] } }), '{"a":{"c":[null,2]},"b":1}');
});

t.test('a member named __proto__ is kept', async (t) => {
  const withProto = JSON.parse('{"name":"f","__proto__":{"x":1}}') as unknown;
  const without = JSON.parse('{"name":"f"}') as unknown;
  t.equal(canonicalJson(withProto), '{"__proto__":{"x":1},"name":"f"}');
  t.not(canonicalJson(withProto), canonicalJson(without));
  t.equal(canonicalJson(JSON.parse('{"__proto__":"text"}')), '{"__proto__":"text"}');
});
