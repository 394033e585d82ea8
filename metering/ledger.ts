// The ledger: every request's reservation and settlement, the budgets they draw on, and the
// conversation state needed to charge the next request. One interface, two stores (SQLite for one
// machine, PostgreSQL for replicas sharing budgets — SPEC §9). Every method is async so that both
// stores fit; admission is a single atomic step in each store.

export type ModeName = 'normal' | 'final-answer';

/** What admission reserves: tokens against the run, worst-case money against caps and month. */
export interface Reservation {
  id: string;
  /** ms since the epoch */
  time: number;
  tenant: string;
  keyId: string | null;
  conversation: string;
  /**
   * The conversation named in `x-tollgate-parent`, whose cap this one shares — and the caps of
   * the conversations above it (ADR 0018).
   */
  parent: string | null;
  run: string;
  model: string;
  upstream: string;
  endpoint: string;
  mode: ModeName;
  /** Why final-answer mode was chosen (`rounds|tokens|time|patience`), else null. */
  finalReason: string | null;
  rows: number;
  promptTokens: number;
  countMethod: string;
  sharedPrefixTokens: number;
  /** Tokens of prompt charged: max(0, prompt − max(0, shared − 16)). */
  promptCharge: number;
  allowance: number;
  /** The run's budget in tokens; null when the token bound is off. */
  runBudgetTokens: number | null;
  /**
   * Tokens of the run the request must leave untouched: a tool round keeps the run's answer
   * reserve (SPEC §11); 0 otherwise. Checked in the same atomic step; not stored.
   */
  keepTokens?: number;
  /** Worst case in USD (whole prompt uncached + whole allowance, list price); null = not money. */
  worstCaseUsd: number | null;
  /**
   * How the upstream is billed, stored at admission so that a row a crash left open is recovered as
   * what it was: a local or plan turn costs no money (null: not known, as in rows written before).
   */
  billing?: 'local' | 'plan' | 'metered' | null;
  /**
   * Money of a cost nothing can bound beforehand: a metered model without a price, sent because the
   * operator allows unpriced models (`worstCaseUsd` null). It starts only while every money limit
   * over it still has room; its provider's figure then counts when it settles. Not stored.
   */
  costUnknown?: boolean;
  /**
   * Room past the conversation's own cap, USD: what a 402 at that cap offered with a cheaper
   * metered model (pricing/cheaper-models.ts `roomPastCapUsd`). Not stored.
   */
  capRoomUsd?: number;
  /** 'YYYY-MM' in UTC: the month the spend counts in. */
  month: string;
}

export type AdmitRefusal =
  | { ok: false; scope: 'run'; remainingTokens: number; neededTokens: number; limitTokens: number }
  /**
   * The request fits the run's budget but not beside the tokens it must keep (`keepTokens`):
   * requests of the same run admitted meanwhile took the room its plan counted on. Planned again,
   * it goes as the run's final answer (server/pipeline/admit.ts).
   */
  | { ok: false; scope: 'keep'; remainingTokens: number; neededTokens: number; keepTokens: number }
  | {
      ok: false;
      scope: 'conversation' | 'parent' | 'monthly';
      /** Settled spend counted against the limit (a conversation's includes its tree's). */
      spentUsd: number;
      /** Worst cases reserved by requests still in flight, counted against it too. */
      reservedUsd: number;
      limitUsd: number;
      /** The request's worst case; null when its cost is unknown (`costUnknown`). */
      neededUsd: number | null;
      /** The room past the cap the request was checked with (`capRoomUsd`), when it had some. */
      roomUsd?: number;
    }
  /** More than `limitAncestors` conversations above this one (parent, its parent, …): ADR 0018. */
  | { ok: false; scope: 'nesting'; limitAncestors: number }
  /** The conversation, or one above it, belongs to another tenant (ids are global). */
  | { ok: false; scope: 'owner'; conversation: string };

export type AdmitResult = { ok: true } | AdmitRefusal;

