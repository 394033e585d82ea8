// Client keys (SPEC §2.2, §8): with auth.keys configured a request needs a known key; the upstream
// sees its own key (apiKeyEnv) and none of the client's credentials or other headers (SPEC §2.5).

import t, { type Test } from 'tap';
import { request as httpRequest } from 'node:http';
import { connect } from 'node:net';
import OpenAI from 'openai';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from '../helpers/gateway.js';
import { sdkStatus } from '../helpers/sdk.js';
import { collect } from '../helpers/stores.js';
import { HOUR_MS, sleep, steppableWallClock } from '../helpers/wall-clock.js';
import { hashKey } from '../../server/auth.js';

const KEY = 'tg-foundation-key';
const chat = { model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8 };

async function withKeys(t: Test) {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(
    t,
    { upstreams: [openaiUpstream(upstream.url)], auth: { keys: [{ key: KEY, tenant: 'acme' }] } },
    { env: { DOUBLE_KEY: 'sk-upstream-own', TOLLGATE_ADMIN_TOKEN: 'admin-secret' } },
  );
  return { upstream, gw };
}

/** A raw HTTP request, so that hop-by-hop headers (which fetch forbids) can be sent. */
function rawPost(url: string, headers: Record<string, string>, body: unknown): Promise<{ status: number; body: string }> {
  const payload = JSON.stringify(body);
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(payload)), ...headers } }, (res) => {
      let text = '';
      res.setEncoding('utf8');
      res.on('data', (d: string) => (text += d));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, body: text }));
    });
    req.on('error', reject);
    req.end(payload);
  });
}

t.test('no key → 401 missing_api_key; wrong key → 401 invalid_api_key; nothing reaches the upstream', async (t) => {
  const { upstream, gw } = await withKeys(t);
  const post = (headers: Record<string, string>) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(chat) });

  const none = await post({});
  t.equal(none.status, 401);
  t.equal(none.headers.get('x-should-retry'), 'false');
  const noneBody = (await none.json()) as { error: { code: string; type: string; message: string } };
  t.equal(noneBody.error.code, 'missing_api_key');
  t.equal(noneBody.error.type, 'authentication_error');

  const wrong = await post({ authorization: 'Bearer tg-not-a-key' });
  t.equal(wrong.status, 401);
  t.equal(((await wrong.json()) as { error: { code: string } }).error.code, 'invalid_api_key');

  // GET /v1/models is a client route too
  t.equal((await fetch(`${gw.url}/v1/models`)).status, 401);
  t.equal((await fetch(`${gw.url}/v1/models`, { headers: { authorization: 'Bearer nope' } })).status, 401);

  // The SDK surfaces it as an AuthenticationError (and does not retry a 401).
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: 'tg-wrong' });
  t.equal(await sdkStatus(client.chat.completions.create({ ...chat, messages: [{ role: 'user', content: 'hello' }] })), 401);
  t.equal(upstream.requests.length, 0, 'refused before any upstream call');
});

t.test('two Authorization headers are refused, not one of them picked; a key without Bearer is told so, not quoted', async (t) => {
  const { upstream, gw } = await withKeys(t);
  const { port } = new URL(gw.url);
  const body = JSON.stringify(chat);
  const raw = (authLines: string) =>
    new Promise<string>((resolve) => {
      const socket = connect(Number(port), '127.0.0.1', () =>
        socket.write(`POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n${authLines}Content-Length: ${Buffer.byteLength(body)}\r\nConnection: close\r\n\r\n${body}`),
      );
      let text = '';
      socket.on('data', (b) => (text += b.toString()));
      socket.on('end', () => resolve(text));
    });
  const twice = await raw(`Authorization: Bearer ${KEY}\r\nAuthorization: Bearer tg-someone-else\r\n`);
  t.match(twice, /^HTTP\/1\.1 401 /);
  t.match(twice, /"message":"Authorization sent 2 times: send one key"/);
  const bare = await raw(`Authorization: ${KEY}\r\n`);
  t.match(bare, /^HTTP\/1\.1 401 /);
  t.match(bare, /"message":"the Authorization header holds no Bearer key: send \\"Authorization: Bearer tg-…\\""/);
  t.notMatch(bare, new RegExp(KEY), 'the key is not quoted back');
  t.match(await raw(`Authorization: Bearer ${KEY}\r\n`), /^HTTP\/1\.1 200 /, 'one key passes');
  t.equal(upstream.requests.length, 1);
});

t.test("SPEC §2's order: a body of the wrong shape is a 400 naming the field, key or no key", async (t) => {
  const { upstream, gw } = await withKeys(t);
  const post = (body: unknown, headers: Record<string, string>) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  const senders: Array<Record<string, string>> = [{}, { authorization: 'Bearer tg-not-a-key' }];
  for (const headers of senders) {
    const res = await post({ model: 'gpt-4o-mini', messages: 'hello' }, headers);
    t.equal(res.status, 400);
    const body = (await res.json()) as { error: { param: string | null; type: string } };
    t.equal(body.error.param, 'messages');
    t.equal(body.error.type, 'invalid_request_error');
  }
  // A well-formed body still needs a key.
  t.equal((await post(chat, {})).status, 401);
  t.equal(upstream.requests.length, 0);
});

