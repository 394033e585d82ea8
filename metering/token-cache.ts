// Per-message token counts, kept so that turn N of a conversation tokenizes only what turn N
// added (SPEC §3: work grows with the new content, not the whole conversation). Keys are content
// hashes, so a message resent unchanged is never tokenized twice; the LRU is bounded in bytes so
// a flood of distinct messages cannot grow memory without limit.
import { createHash } from 'node:crypto';
import { canonicalJson } from './canonical-json.js';

export interface CachedCount {
  tokens: number;
  upperBound: boolean;
}

export interface TokenCacheStats {
  hits: number;
  misses: number;
  entries: number;
  bytes: number;
  maxBytes: number;
}

/** 16 MiB: room for ~100k message counts, far more than the live conversations of one replica. */
export const DEFAULT_TOKEN_CACHE_BYTES = 16 * 1024 * 1024;

// A Map entry with a 40-character key and a small object costs roughly this much in V8; the exact
// figure does not matter, only that the bound scales with the number and size of entries.
const ENTRY_OVERHEAD_BYTES = 96;

/** One entry, linked into the recency list: `newer` towards the most recently used end. */
interface Node {
  readonly key: string;
  value: CachedCount;
  older: Node | null;
  newer: Node | null;
}

/** What a counter asks of its cache. */
export type CountCache = Pick<TokenCache, 'get' | 'set'>;

/** `cache` read, never written. */
export function readingOnly(cache: CountCache): CountCache {
  return { get: (key) => cache.get(key), set: () => {} };
}

/**
 * A least-recently-used cache bounded in bytes. Recency is a doubly linked list beside the Map, so
 * a hit relinks a node and an eviction unlinks the oldest: O(1), and the Map itself only changes
 * when a key arrives or leaves. Using the Map's own insertion order instead (delete + re-insert on
 * every hit, evict through `keys()`) was quadratic: V8's ordered hash table keeps deleted entries
 * until it rehashes, in the key's bucket chain (which every later look-up of that key walks) and at
 * the start of the iteration order (which every fresh iterator skips). 200,000 re-sets of one key
 * in a full cache took ~50 s.
 */
export class TokenCache {
  readonly maxBytes: number;
  private readonly entries = new Map<string, Node>();
  private oldest: Node | null = null;
  private newest: Node | null = null;
  private bytes = 0;
  private hits = 0;
  private misses = 0;

  constructor(maxBytes: number = DEFAULT_TOKEN_CACHE_BYTES) {
    if (!Number.isFinite(maxBytes) || maxBytes < 0) throw new RangeError('maxBytes must be ≥ 0');
    this.maxBytes = maxBytes;
  }

  get(key: string): CachedCount | undefined {
    const node = this.entries.get(key);
    if (node === undefined) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    this.touch(node);
    return node.value;
  }

  set(key: string, value: CachedCount): void {
    const known = this.entries.get(key);
    if (known !== undefined) {
      known.value = value;
      this.touch(known);
      return;
    }
    const weight = entryWeight(key);
    if (weight > this.maxBytes) return;
    const node: Node = { key, value, older: this.newest, newer: null };
    if (this.newest !== null) this.newest.newer = node;
    else this.oldest = node;
    this.newest = node;
    this.entries.set(key, node);
    this.bytes += weight;
    // Evict from the least-recently-used end until the bound holds again (never the new node: its
    // weight alone is within the bound).
    while (this.bytes > this.maxBytes && this.oldest !== null) {
      const gone = this.oldest;
      this.unlink(gone);
      this.entries.delete(gone.key);
      this.bytes -= entryWeight(gone.key);
    }
  }

  stats(): TokenCacheStats {
    return {
      hits: this.hits,
      misses: this.misses,
      entries: this.entries.size,
      bytes: this.bytes,
      maxBytes: this.maxBytes,
    };
  }

  clear(): void {
    this.entries.clear();
    this.oldest = null;
    this.newest = null;
    this.bytes = 0;
    this.hits = 0;
    this.misses = 0;
  }

  /** Moves `node` to the most-recently-used end. */
  private touch(node: Node): void {
    if (node === this.newest) return;
    this.unlink(node);
    node.older = this.newest;
    node.newer = null;
    this.newest!.newer = node;
    this.newest = node;
  }

  private unlink(node: Node): void {
    if (node.older !== null) node.older.newer = node.newer;
    else this.oldest = node.newer;
    if (node.newer !== null) node.newer.older = node.older;
    else this.newest = node.older;
    node.older = null;
    node.newer = null;
  }
}

function entryWeight(key: string): number {
  return key.length * 2 + ENTRY_OVERHEAD_BYTES;
}

/**
 * A stable key for `value` under `namespace` (an encoding name, or a llama.cpp base URL): SHA-1 of
 * canonical JSON (metering/canonical-json.ts), so `{role, content}` and `{content, role}` share an entry.
 * SHA-1 is used as a fast content fingerprint, not for security.
 */
export function cacheKey(namespace: string, value: unknown): string {
  return createHash('sha1').update(namespace).update('\0').update(canonicalJson(value)).digest('hex');
}

/** The cache shared by every counter of the process unless a test passes its own. */
export const sharedTokenCache = new TokenCache();
