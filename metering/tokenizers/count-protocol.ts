// Messages between the main thread and a counting worker (count-pool.ts ⇄ count-worker.ts).
import type { TiktokenEncoding } from '@dqbd/tiktoken';
import type { PieceCount } from './bounded-encode.js';

export type CountRequest =
  | { kind: 'count'; id: number; encoding: TiktokenEncoding; texts: string[]; exactRunBudget?: number; preTokenBudget?: number }
  /** Test hook: the worker exits at once, as if it had crashed. */
  | { kind: 'crash'; id: number };

export type CountReply = { id: number; counts: PieceCount[] } | { id: number; error: string };
