// The SQLite ledger's fingerprints of every head's last chain hash (ADR 0017): a chain that ends
// no head is answered without a query, and the fingerprints follow exactly what the file holds —
// across a restart, a head that moves on, and a group commit that rolls back and is replayed.
import t from 'tap';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { FingerprintTimes } from '../../metering/stores/fingerprint-times.js';
import { HEAD_MESSAGES_KEPT, SqliteLedger } from '../../metering/stores/sqlite-store.js';
import { acquireOwnerLock } from '../../metering/stores/sqlite-owner-lock.js';
import { conversationHead as head, reservation, settlement } from '../helpers/stores.js';

function tempPath(t: { teardown(fn: () => unknown): void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-fp-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return join(dir, 'ledger.db');
}

/** Counts the look-up queries a ledger runs. */
function queries(ledger: SqliteLedger): { count: number; hashes: string[][] } {
  const seen = { count: 0, hashes: [] as string[][] };
  const q = (ledger as unknown as { q: Record<string, { get: (...a: unknown[]) => unknown }> }).q;
  for (const name of ['findByKeyChain', 'findByTenantChain']) {
    const stmt = q[name]!;
    const get = stmt.get.bind(stmt);
    stmt.get = (...a: unknown[]) => {
      seen.count++;
      seen.hashes.push(JSON.parse((a[0] as { hashes: string }).hashes) as string[]);
      return get(...a);
    };
  }
  return seen;
}

t.test('the fingerprint times against a plain map of each string to its latest time', async (t) => {
  const set = new FingerprintTimes();
  const model = new Map<string, number>();
  let seed = 7;
  const rand = (n: number) => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n);
  const strings = Array.from({ length: 3000 }, (_, i) => `hash-${i}-${i * 7919}`);
  for (let step = 0; step < 40_000; step++) {
    const s = strings[rand(strings.length)]!;
    const time = rand(1_000_000);
    set.note(s, time);
    model.set(s, Math.max(model.get(s) ?? 0, time));
  }
  t.equal(set.size, model.size, 'one slot per distinct string noted (grown many times)');
  const wrong = strings.filter((s) => set.timeOf(s) !== (model.get(s) ?? null));
  t.same(wrong, [], 'each string\'s latest time, and none for one never noted');
});

// The look-up asks one hash at a time, latest fingerprint first, and stops once what it found is at
// least as recent as any hash left could be. Checked against one query over the whole chain (the
// path without fingerprints), on many chains and keys, where requests of several keys end on the
// same hashes (their fingerprints' times are then another key's).
t.test('asking hash by hash, latest first, finds what one query over the whole chain finds', async (t) => {
  const path = tempPath(t);
  const owner = new SqliteLedger({ path, owner: await acquireOwnerLock(path) });
  const plain = new SqliteLedger({ path });
  t.teardown(async () => {
    await owner.close();
    await plain.close();
  });
  let seed = 11;
  const rand = (n: number) => ((seed = (Math.imul(seed, 1103515245) + 12345) >>> 0) % n);
  const hashes = Array.from({ length: 12 }, (_, i) => `m${i}`);
  const chainOf = () => Array.from({ length: 1 + rand(6) }, () => hashes[rand(hashes.length)]!);
  for (let i = 0; i < 300; i++) {
    await owner.putHead(head({ conversation: `c${rand(40)}`, keyId: `key-${rand(3)}`, chain: chainOf(), time: 1000 + i }));
  }
  let differ = 0;
  for (let i = 0; i < 300; i++) {
    const chain = chainOf();
    const keyId = rand(4) === 0 ? null : `key-${rand(3)}`;
    if ((await owner.findConversationByChain(keyId, 'acme', chain)) !== (await plain.findConversationByChain(keyId, 'acme', chain))) differ++;
  }
  t.equal(differ, 0, 'the same conversation for 300 chains');
});

t.test('a chain that leads no earlier request asks SQLite nothing; one that does is looked up', async (t) => {
  const ledger = new SqliteLedger({ path: ':memory:' });
  t.teardown(() => ledger.close());
  const asked = queries(ledger);
  await ledger.putHead(head({ conversation: 'c-a', chain: ['a1', 'a2'] }));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['n1', 'n2', 'n3']), null);
  t.equal(asked.count, 0, 'a new conversation: no query');
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3']), 'c-a');
  t.equal(asked.count, 1);
  // Only the hashes a request's list ended on are asked about.
  const sent = asked.hashes.at(-1);
  t.same(sent, ['a2'], 'one hash asked for, not the whole chain');
  // The head moves on: its old last hash still ends a request of it (SPEC §8), the new one too.
  await ledger.putHead(head({ conversation: 'c-a', chain: ['a1', 'a2', 'a3'], time: 2000 }));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'x3']), 'c-a', 'a request that goes back a turn');
  t.same(asked.hashes.at(-1), ['a2']);
  const before = asked.count;
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['a1', 'a2', 'a3', 'a4']), 'c-a');
  t.same(asked.hashes.slice(before), [['a3']], 'one query, for the latest of the two ends: the earlier cannot be more recent');
});