t.test('a body past 64 KiB whose key fails is counted, not kept: a 401 (a 413 past the limit), key or no key', async (t) => {
  const { upstream, gw } = await withKeys(t);
  const post = (path: string, body: unknown, headers: Record<string, string>) =>
    fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body: JSON.stringify(body) });
  // A megabyte of the wrong shape: with the key it is read, and a 400; without one it is not read.
  const wrong = { model: 'gpt-4o-mini', messages: 'x'.repeat(1024 * 1024) };
  const withKey = await post('/v1/chat/completions', wrong, { authorization: `Bearer ${KEY}` });
  t.equal(withKey.status, 400);
  t.match(await withKey.json(), { error: { param: 'messages' } });
  for (const headers of [{}, { authorization: 'Bearer tg-not-a-key' }] as Array<Record<string, string>>) {
    for (const path of ['/v1/chat/completions', '/v1/embeddings', '/v1/admission']) {
      const res = await post(path, wrong, headers);
      t.equal(res.status, 401, `${path} ${JSON.stringify(headers)}`);
      t.match(await res.json(), { error: { code: /api_key/ } });
    }
    // Small bodies are still parsed before the key is checked (SPEC §2), and the limit still comes first.
    const small = await post('/v1/chat/completions', { model: 'gpt-4o-mini', messages: 'hello' }, headers);
    t.equal(small.status, 400);
    const huge = await post('/v1/chat/completions', { ...wrong, messages: 'x'.repeat(33 * 1024 * 1024) }, headers);
    t.equal(huge.status, 413);
  }
  const fine = await post('/v1/chat/completions', { ...chat, messages: [{ role: 'user', content: 'y '.repeat(30_000) }] }, { authorization: `Bearer ${KEY}` });
  t.equal(fine.status, 200, 'a large body with its key goes');
  t.equal(upstream.requests.length, 1);
});

t.test('right key → 200; the upstream sees its own key, never the client one', async (t) => {
  const { upstream, gw } = await withKeys(t);
  const client = new OpenAI({ baseURL: `${gw.url}/v1`, apiKey: KEY });
  const data = await client.chat.completions.create({ model: 'gpt-4o-mini', messages: [{ role: 'user', content: 'hello' }], max_tokens: 8 });
  t.equal(data.choices[0].message.content, ' hi hi hi');
  const seen = upstream.requests.at(-1)!;
  t.equal(seen.headers.authorization, 'Bearer sk-upstream-own');
  t.notOk(JSON.stringify(seen.headers).includes(KEY), 'the client key appears in no upstream header');
  const rows = [];
  for await (const row of gw.ledger.exportRows(null, null)) rows.push(row);
  t.equal(rows.length, 1);
  t.equal(rows[0].tenant, 'acme', 'the request belongs to the key’s tenant');
});

t.test('hop-by-hop headers, credentials, cookies, client addresses and unknown headers are not forwarded; the client\'s user agent is', async (t) => {
  const { upstream, gw } = await withKeys(t);
  const res = await rawPost(
    gw.url,
    {
      authorization: `Bearer ${KEY}`,
      connection: 'keep-alive, x-hop',
      'x-hop': 'hop-value',
      'keep-alive': 'timeout=99',
      'x-custom': 'custom-value',
      cookie: 'session=cookie-value',
      'proxy-authorization': 'Basic cHJveHk6c2VjcmV0',
      'x-forwarded-for': '203.0.113.7',
      'user-agent': 'client-agent/1.0',
      'openai-organization': 'org-client',
    },
    chat,
  );
  t.equal(res.status, 200, res.body);
  const seen = upstream.requests.at(-1)!;
  for (const name of ['x-hop', 'keep-alive', 'x-custom', 'cookie', 'proxy-authorization', 'x-forwarded-for', 'openai-organization']) {
    t.equal(seen.headers[name], undefined, `${name} not forwarded`);
  }
  t.equal(seen.headers['user-agent'], 'client-agent/1.0', "and the client's user agent");
  t.notOk(String(seen.headers.connection ?? '').includes('x-hop'), 'the client’s Connection header is not forwarded');
  const values = JSON.stringify(seen.headers);
  for (const v of ['hop-value', 'custom-value', 'cookie-value', 'cHJveHk6c2VjcmV0', '203.0.113.7', 'org-client', KEY]) {
    t.notOk(values.includes(v), `no client value ${v} upstream`);
  }
  t.equal(seen.headers.authorization, 'Bearer sk-upstream-own');
});