export interface UpstreamFigures {
  promptTokens: number | null;
  completionTokens: number | null;
  cachedTokens: number | null;
  /** llama.cpp `timings.prompt_n`: prompt tokens the server really evaluated. */
  promptN: number | null;
  /** llama.cpp `timings.cache_n`: prompt tokens it reused from its cache. */
  cacheN: number | null;
}

export interface Settlement {
  /** HTTP status the client got (or 499 for a client that went away). */
  status: number;
  generatedTokens: number;
  outputMethod: string;
  /** promptCharge + generated */
  chargeTokens: number;
  /** allowance − generated (never negative) */
  refundTokens: number;
  costUsd: number | null;
  savedUsd: number | null;
  /** List-price value of a `plan` turn's work ("of work"), else null. */
  planWorkUsd: number | null;
  /**
   * Where `costUsd` came from: `provider` (its own figure), `list-price`, `local`, `plan`,
   * `unpriced` (null cost), `refunded` (an upstream that failed before any output).
   */
  costSource?: string | null;
  /** The price used, when one was (`override:<file>`, `genai-prices@<version>`), and its date. */
  priceSource?: string | null;
  priceDate?: string | null;
  billing: 'local' | 'plan' | 'metered';
  upstreamFigures: UpstreamFigures;
  fallback: boolean;
  finishedAt: number;
}

/** A tenant's month right after a settlement, read in its transaction (for the budget-near notice). */
export interface MonthAfterSettle {
  spentUsd: number;
  monthlyBudgetUsd: number | null;
}

/** Conversation state kept to charge and infer the next request (shared by replicas). */
export interface ConversationHead {
  conversation: string;
  keyId: string | null;
  tenant: string;
  model: string;
  /** Hash of tools + tool_choice ('' when none offered). */
  toolHash: string;
  /**
   * The server that read the prefix and may hold it cached (the upstream's `serverId`: its kind
   * and base URL). Null in a head an older build wrote: taken as the same server (ADR 0004).
   */
  serverId: string | null;
  /** Prefix-chain hashes: chain[i] identifies messages[0..i] (i.e. i+1 leading messages). */
  chain: string[];
  /** prefix[k] = tokens of the rendered leading k messages (see ChatCount.prefix). */
  prefix: number[];
  /**
   * Digests of the token ids counted in each `prefix[k]` (ChatCount.prefixDigests), where the
   * counter saw the ids (llama.cpp); null otherwise, and in a head an older build wrote.
   */
  prefixDigests: string[] | null;
  /** Cost of the last reply, for the "pricier" notice. */
  lastCostUsd: number | null;
  lastPromptTokens: number;
  lastOutputTokens: number;
  time: number;
}

export interface RunState {
  run: string;
  conversation: string;
  startedAt: number;
  budgetTokens: number | null;
  /** Reserved-and-not-refunded tokens: in-flight reservations plus settled charges. */
  usedTokens: number;
}

export interface ConversationSpend {
  conversation: string;
  tenant: string;
  parent: string | null;
  spentUsd: number;
  savedUsd: number;
  planTurns: number;
  /** List-price value of the plan turns' work ("of work", not money spent). */
  planWorkUsd: number;
  /** What the conversations below this one spent: children, their children, … (ADR 0018). */
  tasksUsd: number;
  /**
   * Turns of this conversation whose cost is unknown (settled with `costUsd` null: a metered model
   * without a price). `spentUsd` sums the known costs only; this says how many it leaves out.
   */
  unpricedTurns: number;
  /** The same for the conversations below, beside `tasksUsd`. */
  tasksUnpricedTurns: number;
  /** Worst-case USD reserved by this conversation's requests still in flight, and those below's. */
  reservedUsd: number;
  turns: number;
  capUsd: number | null;
  /**
   * The room a 402 at this conversation's own cap offered (ADR 0006): the dearest blended price
   * (USD per million input + output tokens) a model may have to get it. Null until such a refusal.
   */
  roomCeilingMtok: number | null;
  byModel: Record<string, { turns: number; spentUsd: number; unpricedTurns: number }>;
}