t.test('the owner of a file reads every head back at start', async (t) => {
  const path = tempPath(t);
  const first = new SqliteLedger({ path, owner: await acquireOwnerLock(path) });
  await first.putHead(head({ conversation: 'c-kept', chain: ['k1', 'k2'] }));
  await first.close();
  const again = new SqliteLedger({ path, owner: await acquireOwnerLock(path) });
  t.teardown(() => again.close());
  const asked = queries(again);
  t.equal(await again.findConversationByChain('key-1', 'acme', ['k1', 'k2', 'k3']), 'c-kept', 'found after the restart');
  t.equal(await again.findConversationByChain('key-1', 'acme', ['k9']), null);
  t.equal(asked.count, 1, 'only the chain that ends a head was asked about');
});

t.test('a group commit that rolls back changes no fingerprint; its replay counts once', async (t) => {
  const ledger = new SqliteLedger({ path: ':memory:' });
  t.teardown(() => ledger.close());
  // Two conversations end on the same hash (another key sent the same messages).
  await ledger.putHead(head({ conversation: 'c-mine', keyId: 'key-1', chain: ['s1', 'same'] }));
  await ledger.putHead(head({ conversation: 'c-theirs', keyId: 'key-2', chain: ['s1', 'same'] }));
  const r = reservation({ conversation: 'c-mine', run: 'run-fp' });
  t.same(await ledger.admit(r), { ok: true });
  // One batch: c-mine moves on, and an admission reusing an id throws, so the batch rolls back and
  // each part is replayed alone. Counted twice, the move would take `same` away from c-theirs too.
  const dup = { ...reservation({ run: 'run-fp' }), id: r.id };
  const [settled, refused] = await Promise.allSettled([
    ledger.settle(r.id, settlement(r, 5), head({ conversation: 'c-mine', keyId: 'key-1', chain: ['s1', 'same', 'next'], time: 3000 })),
    ledger.admit(dup),
  ]);
  t.equal(settled.status, 'fulfilled');
  t.equal(refused.status, 'rejected', 'the duplicate failed alone');
  t.equal(await ledger.findConversationByChain('key-2', 'acme', ['s1', 'same', 'more']), 'c-theirs', "the other conversation's head is still found");
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['s1', 'same', 'next', 'more']), 'c-mine');
});

t.test('without the owner lock another connection may write heads: every chain is asked about', async (t) => {
  const path = tempPath(t);
  const reader = new SqliteLedger({ path });
  const writer = new SqliteLedger({ path });
  t.teardown(async () => {
    await reader.close();
    await writer.close();
  });
  await writer.putHead(head({ conversation: 'c-elsewhere', chain: ['w1'] }));
  t.equal(await reader.findConversationByChain('key-1', 'acme', ['w1', 'w2']), 'c-elsewhere');
});

t.test('past its limit the store lets the fingerprints go and asks SQLite every time', async (t) => {
  const path = tempPath(t);
  const ledger = new SqliteLedger({ path, owner: await acquireOwnerLock(path), fingerprintLimit: 3 });
  const asked = queries(ledger);
  for (const c of ['c1', 'c2', 'c3']) await ledger.putHead(head({ conversation: c, chain: [`${c}-h`] }));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['new']), null);
  t.equal(asked.count, 0, 'within the limit: no query for a new chain');
  await ledger.putHead(head({ conversation: 'c4', chain: ['c4-h'] }));
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['new']), null);
  t.equal(asked.count, 1, 'past it: the query again');
  t.equal(await ledger.findConversationByChain('key-1', 'acme', ['c4-h', 'x']), 'c4');
  await ledger.close();
  // A file that already holds more heads than the limit starts without them.
  const again = new SqliteLedger({ path, owner: await acquireOwnerLock(path), fingerprintLimit: 3 });
  t.teardown(() => again.close());
  const askedAgain = queries(again);
  t.equal(await again.findConversationByChain('key-1', 'acme', ['new']), null);
  t.equal(askedAgain.count, 1);
  t.equal(await again.findConversationByChain('key-1', 'acme', ['c1-h', 'x']), 'c1');
});

t.test('the head cache is bounded by the messages it holds, not only by conversations (regression: long heads filled the heap)', async (t) => {
  const ledger = new SqliteLedger({ path: ':memory:' });
  t.teardown(() => ledger.close());
  const long = (conversation: string, messages: number) =>
    head({ conversation, chain: Array.from({ length: messages }, (_, i) => `${conversation}-${i}`), prefix: Array.from({ length: messages + 1 }, (_, i) => i * 10) });
  // 40 conversations of 7,000 messages each: 280,000 messages, more than the cache keeps.
  for (let i = 0; i < 40; i++) await ledger.putHead(long(`long-${i}`, 7000));
  const size = ledger.headCacheSize();
  t.ok(size.messages <= HEAD_MESSAGES_KEPT, `${size.messages} messages kept`);
  t.equal(size.conversations, Math.floor(HEAD_MESSAGES_KEPT / 7000), 'the most recent ones that fit');
  // Evicted or kept, every head reads back whole.
  for (const c of ['long-0', 'long-39']) t.equal((await ledger.getHead(c))?.chain.length, 7000, c);
  // A head larger than the whole budget is written and read, and not kept: the others stay.
  const before = ledger.headCacheSize();
  await ledger.putHead(long('huge', HEAD_MESSAGES_KEPT + 1));
  t.same(ledger.headCacheSize(), before);
  t.equal((await ledger.getHead('huge'))?.chain.length, HEAD_MESSAGES_KEPT + 1);
  // Short conversations still fill it by count.
  for (let i = 0; i < 5000; i++) await ledger.putHead(long(`short-${i}`, 2));
  t.same(ledger.headCacheSize(), { conversations: 4096, messages: 8192 });
});
