// What this process remembers of each conversation's latest message list, so that turn N does not
// hash and look up again the N−1 turns it has already seen (SPEC §3: work grows with the new
// content). Every chat request resends the whole conversation; the previous request's message
// objects are kept here with their prefix-chain hashes and token counts. A new request whose leading
// messages are *equal* to a remembered list (compared as values, as the chain's canonical form
// compares them: keys in any order, null and absent alike) takes that list's chain and counts for
// those messages and hashes and counts only the rest.
//
// It is a cache, never the truth: a miss (another replica served the previous turn, a restart, an
// eviction) falls back to hashing every message, which gives the same chain. Memory is bounded in
// bytes; one conversation holds one entry, because an entry that a longer list extends is dropped.

import type { ChatMessage, KnownPrefix } from './types.js';
import { messageDigest } from './message-digest.js';

/** Token counts of a remembered list (exact ones only), from the counter that made them. */
export type KnownCounts = Omit<KnownPrefix, 'messages'>;

export interface PrefixMatch {
  /** Leading messages of the request equal to the remembered list (all of it). */
  length: number;
  /** Chain hashes of those messages. */
  chain: readonly string[];
  counts: KnownCounts | null;
  /** The remembered list itself (for `remember`). */
  readonly entry: object;
}

interface Entry {
  key: string;
  messages: readonly ChatMessage[];
  chain: readonly string[];
  counts: KnownCounts | null;
  bytes: number;
  /** Recency list: towards the least (older) and the most (newer) recently used. */
  older: Entry | null;
  newer: Entry | null;
}

/** 32 MiB: the latest message lists of a few thousand long conversations. */
export const DEFAULT_PREFIX_MEMO_BYTES = 32 * 1024 * 1024;
/**
 * Messages one turn may add to the list it grew from and still be found: an assistant turn with
 * its tool results, several times over. A turn that adds more is hashed in full.
 */
export const MAX_NEW_MESSAGES = 32;
// What an entry and a message keep alive beside their text, measured on the heap (tenth session,
// an outside audit): a message's object, its chain hash and its count come to ~250 bytes, an
// entry's own objects to ~500. (Set at 64 and 256, the memo held 1.4–3.3× its budget.)
const ENTRY_OVERHEAD_BYTES = 512;
const MESSAGE_OVERHEAD_BYTES = 256;

// Lists are found by (scope, length, digest of their last message): one hash per length tried, and
// the digests computed while looking are the ones the chain needs anyway (they are memoised).
function keyOf(scope: string, messages: readonly ChatMessage[], length: number): string {
  return `${scope}\u0000${length}\u0000${messageDigest(messages[length - 1]!)}`;
}

export class PrefixMemo {
  private readonly maxBytes: number;
  private readonly entries = new Map<string, Entry>();
  // Recency in a linked list beside the Map, as metering/token-cache.ts keeps it: a hit relinks, an
  // eviction unlinks the oldest. (Re-inserting into the Map on every hit, and evicting through a
  // fresh iterator, is slow in V8: deleted entries stay in the table until it is rebuilt.)
  private oldest: Entry | null = null;
  private newest: Entry | null = null;
  private bytes = 0;

  constructor(maxBytes: number = DEFAULT_PREFIX_MEMO_BYTES) {
    this.maxBytes = maxBytes;
  }

  /** The longest remembered list of `scope` whose every message equals this request's leading one. */
  match(scope: string, messages: readonly ChatMessage[]): PrefixMatch | null {
    if (this.entries.size === 0) return null;
    const shortest = Math.max(1, messages.length - MAX_NEW_MESSAGES);
    for (let length = messages.length; length >= shortest; length--) {
      const e = this.entries.get(keyOf(scope, messages, length));
      if (e === undefined || !sameMessages(e.messages, messages)) continue;
      this.unlink(e);
      this.link(e);
      return { length, chain: e.chain, counts: e.counts, entry: e };
    }
    return null;
  }

