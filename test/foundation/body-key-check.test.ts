// A client route's body and its key (server/body.ts, ADR 0020): once past 64 KiB, a body whose key
// is still being checked — a ledger look-up that takes its time — is not read on until the answer
// comes; a key that fails leaves the body counted and not kept. The parser runs here in a small
// Fastify app whose key check the test answers itself, and the socket counts what was read.

import t from 'tap';
import Fastify from 'fastify';
import { request as httpRequest } from 'node:http';
import type { AddressInfo } from 'node:net';
import { registerJsonBodyParser, UNAUTHENTICATED_BODY_BYTES } from '../../server/body.js';
import { GatewayError } from '../../server/errors.js';

for (const passes of [false, true]) {
t.test(`past 64 KiB, reading waits for the key check; then ${passes ? 'a key that passes has its body read and kept' : 'a failed key reads on without keeping'}`, async (t) => {
  let answer!: (ok: boolean) => void;
  const checked = new Promise<boolean>((resolve) => (answer = resolve));
  const app = Fastify();
  app.decorate('gateway', {
    auth: {
      authenticate: async () => {
        if (!(await checked)) throw new GatewayError('invalid_api_key', 'invalid API key');
        return { tenant: 't', keyId: 'k' };
      },
    },
  } as never);
  registerJsonBodyParser(app, 32 * 1024 * 1024);
  let read = 0;
  let readWhenAnswered = -1;
  // Counted off the socket (a 'data' listener on the request itself would start it flowing before
  // the parser listens): what the process has taken in while the key is checked.
  app.addHook('onRequest', async (request) => {
    request.raw.socket.on('data', (chunk: Buffer) => (read += chunk.length));
  });
  app.post('/v1/echo', async (request) => ({ unread: request.bodyUnread === true, body: request.body === undefined ? null : 'kept' }));
  await app.listen({ host: '127.0.0.1', port: 0 });
  t.teardown(() => app.close());
  const port = (app.server.address() as AddressInfo).port;

  const body = JSON.stringify({ pad: 'x'.repeat(8 * 1024 * 1024) });
  const reply = new Promise<{ status: number; text: string }>((resolve, reject) => {
    const req = httpRequest({ host: '127.0.0.1', port, method: 'POST', path: '/v1/echo', headers: { 'content-type': 'application/json', 'content-length': String(body.length) } }, (res) => {
      let text = '';
      res.on('data', (d: Buffer) => (text += d.toString()));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text }));
    });
    req.on('error', reject);
    req.end(body);
  });
  // Give the client every chance to send it all; the gateway reads no more than it must.
  for (let i = 0; i < 20; i++) await new Promise((r) => setTimeout(r, 25));
  readWhenAnswered = read;
  t.ok(readWhenAnswered > UNAUTHENTICATED_BODY_BYTES, `${readWhenAnswered} bytes read before it waited`);
  t.ok(readWhenAnswered < UNAUTHENTICATED_BODY_BYTES + 1024 * 1024, `no more than a read past the bound while the key is checked (${readWhenAnswered} of ${body.length})`);
  answer(passes);
  const r = await reply;
  t.same(JSON.parse(r.text), passes ? { unread: false, body: 'kept' } : { unread: true, body: null });
});
}
