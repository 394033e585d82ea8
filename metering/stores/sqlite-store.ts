// The SQLite ledger: one file on disk, WAL, for a gateway on one machine (SPEC §9, ADR 0005).
// better-sqlite3 is synchronous, so every admit/settle runs to completion inside one
// BEGIN IMMEDIATE transaction: the write lock is taken before the counters are read, which makes
// read-check-write atomic against other connections and other processes on the same file.
import { chmodSync, closeSync, existsSync, openSync } from 'node:fs';
import { resolve } from 'node:path';
import Database from 'better-sqlite3';
import type {
  AdmitResult,
  ConversationHead,
  ConversationSpend,
  HistoryTable,
  KeyRecord,
  Ledger,
  LedgerRow,
  MonthAfterSettle,
  Reservation,
  RunState,
  Settlement,
  TenantMonthSpend,
  TenantRecord,
  ExportWindow,
} from '../ledger.js';
import { checkAdmission, familyNow, reservedTokens, type MoneyScopeState } from './admission-check.js';
import {
  EXPORT_PAGE,
  ancestorsOfRow,
  countsAsTurn,
  fromSettlement,
  isUnpricedTurn,
  recoveredSettlement,
  reservationColumns,
  settlementColumns,
  toLedgerRow,
  type OpenRow,
  type SettleValues,
} from './ledger-row.js';
import { migrateSqlite } from './migrations-sqlite.js';
import { prepareSqlite, type SqliteStatements } from './sqlite-statements.js';
import { WalCheckpointer, type CheckpointerStats, type CheckpointEvent } from './sqlite-checkpointer.js';
import type { OwnerLock } from './sqlite-owner-lock.js';
import { FingerprintTimes } from './fingerprint-times.js';
import { LedgerFileIdentity } from './sqlite-file-identity.js';

export interface SqliteLedgerOptions {
  path: string;
  /** NORMAL (default) survives a killed process; FULL also survives power loss, slower. */
  synchronous?: 'NORMAL' | 'FULL';
  /** How long a writer waits for another connection's lock before failing (ms). */
  busyTimeoutMs?: number;
  /** The file's owner lock, held by the gateway serving it; released when the store closes. */
  owner?: OwnerLock | null;
  /** Chain ends past which the store stops keeping fingerprints (ADR 0017, 0024). */
  fingerprintLimit?: number;
  /** Told when WAL checkpoints start or stop failing (the gateway logs it). */
  onCheckpointEvent?: (e: CheckpointEvent) => void;
}

/** ~48 MB of fingerprints at most (a 4-byte and an 8-byte array of 2^22 slots). */
export const FINGERPRINT_LIMIT = 2_000_000;

interface ConversationRecord extends MoneyScopeState {
  id: string;
  tenant: string | null;
  parent: string | null;
  saved_usd: number;
  plan_turns: number;
  plan_work_usd: number;
  turns: number;
  roomCeilingMtok: number | null;
  unpriced_turns: number;
  tasks_unpriced_turns: number;
}

interface HeadRecord {
  conversation: string;
  key_id: string | null;
  tenant: string;
  model: string;
  tool_hash: string;
  server_id: string | null;
  chain: string;
  prefix: string;
  prefix_digests: string | null;
  last_cost_usd: number | null;
  last_prompt_tokens: number;
  last_output_tokens: number;
  time: number;
}

interface Pending {
  inBatch: () => unknown;
  alone: () => unknown;
  resolve: (v: unknown) => void;
  reject: (e: unknown) => void;
}

/**
 * A head's chain as stored: hashes of one width (the gateway's are 22 characters) are written
 * back to back behind their width, `22:…` — a long conversation's chain is re-written every turn,
 * and this is a third of its JSON and needs no parsing; anything else as a JSON array.
 */
export function encodeChain(chain: readonly string[]): string {
  const width = chain[0]?.length ?? 0;
  if (width > 0 && chain.every((h) => h.length === width)) return `${width}:${chain.join('')}`;
  return JSON.stringify(chain);
}

export function decodeChain(stored: string): string[] {
  if (stored.startsWith('[')) return JSON.parse(stored) as string[];
  const colon = stored.indexOf(':');
  const width = Number(stored.slice(0, colon));
  const out: string[] = [];
  for (let at = colon + 1; at < stored.length; at += width) out.push(stored.slice(at, at + width));
  return out;
}