  /**
   * Remembers this request's messages (not copied: request bodies are never mutated) with their
   * chain and counts. `from` is the match this request was planned with: the list it grew from is
   * dropped (one entry per conversation), and its size is carried over rather than measured again,
   * with its messages — the ones that size was measured on.
   */
  remember(scope: string, messages: readonly ChatMessage[], chain: readonly string[], counts: KnownCounts | null, from: PrefixMatch | null): void {
    if (this.maxBytes <= 0 || messages.length === 0) return;
    // The list this one grew from, if the memo still holds it: another list of the same key (the
    // same length and last message) may have taken its place while this request was counted.
    const matched = from === null ? undefined : (from.entry as Entry);
    const previous = matched !== undefined && this.entries.get(matched.key) === matched ? matched : undefined;
    const bytes = previous === undefined
      ? ENTRY_OVERHEAD_BYTES + approximateBytes(messages, 0)
      : previous.bytes + approximateBytes(messages, previous.messages.length);
    if (previous !== undefined) this.drop(previous);
    const key = keyOf(scope, messages, messages.length);
    const same = this.entries.get(key);
    if (same !== undefined) this.drop(same);
    if (bytes > this.maxBytes) return;
    // The leading messages are kept as they were measured: the earlier list's objects. This
    // request's copies of them are equal only canonically — a member that is null is no member —
    // and an outside audit sent them back with 1 MB of null members' names each, held by the memo
    // while it counted the 1.7 KB measured before.
    const kept =
      previous === undefined ? messages : previous.messages.length === messages.length ? previous.messages : previous.messages.concat(messages.slice(previous.messages.length));
    const entry: Entry = { key, messages: kept, chain, counts, bytes, older: null, newer: null };
    this.entries.set(key, entry);
    this.link(entry);
    this.bytes += bytes;
    while (this.bytes > this.maxBytes && this.oldest !== null) this.drop(this.oldest);
  }

  stats(): { entries: number; bytes: number; maxBytes: number } {
    return { entries: this.entries.size, bytes: this.bytes, maxBytes: this.maxBytes };
  }

  private drop(e: Entry): void {
    if (this.entries.get(e.key) !== e) return;
    this.entries.delete(e.key);
    this.unlink(e);
    this.bytes -= e.bytes;
  }

  /** Puts `e` at the most recently used end. */
  private link(e: Entry): void {
    e.older = this.newest;
    e.newer = null;
    if (this.newest !== null) this.newest.newer = e;
    else this.oldest = e;
    this.newest = e;
  }

  private unlink(e: Entry): void {
    if (e.older !== null) e.older.newer = e.newer;
    else if (this.oldest === e) this.oldest = e.newer;
    if (e.newer !== null) e.newer.older = e.older;
    else if (this.newest === e) this.newest = e.older;
    e.older = e.newer = null;
  }
}

/**
 * True when `remembered` equals the leading messages of `messages`. The last one is not compared:
 * the list was found by its digest, which is the same canonical form the chain itself relies on.
 */
function sameMessages(remembered: readonly ChatMessage[], messages: readonly ChatMessage[]): boolean {
  for (let i = 0; i < remembered.length - 1; i++) if (!canonicalEqual(remembered[i], messages[i])) return false;
  return remembered.length > 0;
}

function absent(v: unknown): boolean {
  return v === null || v === undefined || typeof v === 'function';
}

/**
 * Equality under metering/canonical-json.ts's canonical form: object keys in any order, members
 * that are null or absent alike; array elements as they are. Equal values have equal digests.
 */
export function canonicalEqual(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  if (typeof a !== 'object' || typeof b !== 'object' || a === null || b === null) return false;
  if (Array.isArray(a)) {
    if (!Array.isArray(b) || a.length !== b.length) return false;
    for (let i = 0; i < a.length; i++) if (!canonicalEqual(a[i] ?? null, b[i] ?? null)) return false;
    return true;
  }
  if (Array.isArray(b)) return false;
  const x = a as Record<string, unknown>;
  const y = b as Record<string, unknown>;
  let present = 0;
  for (const k in x) {
    const v = x[k];
    if (absent(v)) continue;
    present++;
    if (!canonicalEqual(v, y[k])) return false;
  }
  for (const k in y) if (!absent(y[k])) present--;
  return present === 0;
}

/** Roughly what messages[from..] keep alive: their text, plus a little per message. */
function approximateBytes(messages: readonly ChatMessage[], from: number): number {
  let bytes = 0;
  for (let i = from; i < messages.length; i++) {
    bytes += MESSAGE_OVERHEAD_BYTES;
    // Every field the message holds, not only those its count reads: the memo keeps the client's
    // own objects, and a 4 MB `tool_call_id` (or any field a client adds) is held all the same
    // (an audit filled 1.1 GB of heap under a 32 MiB budget that way).
    for (const [field, value] of Object.entries(messages[i]!)) {
      bytes += field.length * 2;
      if (typeof value === 'string') bytes += value.length * 2;
      else if (value != null && typeof value === 'object') bytes += JSON.stringify(value).length * 2;
      else bytes += 8;
    }
  }
  return bytes;
}
