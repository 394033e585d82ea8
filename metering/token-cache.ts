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

export class TokenCache {
  readonly maxBytes: number;
  private readonly entries = new Map<string, CachedCount>();
  private bytes = 0;
  private hits = 0;
  private misses = 0;

  constructor(maxBytes: number = DEFAULT_TOKEN_CACHE_BYTES) {
    if (!Number.isFinite(maxBytes) || maxBytes < 0) throw new RangeError('maxBytes must be ≥ 0');
    this.maxBytes = maxBytes;
  }

  get(key: string): CachedCount | undefined {
    const found = this.entries.get(key);
    if (found === undefined) {
      this.misses++;
      return undefined;
    }
    this.hits++;
    // Map keeps insertion order: re-inserting moves the entry to the most-recently-used end.
    this.entries.delete(key);
    this.entries.set(key, found);
    return found;
  }

  set(key: string, value: CachedCount): void {
    const weight = entryWeight(key);
    if (weight > this.maxBytes) return;
    if (this.entries.delete(key)) this.bytes -= weight;
    this.entries.set(key, value);
    this.bytes += weight;
    // Evict from the least-recently-used end until the bound holds again.
    for (const oldest of this.entries.keys()) {
      if (this.bytes <= this.maxBytes) break;
      this.entries.delete(oldest);
      this.bytes -= entryWeight(oldest);
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
    this.bytes = 0;
    this.hits = 0;
    this.misses = 0;
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