/** Conversations whose head arrays are kept in memory. */
const HEAD_ARRAYS_KEPT = 4096;
/**
 * Messages those heads may hold together: a message costs ~120 bytes in memory (its hash and its
 * count; ~160 with the token digest a llama.cpp count adds), so a 7,000-message conversation's head
 * is close to a megabyte, and 4,096 of them would not fit a heap. 262,144 keeps 4,096
 * conversations of 64 messages (~30 MB; ~40 MB of llama.cpp ones).
 */
export const HEAD_MESSAGES_KEPT = 262_144;

/** A head's long columns, decoded: what the head cache keeps. */
type HeadArrays = Pick<ConversationHead, 'chain' | 'prefix' | 'prefixDigests'>;
type HeadScalars = Omit<HeadRecord, keyof HeadArrays | 'prefix_digests'>;

function headOf(h: HeadScalars, { chain, prefix, prefixDigests }: HeadArrays): ConversationHead {
  return {
    conversation: h.conversation,
    keyId: h.key_id,
    tenant: h.tenant,
    model: h.model,
    toolHash: h.tool_hash,
    serverId: h.server_id,
    chain,
    prefix,
    prefixDigests,
    lastCostUsd: h.last_cost_usd,
    lastPromptTokens: h.last_prompt_tokens,
    lastOutputTokens: h.last_output_tokens,
    time: h.time,
  };
}

const NO_MONEY: MoneyScopeState = { capUsd: null, spentUsd: 0, tasksUsd: 0, reservedUsd: 0 };

export class SqliteLedger implements Ledger {
  readonly kind = 'sqlite' as const;
  private readonly db: Database.Database;
  private readonly q: SqliteStatements;
  private readonly admitTx: (r: Reservation) => AdmitResult;
  private readonly settleTx: (id: string, build: (row: OpenRow) => SettleValues, head?: ConversationHead) => MonthAfterSettle | null;
  private readonly batchTx: (ops: Array<() => unknown>) => unknown[];
  /** Admissions and settlements waiting for the next group commit. */
  private pending: Pending[] = [];
  private flushScheduled = false;
  private readonly checkpointer: WalCheckpointer | null;
  private readonly owner: OwnerLock | null;
  /** Chain and prefix of recently written or read heads (least recently used first). */
  private readonly headArrays = new Map<string, HeadArrays & { time: number; lastHash: string }>();
  /** Messages the kept heads hold together (bounded by HEAD_MESSAGES_KEPT). */
  private headMessages = 0;
  /**
   * Where every request's message list ended (`chain_ends`), with the latest time each was written,
   * when this connection is the file's only writer (ADR 0017, 0024): a chain none of whose hashes
   * is here leads no earlier request, and its look-up query is skipped; one that does is asked for
   * its likeliest hash first. Null when another connection may write what this one would not see.
   */
  private chainEndTimes: FingerprintTimes | null;
  private readonly fingerprintLimit: number;
  /** Chain ends written inside the open transaction: noted in `chainEndTimes` once it commits. */
  private newChainEnds: Array<{ hash: string; time: number }> = [];

  readonly location: string;
  readonly createdNow: boolean;
  /** Whether the path still names the file opened (null in memory). */
  private readonly file: LedgerFileIdentity | null;

