// The charge of SPEC §4 (seed 000): a request pays for the prompt past what it shares with the
// conversation's previous request, plus its whole output allowance up front; the unused allowance
// is refunded when it ends.

import type { ConversationHead } from './ledger.js';
import { ageMs } from './clock-skew.js';

/** Tokens of a rendered prefix that stay charged: the header the next turn adds to it. */
export const HEADER_TOKENS_KEPT = 16;

export interface SharedPrefixInput {
  head: Pick<ConversationHead, 'model' | 'toolHash' | 'serverId' | 'chain' | 'prefix' | 'prefixDigests' | 'time'> | null;
  /** This request's prefix-chain hashes (chain[i] covers messages[0..i]). */
  chain: string[];
  /** This request's prefix token counts (prefix[k] = leading k messages), or null (no messages). */
  prefix: number[] | null;
  /** Digests of the token ids behind each `prefix[k]` (ChatCount.prefixDigests), where the counter saw them. */
  prefixDigests?: string[] | null;
  /** The digest of this request's first `n` token ids (ChatCount.digestAt), where the counter holds them. */
  digestAt?: (n: number) => string;
  model: string;
  toolHash: string;
  now: number;
  /** Where this request goes: its cache settings, and the server behind it (`serverIdOf`). */
  upstream: { prefixCache: boolean; prefixCacheTtlSeconds: number; serverId: string };
  /**
   * The counts come from the server's own rendering of the whole prompt (llama.cpp): shared
   * messages count only while both requests' counts agree at every boundary up to them.
   */
  renderedByServer?: boolean;
}

/**
 * Whether a prefix read at `headTime` can still be in the upstream's cache. A head from further
 * ahead than clocks differ has no age to tell: it is taken as gone (SPEC §4: when the prefix cannot
 * be assumed cached, charge in full). Read as fresh, it was credited for the whole step, an hour
 * after the provider had dropped it.
 */
export function withinCacheLifetime(now: number, headTime: number, ttlSeconds: number): boolean {
  const age = ageMs(now, headTime);
  return age !== null && age <= ttlSeconds * 1000;
}

/** How many leading messages two prefix chains have in common. */
export function sharedMessageCount(previous: string[], current: string[]): number {
  const max = Math.min(previous.length, current.length);
  // The usual case: the previous message list is a prefix of this one.
  if (max > 0 && previous[max - 1] === current[max - 1]) return max;
  let lo = 0;
  let hi = max - 1; // chains are prefix hashes: once they differ they differ for good
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (previous[mid - 1] === current[mid - 1]) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/**
 * Tokens of the rendered leading messages this request shares with the previous one. Nothing is
 * shared across a model or tool-offer change, with another server than the one that read the
 * previous request (its cache is elsewhere), when the upstream keeps no prompt cache, or when the
 * previous request is older than the upstream's cache lifetime — or of an age not known, written
 * ahead of this clock (a clock stepped back: metering/clock-skew.ts).
 */
export function sharedPrefixTokens(i: SharedPrefixInput): number {
  const { head, prefix } = i;
  if (!head || !prefix || !i.upstream.prefixCache) return 0;
  if (!withinCacheLifetime(i.now, head.time, i.upstream.prefixCacheTtlSeconds)) return 0;
  if (head.model !== i.model || head.toolHash !== i.toolHash) return 0;
  // A head from before servers were recorded (null) counts as this server: an upgrade must not
  // charge every open conversation in full (ADR 0004).
  if (head.serverId !== null && head.serverId !== i.upstream.serverId) return 0;
  let k = sharedMessageCount(head.chain, i.chain);
  // A server's template can render the same message differently by where it stands: Qwen3 keeps
  // an assistant turn's reasoning only while no user message follows it, so the next request,
  // which adds one, renders that turn shorter, and all it really shares ends there. The counts at
  // the boundaries then differ: only the messages before the first difference are shared.
  if (i.renderedByServer) {
    for (let j = 0; j <= k; j++) {
      if (prefix[j] !== undefined && head.prefix[j] !== undefined && prefix[j] !== head.prefix[j]) {
        k = j - 1;
        break;
      }
    }
  }
  // The same count with other tokens is another rendering all the same (Llama 3.x writes today's
  // date into its system turn: a conversation that crosses midnight is read again from there).
  k = Math.min(k, lastSameTokens(prefix, head.prefix, i.prefixDigests, head.prefixDigests, k));
  // And the tokens themselves, where this request's are at hand: the previous request's first
  // head.prefix[k] tokens must begin this one too, whatever this request's own boundaries say. A
  // template may write a message elsewhere once more follow it — Mistral v0.3 writes the system
  // message into the last user turn, so turn 2 begins with the first question where turn 1 began
  // with the system message, and the server reuses a few tokens of it (ADR 0004).
  if (i.digestAt && head.prefixDigests) k = lastBoundaryBegun(k, head.prefix, head.prefixDigests, i.digestAt);
  if (k <= 0) return 0;
  // Same messages, same tokenizer: the counts agree; take the smaller to stay conservative.
  return Math.min(prefix[k] ?? 0, head.prefix[k] ?? Number.MAX_SAFE_INTEGER);
}

/**
 * The last boundary up to `k` before which both requests' digests agree wherever their counts do:
 * `k` itself when they do throughout, or when either has none. Where the counts differ the digests
 * say nothing new (they cover different lengths), and the counts are judged above.
 */
function lastSameTokens(prefix: number[], headPrefix: number[], digests: string[] | null | undefined, headDigests: string[] | null, k: number): number {
  if (!digests || !headDigests) return k;
  for (let j = 0; j <= k; j++) {
    const [a, b] = [digests[j], headDigests[j]];
    if (a !== undefined && b !== undefined && prefix[j] === headPrefix[j] && a !== b) return j - 1;
  }
  return k;
}

/**
 * The last boundary up to `k` whose tokens, as the previous request counted and digested them,
 * also begin this request. The boundaries' counts never decrease, so once one is not begun no later
 * one is: a binary search, a digest of this request's leading tokens at each step.
 */
function lastBoundaryBegun(k: number, headPrefix: number[], headDigests: string[], digestAt: (n: number) => string): number {
  const begun = (j: number) => headPrefix[j] !== undefined && headDigests[j] !== undefined && digestAt(headPrefix[j]!) === headDigests[j];
  // The usual case, one hash: the previous request's boundaries all begin this one.
  if (begun(k)) return k;
  let lo = 0;
  let hi = k - 1;
  while (lo < hi) {
    const mid = (lo + hi + 1) >> 1;
    if (begun(mid)) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

/** prompt − max(0, shared − 16), never negative. */
export function promptChargeFor(promptTokens: number, sharedTokens: number): number {
  const credited = Math.max(0, sharedTokens - HEADER_TOKENS_KEPT);
  return Math.max(0, promptTokens - credited);
}

/** Settlement: charge = prompt charge + generated; refund = allowance − generated (≥ 0). */
export function settleTokens(promptCharge: number, allowance: number, generated: number) {
  const used = Math.min(Math.max(0, generated), allowance);
  return { generated: used, chargeTokens: promptCharge + used, refundTokens: allowance - used };
}
