// The bytes of a top-level member's value in a JSON text (server/json-span.ts), as /v1/admission
// measures the request inside its wrapper.
import t from 'tap';
import { memberValueBytes } from '../server/json-span.js';

t.test('the value as written: spaces inside it, escapes, nesting, strings holding brackets and quotes', async (t) => {
  const inner = '{ "a" : [1, {"b": "}]\\"{["}], "c": "\\u00e9" }';
  const raw = Buffer.from(`{"endpoint":"/v1/completions",  "request" :  ${inner} , "x": 1}`);
  t.equal(memberValueBytes(raw, 'request'), Buffer.byteLength(inner));
  t.equal(memberValueBytes(raw, 'endpoint'), Buffer.byteLength('"/v1/completions"'));
  t.equal(memberValueBytes(raw, 'x'), 1);
  t.equal(memberValueBytes(raw, 'missing'), null);
});

t.test('the last of two, as JSON.parse keeps; an escaped key; literals; no object', async (t) => {
  t.equal(memberValueBytes(Buffer.from('{"request":[1],"request":"abcd"}'), 'request'), 6);
  t.equal(memberValueBytes(Buffer.from('{"requ\\u0065st":null}'), 'request'), 4);
  t.equal(memberValueBytes(Buffer.from('{"request":-12.5e3}'), 'request'), 7);
  t.equal(memberValueBytes(Buffer.from('[{"request":1}]'), 'request'), null);
  t.equal(memberValueBytes(Buffer.from('\n {"request":true}\n'), 'request'), 4);
});

t.test('bytes that are not UTF-8 count one each, as sent', async (t) => {
  const raw = Buffer.concat([Buffer.from('{"request":"'), Buffer.alloc(10, 0xff), Buffer.from('"}')]);
  t.equal(memberValueBytes(raw, 'request'), 12);
});