  constructor(opts: SqliteLedgerOptions) {
    this.owner = opts.owner ?? null;
    this.location = opts.path === '' || opts.path === ':memory:' ? ':memory:' : resolve(opts.path);
    const fileMadeNow = this.location !== ':memory:' && !existsSync(this.location);
    // Made owner-only before SQLite opens it, so that no moment exists where another user could open it.
    if (fileMadeNow) makeOwnerOnly(this.location);
    this.db = new Database(opts.path);
    // No schema yet: the file is new (or was empty), and this is a ledger with no history.
    this.createdNow = this.db.prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'schema_version'").get() === undefined;
    // A ledger holds key hashes and every tenant's spend: a file made here is readable by its
    // owner alone (SQLite gives its -wal and -shm files the database file's mode). A file that
    // was there keeps the mode its operator gave it.
    if (fileMadeNow) chmodSync(this.location, 0o600); // whatever the umask made of it
    this.db.pragma('journal_mode = WAL');
    this.db.pragma(`synchronous = ${opts.synchronous === 'FULL' ? 'FULL' : 'NORMAL'}`);
    this.db.pragma(`busy_timeout = ${Math.max(0, Math.floor(opts.busyTimeoutMs ?? 5000))}`);
    // Statements need the tables, so the schema is brought up to date before they are prepared.
    migrateSqlite(this.db);
    this.q = prepareSqlite(this.db);
    const admit = this.db.transaction((r: Reservation) => this.admitLocked(r));
    this.admitTx = (r) => this.inTx(() => admit.immediate(r));
    const settle = this.db.transaction((id: string, build: (row: OpenRow) => SettleValues, head?: ConversationHead) =>
      this.settleAndHead(id, build, head),
    );
    this.settleTx = (id, build, head) => this.inTx(() => settle.immediate(id, build, head));
    const batch = this.db.transaction((ops: Array<() => unknown>) => ops.map((op) => op()));
    this.batchTx = (ops) => this.inTx(() => batch.immediate(ops));
    const memory = opts.path === ':memory:' || opts.path === '';
    this.fingerprintLimit = opts.fingerprintLimit ?? FINGERPRINT_LIMIT;
    this.chainEndTimes = this.owner !== null || memory ? this.loadChainEndTimes() : null;
    const synchronous = opts.synchronous === 'FULL' ? 'FULL' : 'NORMAL';
    this.checkpointer = memory ? null : new WalCheckpointer(opts.path, synchronous, (pages) => this.db.pragma(`wal_autocheckpoint = ${pages}`), undefined, undefined, opts.onCheckpointEvent);
    this.file = memory ? null : new LedgerFileIdentity(this.location);
  }

  private loadChainEndTimes(): FingerprintTimes | null {
    const { n } = this.db.prepare('SELECT count(*) AS n FROM chain_ends').get() as { n: number };
    if (n > this.fingerprintLimit) return null;
    const set = new FingerprintTimes(n);
    for (const [hash, time] of this.db.prepare('SELECT last_hash, time FROM chain_ends').raw().iterate() as Iterable<[string, number]>) set.note(hash, time);
    return set;
  }

  /** The open transaction committed: its chain ends reach the fingerprints. */
  private committed(): void {
    const set = this.chainEndTimes;
    if (set !== null) {
      // A chain end stays (retention's pruning leaves its fingerprint: a look-up then finds nothing).
      for (const end of this.newChainEnds) set.note(end.hash, end.time);
      // Past the limit the set is let go, and every look-up queries again: memory stays bounded.
      if (set.size > this.fingerprintLimit) this.chainEndTimes = null;
    }
    this.newChainEnds = [];
  }

  /** The open transaction rolled back: nothing it did happened. */
  private rolledBack(): void {
    this.newChainEnds = [];
  }

  /** Runs `tx` (a transaction), keeping the fingerprints in step with what it commits. */
  private inTx<T>(tx: () => T): T {
    let value: T;
    try {
      value = tx();
    } catch (error) {
      this.rolledBack();
      throw error;
    }
    this.committed();
    return value;
  }

  /** The WAL checkpointer's figures (null for an in-memory ledger). */
  checkpointStats(): CheckpointerStats | null {
    return this.checkpointer?.stats() ?? null;
  }

  /**
   * Group commit: the admissions and settlements that arrive in one turn of the event loop run one
   * after another in a single write transaction, and their promises resolve only once that
   * transaction has committed. Each check still sees every write before it; what changes is one
   * commit for many requests instead of one each — the commit was the largest single cost of a
   * request (bench/RESULTS.md). `inBatch` runs inside the shared transaction; `alone` is the same
   * work in a transaction of its own, used only when something in the batch threw.
   */
  private grouped<T>(inBatch: () => T, alone: () => T): Promise<T> {
    return new Promise<T>((resolve, reject) => {
      this.pending.push({ inBatch, alone, resolve: resolve as (v: unknown) => void, reject });
      if (!this.flushScheduled) {
        this.flushScheduled = true;
        setImmediate(() => this.flush());
      }
    });
  }