/** A tenant's month: settled spend, worst cases still reserved, and turns of unknown cost. */
export interface TenantMonthSpend {
  /** The known costs of the month's turns. */
  spentUsd: number;
  reservedUsd: number;
  /** Turns of the month whose cost is unknown (as `ConversationSpend.unpricedTurns`). */
  unpricedTurns: number;
}

export interface TenantRecord {
  id: string;
  monthlyBudgetUsd: number | null;
}

export interface KeyRecord {
  id: string;
  tenant: string;
  name: string | null;
}

export interface LedgerRow {
  id: string;
  time: string;
  tenant: string;
  key_id: string | null;
  conversation: string;
  parent: string | null;
  run: string;
  model: string;
  upstream: string;
  endpoint: string;
  mode: ModeName;
  final_reason: string | null;
  status: number | null;
  state: 'reserved' | 'settled' | 'recovered';
  rows: number;
  prompt_tokens: number;
  count_method: string;
  shared_prefix_tokens: number;
  prompt_charge: number;
  allowance: number;
  reserved_tokens: number;
  generated_tokens: number | null;
  output_method: string | null;
  charge_tokens: number | null;
  refund_tokens: number | null;
  worst_case_usd: number | null;
  cost_usd: number | null;
  saved_usd: number | null;
  /** A plan model's turn: the list-price value of its work (not money spent); null otherwise or unknown. */
  plan_work_usd: number | null;
  /** Where cost_usd came from (Settlement.costSource; `worst-case` for a recovered row). */
  cost_source: string | null;
  price_source: string | null;
  price_date: string | null;
  billing: string | null;
  upstream_prompt_tokens: number | null;
  upstream_completion_tokens: number | null;
  upstream_cached_tokens: number | null;
  upstream_prompt_n: number | null;
  upstream_cache_n: number | null;
  fallback: boolean;
  finished_at: string | null;
}

/** Which of a row's times an export's window is on (`Ledger.exportRows`). */
export type ExportWindow = 'time' | 'settled';

export interface Ledger {
  readonly kind: 'sqlite' | 'postgres';
  /** Where the ledger is, for a log line: the SQLite file, or PostgreSQL's host, database and schema (no credentials). */
  readonly location: string;
  /** This process found no ledger there and made a new, empty one (known once migrated). */
  readonly createdNow: boolean;
  /** Apply versioned migrations (safe when two replicas start at once). */
  migrate(): Promise<void>;
  /**
   * Settle reservations left open by a crash: charged in full, flagged, finished at `now` (or at
   * the row's own time, when later). A reservation counts as left when it was made, and last said
   * alive, more than `olderThanMs` ago. Ago by which clock: on SQLite (one process) `now`'s; on
   * PostgreSQL the database's own, for every replica alike — replicas' clocks differ, and one
   * ahead would take another's live requests for a crash (ADR 0011) — so there `now` only stamps
   * the settlement. Returns how many.
   */
  recoverStale(olderThanMs: number, now: number): Promise<number>;
  /**
   * Settle every reservation still open, whatever its time says, as recoverStale does. Only for a
   * ledger no other process is using — SQLite at start (one process per file, ADR 0016), where an
   * open row can only be a crash's, even one stamped later than `now` (a restart with the clock
   * set back). Never where replicas share the ledger: it would take their requests in flight.
   * Returns how many.
   */
  recoverOpen(now: number): Promise<number>;
  /**
   * Say that these open reservations are still in flight, as of `now` on SQLite; on PostgreSQL as
   * of the database's time, and `now` is not used (see recoverStale).
   */
  keepAlive(ids: readonly string[], now: number): Promise<void>;
  ping(): Promise<void>;
  close(): Promise<void>;

  // Admission and settlement — each one atomic.
  admit(r: Reservation): Promise<AdmitResult>;
  /**
   * Settles a reservation; with `head`, records the conversation's new head in the same commit.
   * Returns the tenant's month as the settlement left it (null when the row was already settled).
   */
  settle(id: string, s: Settlement, head?: ConversationHead): Promise<MonthAfterSettle | null>;