t.test('a key made with the operator API closes a gateway that had none; deleting the last opens it again (loopback)', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const post = (key?: string) =>
    fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) }, body: JSON.stringify(chat) });
  const admin = { authorization: 'Bearer admin-secret', 'content-type': 'application/json' };

  const before = await post('tg-anything');
  t.equal(before.status, 200, 'no keys anywhere: open, as SPEC §8 says');

  const made = (await (await fetch(`${gw.url}/admin/keys`, { method: 'POST', headers: admin, body: JSON.stringify({ tenant: 'acme' }) })).json()) as { id: string; key: string };
  const unknown = await post('tg-anything');
  t.equal(unknown.status, 401, 'an unknown key is refused once a key exists');
  t.equal(((await unknown.json()) as { error: { code: string } }).error.code, 'invalid_api_key');
  const none = await post();
  t.equal(none.status, 401);
  t.equal(((await none.json()) as { error: { code: string } }).error.code, 'missing_api_key');
  t.equal((await post(made.key)).status, 200, 'the made key works');
  const forbidden = await fetch(`${gw.url}/admin/tenants/acme/spend`, { headers: { authorization: 'Bearer tg-anything' } });
  t.equal(forbidden.status, 401, 'an unknown key is no client on the operator API either');

  const second = (await (await fetch(`${gw.url}/admin/keys`, { method: 'POST', headers: admin, body: JSON.stringify({ tenant: 'acme' }) })).json()) as { id: string; key: string };
  const deleteKey = async (id: string) => {
    const res = await fetch(`${gw.url}/admin/keys/${id}`, { method: 'DELETE', headers: { authorization: 'Bearer admin-secret' } });
    t.equal(res.status, 200);
    return res.json();
  };
  t.same(await deleteKey(second.id), { id: second.id, deleted: true }, 'a key left: the gateway stays closed, and the answer says nothing more');
  t.equal((await post(second.key)).status, 401, 'the revoked key is refused');
  t.same(await deleteKey(made.id), { id: made.id, deleted: true, gateway_open: true }, 'the last key: the answer says the gateway is open again');
  t.equal((await post('tg-anything')).status, 200, 'no keys left: open again, on loopback');
  const rows = await collect(gw.ledger.exportRows(null, null));
  t.same(rows.map((r) => r.tenant), ['local', 'acme', 'local'], 'the refused requests left no row; the others are billed to who sent them');
});

t.test('a key made on another replica closes a key-less gateway within a second, though the wall clock is stepped back an hour (regression)', async (t) => {
  const wall = steppableWallClock(t);
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] });
  const post = () => fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(chat) });
  t.equal((await post()).status, 200, 'no keys anywhere: open');
  // 1. The wall clock is stepped back an hour.
  wall.step(-HOUR_MS);
  // 2. Another replica on the same ledger makes a key: this one is not told (no keysChanged).
  await gw.ledger.createTenant({ id: 'acme', monthlyBudgetUsd: null });
  await gw.ledger.createKey({ id: 'key-elsewhere', tenant: 'acme', name: null, hash: hashKey('tg-made-elsewhere') });
  // 3. A second passes: the last look at the keys no longer holds.
  await sleep(1_100);
  const res = await post();
  t.equal(res.status, 401, 'closed: not open for the hour the clock went back');
  t.equal(((await res.json()) as { error: { code: string } }).error.code, 'missing_api_key');
});

t.test('a gateway that may not serve without keys (not on loopback) refuses every request while it has none', async (t) => {
  const upstream = await startOpenAiDouble({ completionTokens: 3 });
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, { billing: 'local' })] }, { openWithoutKeys: false });
  const res = await fetch(`${gw.url}/v1/chat/completions`, { method: 'POST', headers: { 'content-type': 'application/json', authorization: 'Bearer tg-anything' }, body: JSON.stringify(chat) });
  t.equal(res.status, 401);
  t.equal(upstream.requests.length, 0, 'nothing reached the upstream');
});

t.test('an admin token set with spaces or a newline around it (a secret file) is the token without them', async (t) => {
  for (const token of ['admin-secret\n', ' admin-secret', 'admin-secret \r\n']) {
    const gw = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9')], auth: { keys: [{ key: 'tg-a', tenant: 'a' }] } }, { env: { TOLLGATE_ADMIN_TOKEN: token } });
    const res = await fetch(`${gw.url}/admin/tenants/a/spend`, { headers: { authorization: 'Bearer admin-secret' } });
    t.equal(res.status, 200, JSON.stringify(token));
    t.equal((await fetch(`${gw.url}/admin/tenants/a/spend`, { headers: { authorization: 'Bearer admin-secre' } })).status, 401, 'another token is still refused');
  }
  // Only blanks: the operator API stays off, as with no token at all.
  const blank = await startGateway(t, { upstreams: [openaiUpstream('http://127.0.0.1:9')], auth: { keys: [{ key: 'tg-a', tenant: 'a' }] } }, { env: { TOLLGATE_ADMIN_TOKEN: ' \n' } });
  const off = await fetch(`${blank.url}/admin/tenants/a/spend`, { headers: { authorization: 'Bearer x' } });
  t.equal(off.status, 401);
  t.match(await off.json(), { error: { message: /operator API is off/ } });
});