  private flush(): void {
    this.flushScheduled = false;
    const batch = this.pending;
    this.pending = [];
    let values: unknown[];
    try {
      values = this.batchTx(batch.map((op) => op.inBatch));
    } catch {
      // Something threw (or the commit failed): the whole batch was rolled back, nothing of it is
      // written. Each one runs again in its own transaction, in the same order, so only what fails
      // on its own fails. (No savepoint per request on the common path: two statements fewer each.)
      for (const op of batch) {
        try {
          op.resolve(op.alone());
        } catch (error) {
          op.reject(error);
        }
      }
      this.checkpointer?.afterCommit();
      return;
    }
    batch.forEach((op, i) => op.resolve(values[i]));
    this.checkpointer?.afterCommit();
  }

  async migrate(): Promise<void> {
    migrateSqlite(this.db);
    // SQLite opens a file it may not write (a volume first written by another user) read-only,
    // silently: the start would succeed and every request fail. A write, rolled back, says so now.
    this.db.exec('BEGIN IMMEDIATE');
    try {
      this.db.exec('CREATE TABLE tollgate_write_check (x); DROP TABLE tollgate_write_check');
    } finally {
      this.db.exec('ROLLBACK');
    }
  }

  async ping(): Promise<void> {
    this.file?.check(true);
    this.db.prepare('SELECT 1').get();
  }

  async close(): Promise<void> {
    if (this.pending.length > 0) this.flush();
    await this.checkpointer?.close();
    if (this.db.open) this.db.close();
    this.owner?.release();
  }

  async admit(r: Reservation): Promise<AdmitResult> {
    this.file?.check();
    return this.grouped(() => this.admitLocked(r), () => this.admitTx(r));
  }

  async settle(id: string, s: Settlement, head?: ConversationHead): Promise<MonthAfterSettle | null> {
    const build = (row: OpenRow) => fromSettlement(row, s);
    return this.grouped(() => this.settleAndHead(id, build, head), () => this.settleTx(id, build, head));
  }

  async recoverStale(olderThanMs: number, now: number): Promise<number> {
    return this.recoverRows(this.q.staleRows.all({ before: now - olderThanMs }) as { id: string }[], now);
  }

  async recoverOpen(now: number): Promise<number> {
    return this.recoverRows(this.q.openRows.all() as { id: string }[], now);
  }

  private recoverRows(ids: readonly { id: string }[], now: number): number {
    let recovered = 0;
    // One transaction per row: a long recovery never holds the write lock for long.
    for (const { id } of ids) {
      if (this.settleTx(id, (row) => recoveredSettlement(row, now))) recovered++;
    }
    return recovered;
  }

  async keepAlive(ids: readonly string[], now: number): Promise<void> {
    if (ids.length > 0) this.q.keepAlive.run({ now, ids: JSON.stringify(ids) });
  }

  private money(id: string): ConversationRecord | undefined {
    return this.q.getConversation.get(id) as ConversationRecord | undefined;
  }