  // Conversation state.
  getHead(conversation: string): Promise<ConversationHead | null>;
  putHead(head: ConversationHead): Promise<void>;
  /** Most recent conversation of this key (or tenant, with no key) whose last message list hashes to one of `chain`. */
  findConversationByChain(keyId: string | null, tenant: string, chain: string[]): Promise<string | null>;
  getRun(run: string): Promise<RunState | null>;

  // Money.
  conversationSpend(conversation: string): Promise<ConversationSpend | null>;
  /**
   * Sets a conversation's cap (made if need be), and its owner when it has none. With a `tenant`
   * other than the owner it already has, nothing is written. Returns the owner afterwards.
   */
  setConversationCap(conversation: string, tenant: string | null, capUsd: number | null): Promise<string | null>;
  /**
   * Records that a 402 at the conversation's own cap offered room past it to models priced at
   * `ceilingMtok` or less (the dearest offer stands). Setting the cap again clears it. Written only
   * while the cap is still `capUsd`, the cap the refusal was made at: an operator who sets another
   * while the 402 is being built has withdrawn the offer before it is recorded.
   */
  offerCapRoom(conversation: string, ceilingMtok: number, capUsd: number): Promise<void>;
  tenantMonth(tenant: string, month: string): Promise<TenantMonthSpend>;
  /** True exactly once per tenant and month: the caller sends `budget-near`. */
  claimBudgetNearNotice(tenant: string, month: string): Promise<boolean>;

  // Tenants and keys (operator API). Keys are stored as SHA-256 hashes only.
  /**
   * Makes the tenant with this budget unless it exists; true when it was made. One step, so two
   * operator calls at once cannot write back a budget one of them read before the other changed it.
   */
  createTenant(t: TenantRecord): Promise<boolean>;
  getTenant(id: string): Promise<TenantRecord | null>;
  setTenantBudget(id: string, monthlyBudgetUsd: number | null): Promise<boolean>;
  createKey(k: KeyRecord & { hash: string }): Promise<void>;
  deleteKey(id: string): Promise<boolean>;
  findKeyByHash(hash: string): Promise<KeyRecord | null>;
  /** Whether the operator API has made any key (one made and deleted is none). */
  hasKeys(): Promise<boolean>;
  /** Every tenant, by id. */
  listTenants(): Promise<TenantRecord[]>;
  /** The keys the operator API made (not their hashes), by tenant then id; one tenant's when given. */
  listKeys(tenant?: string): Promise<KeyRecord[]>;

  // Export.
  /**
   * The rows whose time falls in [since, until), in its order: by default the time each request
   * began (every row, open ones as they stand now); with `'settled'`, the time it was settled
   * (settled and recovered rows only) — the window a billing job can read back to back without
   * missing or repeating a settled row.
   */
  exportRows(sinceMs: number | null, untilMs: number | null, by?: ExportWindow): AsyncIterable<LedgerRow>;
  /**
   * Retention: delete up to `limit` rows that finished (were settled or recovered) before
   * `untilMs` — the time the `settled` export is on — the first finished first; returns how many
   * went. Open reservations are never deleted, and no budget, spend or cap reads these rows (they
   * keep their own counters), so nothing but the export changes.
   */
  pruneRows(untilMs: number, limit: number): Promise<number>;
  /**
   * Retention of what the rows leave behind: conversation heads last moved, or runs started,
   * before `untilMs`. One call looks at up to `limit` keys after `after` (key order; '' for the
   * first) and deletes those that qualify; it returns how many went and the key to go on from
   * (null at the table's end). A head of a conversation with a cap or a parent is kept (with it
   * gone, a request without the conversation header would start a new conversation, outside the
   * cap); so is a run with a reservation still open, or whose conversation had a request since
   * `untilMs` (its run may be going on: runs record when they started, not when last used).
   */
  pruneHistory(table: HistoryTable, untilMs: number, after: string, limit: number): Promise<{ deleted: number; next: string | null }>;
}

export type HistoryTable = 'heads' | 'chain_ends' | 'runs';
