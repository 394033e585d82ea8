// Ids the gateway makes for ledger keys (requests, new conversations): UUID version 7 (RFC 9562),
// whose text sorts in the order the ids were made. The ledger's primary keys are B-trees; a random
// key lands on a random page, so each request dirtied a page of its own in every table it wrote and
// the commit wrote them all. A key that grows with time lands on the page the previous one did
// (ADR 0015).
//
// Layout: 48 bits of Unix time in ms, the version (7), 12 bits of counter, the variant (10), 62 random
// bits. The counter (method 1 of RFC 9562 §6.2) keeps ids made in the same millisecond in order;
// when it runs out, or the clock steps back, the time field moves on by itself.

import { randomFillSync } from 'node:crypto';

const POOL_BYTES = 4096;
const pool = Buffer.alloc(POOL_BYTES);
let poolAt = POOL_BYTES;

function randomBytes8(): Buffer {
  if (poolAt + 8 > POOL_BYTES) {
    randomFillSync(pool);
    poolAt = 0;
  }
  const b = pool.subarray(poolAt, poolAt + 8);
  poolAt += 8;
  return b;
}

let lastMs = 0;
let counter = 0;

const hex = (n: number, width: number) => n.toString(16).padStart(width, '0');

/** A version 7 UUID, e.g. `01935f2c-8b1e-7a3c-9d2e-4f5a6b7c8d9e`; later calls sort after earlier ones. */
export function uuidV7(now: number = Date.now()): string {
  if (now > lastMs) {
    lastMs = now;
    // A random start in the lower half leaves room to count up within the millisecond.
    counter = randomBytes8().readUInt16BE(0) & 0x7ff;
  } else if (++counter > 0xfff) {
    lastMs++;
    counter = 0;
  }
  const r = randomBytes8();
  const high = Math.floor(lastMs / 0x10000); // top 32 bits of the 48-bit time
  const low = lastMs % 0x10000;
  const variant = 0x8000 | (r.readUInt16BE(0) & 0x3fff);
  return `${hex(high, 8)}-${hex(low, 4)}-${hex(0x7000 | counter, 4)}-${hex(variant, 4)}-${r.toString('hex', 2, 8)}`;
}