  private admitLocked(r: Reservation): AdmitResult {
    // Read, check, and only then write: a refusal leaves the ledger as it found it (SPEC §2.4) —
    // no conversation, parent link or owner claimed, no run started (its clock would run from the
    // refusal). Nothing is locked row by row: the transaction holds the file's write lock from
    // BEGIN IMMEDIATE, so rows that do not exist yet cannot appear between the read and the write.
    const own = this.money(r.conversation);
    // The first parent a conversation was admitted with holds, whatever the request names; the
    // conversations above it are read along their parent links as they are now (ADR 0018).
    const read = new Map<string, ConversationRecord | undefined>();
    const record = (id: string) => {
      if (!read.has(id)) read.set(id, this.money(id));
      return read.get(id);
    };
    const family = familyNow(r, own?.parent ?? null, (id) => record(id)?.parent ?? null);
    const run = this.q.getRun.get(r.run) as { budget_tokens: number | null; used_tokens: number } | undefined;
    const month = this.q.getMonth.get(r.tenant, r.month) as
      | { spent_usd: number; reserved_usd: number }
      | undefined;
    const tenant = this.q.getTenant.get(r.tenant) as { monthly_budget_usd: number | null } | undefined;
    const verdict = checkAdmission(r, {
      // A run's first request brings its budget.
      budgetTokens: run ? run.budget_tokens : r.runBudgetTokens,
      usedTokens: run?.used_tokens ?? 0,
      conversation: own ?? NO_MONEY,
      ancestors: family.ancestors.map((id) => record(id) ?? NO_MONEY),
      tooDeep: family.tooDeep,
      monthlyBudgetUsd: tenant?.monthly_budget_usd ?? null,
      month: { spentUsd: month?.spent_usd ?? 0, reservedUsd: month?.reserved_usd ?? 0 },
    });
    if (!verdict.ok) return verdict;

    // Admitted: each statement creates its row or adds to it.
    const w = r.worstCaseUsd;
    this.q.reserveRun.run({
      id: r.run,
      conversation: r.conversation,
      started_at: r.time,
      budget_tokens: r.runBudgetTokens,
      tokens: reservedTokens(r),
    });
    this.q.insertRow.run(reservationColumns(r, family.ancestors));
    const parent = family.ancestors[0] ?? null;
    this.q.reserveConversation.run({ id: r.conversation, tenant: r.tenant, parent, reserved: w ?? 0 });
    for (const id of family.ancestors) this.q.reserveParent.run({ id, tenant: r.tenant, reserved: w ?? 0 });
    if (w !== null) this.q.reserveMonth.run(r.tenant, r.month, w);
    return { ok: true };
  }

  private settleAndHead(id: string, build: (row: OpenRow) => SettleValues, head?: ConversationHead): MonthAfterSettle | null {
    const settled = this.settleLocked(id, build);
    if (head) this.writeHead(head);
    return settled;
  }

  /** Settles one open row; null when it was already settled (settling twice is a no-op). */
  private settleLocked(id: string, build: (row: OpenRow) => SettleValues): MonthAfterSettle | null {
    const row = this.q.getOpenRow.get(id) as OpenRow | undefined;
    if (!row || row.state !== 'reserved') return null;
    const v = build(row);
    const w = row.worst_case_usd ?? 0;
    const cost = v.costUsd ?? 0;
    const turn = countsAsTurn(v);
    // A turn of unknown cost adds nothing to the sums, and 1 to the counters that say so.
    const unpriced = isUnpricedTurn(v) ? 1 : 0;
    this.q.addRunTokens.run(-v.refundTokens, row.run);
    this.q.settleConversation.run({
      id: row.conversation,
      release: w,
      cost,
      saved: v.savedUsd ?? 0,
      turn: turn ? 1 : 0,
      plan_turn: turn && v.billing === 'plan' ? 1 : 0,
      plan_work: v.planWorkUsd ?? 0,
      unpriced,
    });
    if (turn) this.q.addModelTurn.run({ conversation: row.conversation, model: row.model, cost, unpriced });
    // The conversations above, as admission reserved on them: their tasks_usd (ADR 0018).
    for (const ancestor of ancestorsOfRow(row)) this.q.settleParent.run({ id: ancestor, release: w, cost, unpriced });
    this.q.ensureMonth.run(row.tenant, row.month);
    const month = this.q.settleMonth.get({ tenant: row.tenant, month: row.month, release: w, cost, unpriced }) as { spent_usd: number };
    this.q.settleRow.run({ id, ...settlementColumns(v, (b) => (b ? 1 : 0)) });
    const tenant = this.q.getTenant.get(row.tenant) as { monthly_budget_usd: number | null } | undefined;
    return { spentUsd: month.spent_usd, monthlyBudgetUsd: tenant?.monthly_budget_usd ?? null };
  }

  async getHead(conversation: string): Promise<ConversationHead | null> {
    // A head this process wrote or read keeps its chain and prefix here: only the short columns
    // are read, and the long ones are used if the row still ends on the same hash at the same time
    // (another process on the file may have moved it on).
    const known = this.headArrays.get(conversation);
    if (known !== undefined) {
      const h = this.q.getHeadScalars.get(conversation) as HeadScalars & { last_hash: string } | undefined;
      if (!h) return null;
      if (h.time === known.time && h.last_hash === known.lastHash) return headOf(h, known);
    }
    const h = this.q.getHead.get(conversation) as HeadRecord | undefined;
    if (!h) return null;
    const arrays: HeadArrays = {
      chain: decodeChain(h.chain),
      prefix: JSON.parse(h.prefix) as number[],
      prefixDigests: h.prefix_digests === null ? null : decodeChain(h.prefix_digests),
    };
    this.rememberHead(conversation, arrays, h.time);
    return headOf(h, arrays);
  }

  private rememberHead(conversation: string, { chain, prefix, prefixDigests }: HeadArrays, time: number): void {
    const old = this.headArrays.get(conversation);
    if (old) {
      this.headArrays.delete(conversation);
      this.headMessages -= old.chain.length;
    }
    // A head longer than the whole budget is not kept, and does not push the others out.
    if (chain.length > HEAD_MESSAGES_KEPT) return;
    this.headArrays.set(conversation, { chain, prefix, prefixDigests, time, lastHash: chain.length > 0 ? chain[chain.length - 1]! : '' });
    this.headMessages += chain.length;
    // The least recently used go first.
    while (this.headArrays.size > HEAD_ARRAYS_KEPT || this.headMessages > HEAD_MESSAGES_KEPT) {
      const [oldest, kept] = this.headArrays.entries().next().value!;
      this.headArrays.delete(oldest);
      this.headMessages -= kept.chain.length;
    }
  }

  /** What the head cache holds now: conversations, and their messages together. */
  headCacheSize(): { conversations: number; messages: number } {
    return { conversations: this.headArrays.size, messages: this.headMessages };
  }

  async putHead(h: ConversationHead): Promise<void> {
    this.inTx(() => this.writeHead(h));
  }

  private writeHead(h: ConversationHead): void {
    this.rememberHead(h.conversation, h, h.time);
    const lastHash = h.chain.length > 0 ? h.chain[h.chain.length - 1]! : '';
    if (lastHash !== '') {
      this.q.putChainEnd.run({ tenant: h.tenant, last_hash: lastHash, key_id: h.keyId ?? '', conversation: h.conversation, time: h.time });
      if (this.chainEndTimes !== null) this.newChainEnds.push({ hash: lastHash, time: h.time });
    }
    this.q.putHead.run({
      conversation: h.conversation,
      key_id: h.keyId,
      tenant: h.tenant,
      model: h.model,
      tool_hash: h.toolHash,
      server_id: h.serverId,
      chain: encodeChain(h.chain),
      prefix: JSON.stringify(h.prefix),
      prefix_digests: h.prefixDigests === null ? null : encodeChain(h.prefixDigests),
      last_hash: lastHash,
      last_cost_usd: h.lastCostUsd,
      last_prompt_tokens: h.lastPromptTokens,
      last_output_tokens: h.lastOutputTokens,
      time: h.time,
    });
  }

  async findConversationByChain(keyId: string | null, tenant: string, chain: string[]): Promise<string | null> {
    if (chain.length === 0) return null;
    const ask = (hashes: string[]) => {
      const args = { tenant, hashes: JSON.stringify(hashes) };
      return (keyId === null ? this.q.findByTenantChain.get(args) : this.q.findByKeyChain.get({ key: keyId, ...args })) as
        | { conversation: string; time: number }
        | undefined;
    };
    const times = this.chainEndTimes;
    if (times === null) return ask(chain)?.conversation ?? null;
    // Every earlier turn of a long conversation ended somewhere on its chain: asking for them all is
    // one index probe per turn. The fingerprints know, for each hash, a time at least the latest
    // written there, so the hashes are asked for one at a time, latest first, until the most recent
    // request found is at least as recent as any hash not yet asked could be: as a rule, one query
    // (and none for a chain no earlier request's list ended on).
    const candidates: Array<{ hash: string; time: number }> = [];
    for (const hash of chain) {
      const time = times.timeOf(hash);
      if (time !== null) candidates.push({ hash, time });
    }
    candidates.sort((a, b) => b.time - a.time);
    let best: { conversation: string; time: number } | undefined;
    for (const c of candidates) {
      if (best !== undefined && best.time >= c.time) break;
      const hit = ask([c.hash]);
      if (hit !== undefined && (best === undefined || hit.time > best.time)) best = hit;
    }
    return best?.conversation ?? null;
  }

  async getRun(run: string): Promise<RunState | null> {
    const r = this.q.getRunState.get(run) as
      | { id: string; conversation: string; started_at: number; budget_tokens: number | null; used_tokens: number }
      | undefined;
    if (!r) return null;
    return {
      run: r.id,
      conversation: r.conversation,
      startedAt: r.started_at,
      budgetTokens: r.budget_tokens,
      usedTokens: r.used_tokens,
    };
  }

  async conversationSpend(conversation: string): Promise<ConversationSpend | null> {
    const c = this.money(conversation);
    if (!c) return null;
    const models = this.q.modelSpend.all(conversation) as { model: string; turns: number; spent_usd: number; unpriced_turns: number }[];
    const byModel: ConversationSpend['byModel'] = {};
    for (const m of models) byModel[m.model] = { turns: m.turns, spentUsd: m.spent_usd, unpricedTurns: m.unpriced_turns };
    return {
      conversation: c.id,
      // A cap set before the first request leaves the owner unknown: it matches no tenant.
      tenant: c.tenant ?? '',
      parent: c.parent,
      spentUsd: c.spentUsd,
      savedUsd: c.saved_usd,
      planTurns: c.plan_turns,
      planWorkUsd: c.plan_work_usd,
      tasksUsd: c.tasksUsd,
      unpricedTurns: c.unpriced_turns,
      tasksUnpricedTurns: c.tasks_unpriced_turns,
      // Includes in-flight reservations of the conversations below: they draw on its cap too.
      reservedUsd: c.reservedUsd,
      turns: c.turns,
      capUsd: c.capUsd,
      roomCeilingMtok: c.roomCeilingMtok,
      byModel,
    };
  }

  async setConversationCap(conversation: string, tenant: string | null, capUsd: number | null): Promise<string | null> {
    // One synchronous step: no request of this process can claim the row in between.
    this.q.setCap.run({ id: conversation, tenant, cap: capUsd });
    return (this.q.getOwner.get(conversation) as { tenant: string | null } | undefined)?.tenant ?? null;
  }

  async offerCapRoom(conversation: string, ceilingMtok: number, capUsd: number): Promise<void> {
    this.q.offerCapRoom.run({ id: conversation, ceiling: ceilingMtok, cap: capUsd });
  }

  async tenantMonth(tenant: string, month: string): Promise<TenantMonthSpend> {
    const m = this.q.getMonth.get(tenant, month) as { spent_usd: number; reserved_usd: number; unpriced_turns: number } | undefined;
    return { spentUsd: m?.spent_usd ?? 0, reservedUsd: m?.reserved_usd ?? 0, unpricedTurns: m?.unpriced_turns ?? 0 };
  }

  async claimBudgetNearNotice(tenant: string, month: string): Promise<boolean> {
    // The primary key makes the claim atomic: only one insert can ever succeed.
    return this.q.claimNotice.run(tenant, month).changes === 1;
  }

  async createTenant(t: TenantRecord): Promise<boolean> {
    return this.q.createTenant.run(t.id, t.monthlyBudgetUsd).changes === 1;
  }

  async getTenant(id: string): Promise<TenantRecord | null> {
    const t = this.q.getTenant.get(id) as { id: string; monthly_budget_usd: number | null } | undefined;
    return t ? { id: t.id, monthlyBudgetUsd: t.monthly_budget_usd } : null;
  }

  async setTenantBudget(id: string, monthlyBudgetUsd: number | null): Promise<boolean> {
    return this.q.setTenantBudget.run(monthlyBudgetUsd, id).changes === 1;
  }

  async createKey(k: KeyRecord & { hash: string }): Promise<void> {
    this.q.createKey.run(k.id, k.tenant, k.name, k.hash);
  }

  async deleteKey(id: string): Promise<boolean> {
    return this.q.deleteKey.run(id).changes === 1;
  }

  async findKeyByHash(hash: string): Promise<KeyRecord | null> {
    const k = this.q.findKey.get(hash) as KeyRecord | undefined;
    return k ? { id: k.id, tenant: k.tenant, name: k.name } : null;
  }

  async hasKeys(): Promise<boolean> {
    return this.q.anyKey.get() !== undefined;
  }

  async listTenants(): Promise<TenantRecord[]> {
    const rows = this.q.listTenants.all() as Array<{ id: string; monthly_budget_usd: number | null }>;
    return rows.map((t) => ({ id: t.id, monthlyBudgetUsd: t.monthly_budget_usd }));
  }

  async listKeys(tenant?: string): Promise<KeyRecord[]> {
    const rows = (tenant === undefined ? this.q.listKeys.all() : this.q.listTenantKeys.all(tenant)) as KeyRecord[];
    return rows.map((k) => ({ id: k.id, tenant: k.tenant, name: k.name }));
  }

  async pruneRows(untilMs: number, limit: number): Promise<number> {
    const deleted = this.q.pruneRows.run(untilMs, limit).changes;
    // Deletes fill the WAL as commits do: the worker checkpoints it, not this connection.
    this.checkpointer?.afterCommit();
    return deleted;
  }

  async pruneHistory(table: HistoryTable, untilMs: number, after: string, limit: number): Promise<{ deleted: number; next: string | null }> {
    if (table === 'chain_ends') {
      // Walked in primary-key order; the key to go on from is the last one seen, as JSON.
      const [t0, h0, k0] = after === '' ? ['', '', ''] : (JSON.parse(after) as [string, string, string]);
      const page = this.q.chainEndKeysAfter.all({ tenant: t0, last_hash: h0, key_id: k0, n: limit }) as [string, string, string][];
      if (page.length === 0) return { deleted: 0, next: null };
      const [t1, h1, k1] = page[page.length - 1]!;
      const deleted = this.q.pruneChainEnds.run({ t0, h0, k0, t1, h1, k1, until: untilMs }).changes;
      this.checkpointer?.afterCommit();
      return { deleted, next: page.length < limit ? null : JSON.stringify([t1, h1, k1]) };
    }
    const keys = (table === 'heads' ? this.q.headKeysAfter : this.q.runKeysAfter).all(after, limit) as string[];
    if (keys.length === 0) return { deleted: 0, next: null };
    const prune = table === 'heads' ? this.q.pruneHeads : this.q.pruneRuns;
    const deleted = prune.run({ keys: JSON.stringify(keys), until: untilMs }).changes;
    this.checkpointer?.afterCommit();
    // (A pruned head's hash stays among the fingerprints: its look-up then queries and finds nothing.)
    return { deleted, next: keys.length < limit ? null : keys[keys.length - 1]! };
  }

  async *exportRows(sinceMs: number | null, untilMs: number | null, by: ExportWindow = 'time'): AsyncIterable<LedgerRow> {
    // Keyset pages rather than one open cursor: between pages the connection is free for
    // admissions, and memory stays one page whatever the ledger's size.
    const column = by === 'settled' ? 'finished_at' : 'time';
    const statement = by === 'settled' ? this.q.exportSettledPage : this.q.exportPage;
    let after = { time: Number.MIN_SAFE_INTEGER, id: '' };
    const since = sinceMs ?? Number.MIN_SAFE_INTEGER;
    const until = untilMs ?? Number.MAX_SAFE_INTEGER;
    for (;;) {
      // The index is entered at the cursor's time, not at `since`: from `since`, every page walked
      // again over all the rows before it (a 1.5 M-row export took 453 s, its last pages 300 ms each).
      const page = statement.all({ since: Math.max(since, after.time), until, t: after.time, id: after.id, n: EXPORT_PAGE }) as Record<string, unknown>[];
      for (const rec of page) yield toLedgerRow(rec);
      if (page.length < EXPORT_PAGE) return;
      const last = page[page.length - 1];
      after = { time: Number(last[column]), id: String(last.id) };
    }
  }
}

/**
 * Creates the empty file at `path`, readable and writable by its owner alone. One already there is
 * left as it is; a folder that is missing or not writable is left for SQLite to report, as it does.
 */
function makeOwnerOnly(path: string): void {
  try {
    closeSync(openSync(path, 'wx', 0o600));
  } catch {
    // EEXIST, ENOENT, EACCES: SQLite opens (or refuses) the path itself next.
  }
}
