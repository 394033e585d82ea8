// Configuration: one JSON file (TOLLGATE_CONFIG), validated once at start and frozen (SPEC §8).
// A bad field is named in the error, e.g. `upstreams[1].baseUrl: must be a URL`.

import { existsSync, readFileSync } from 'node:fs';
import { dirname, isAbsolute, resolve } from 'node:path';
import { Reader, ConfigError } from './config-reader.js';
import { DEFAULT_PREFIX_MEMO_BYTES } from '../metering/prefix-memo.js';

export type UpstreamKind = 'openai' | 'llamacpp';
export type Billing = 'local' | 'plan' | 'metered';

export interface UpstreamConfig {
  name: string;
  kind: UpstreamKind;
  baseUrl: string;
  /** Name of the environment variable that holds the upstream's API key. */
  apiKeyEnv: string | null;
  /** Model names or glob patterns (`*`, `gpt-*`) this upstream serves. */
  models: string[];
  billing: Billing;
  /** Overrides the window learnt from the server (llama.cpp `/props`). */
  contextWindow: number | null;
  /**
   * The allowance of a request to this upstream that names none; null: `defaults.maxTokens`.
   * Reasoning models (o-series, gpt-5), whose hidden reasoning counts against it, want more.
   */
  maxTokens: number | null;
  /** False for a server that keeps no prompt cache: every request is then charged in full. */
  prefixCache: boolean;
  /** A previous request older than this shares nothing (providers drop cached prefixes). */
  prefixCacheTtlSeconds: number;
  /** Whether the upstream's models can take tools (ordering of cheaper-model choices). */
  tools: boolean;
  timeoutMs: number;
  connections: number;
  /**
   * The field that carries the allowance to an `openai`-kind upstream, whatever the client named;
   * null: the client's field, else one chosen by the server (server/pipeline/forward.ts).
   */
  allowanceField: 'max_tokens' | 'max_completion_tokens' | null;
}

export interface RunBoundsConfig {
  tokenBudget: number | null;
  maxToolRounds: number | null;
  timeBudgetSeconds: number | null;
  patience: number | null;
  /** Null when not configured: 1,024 (metering/runs/bounds.ts). */
  answerReserveTokens: number | null;
}

export interface RunsConfig extends RunBoundsConfig {
  writeTools: string[];
}

/** A budget as the config gives it: a figure, `null` (none: removes one set before), or not given (the ledger's stays). */
export type ConfiguredBudget = number | null | undefined;

export interface KeyConfig {
  key: string;
  tenant: string;
  monthlyBudgetUsd: ConfiguredBudget;
  runs: Partial<RunBoundsConfig>;
}

export interface TenantConfig {
  id: string;
  monthlyBudgetUsd: ConfiguredBudget;
  runs: Partial<RunBoundsConfig>;
}

export type StoreConfig =
  | { kind: 'sqlite'; path: string; synchronous: 'NORMAL' | 'FULL' }
  | {
      kind: 'postgres';
      url: string;
      schema: string;
      /** A reservation no replica has said alive for this long was left by one that went away (ADR 0011). */
      recoverAfterSeconds: number;
    };

export interface Config {
  store: StoreConfig;
  upstreams: UpstreamConfig[];
  limits: {
    maxRows: number;
    maxRowTokens: number;
    maxRequestTokens: number;
    maxBodyBytes: number;
    /** Model requests one key may have in flight at once, on this process (ADR 0023); null: no bound. */
    maxInFlightPerKey: number | null;
  };
  defaults: { maxTokens: number };
  runs: RunsConfig;
  auth: { keys: KeyConfig[] };
  tenants: TenantConfig[];
  prices: { overrides: string | null; unpriced: 'refuse' | 'allow' };
  metrics: { token: string | null };
  logging: { level: string; prompts: boolean };
  tokenCache: { maxBytes: number; workers: number; prefixMemoBytes: number };
}

export const DEFAULT_LIMITS = Object.freeze({
  maxRows: 1024,
  maxRowTokens: 36_864,
  maxRequestTokens: 1_048_576,
  maxBodyBytes: 33_554_432,
});

export const DEFAULT_RUNS: RunsConfig = Object.freeze({
  tokenBudget: 65_536,
  maxToolRounds: 12,
  timeBudgetSeconds: 300,
  patience: 3,
  answerReserveTokens: null,
  writeTools: [],
});

/** Tenant ids, in the config and in the operator API alike. */
export const TENANT_ID = /^[A-Za-z0-9._:@-]{1,128}$/;
/** What TENANT_ID asks, for the errors that refuse an id. */
export const TENANT_ID_RULE = 'must be 1–128 letters, digits or . _ : @ -';

/** `monthlyBudgetUsd` on a key or tenant: absent is "the config says nothing", null is "no budget". */
function budgetOf(r: Reader): ConfiguredBudget {
  return r.has('monthlyBudgetUsd') ? (r.numOrNull('monthlyBudgetUsd', null, 0) ?? null) : undefined;
}

function readRunBounds(r: Reader, partial: boolean): Partial<RunBoundsConfig> {
  const out: Partial<RunBoundsConfig> = {};
  const pick = <K extends keyof RunBoundsConfig>(k: K, v: RunBoundsConfig[K] | undefined) => {
    if (v !== undefined) out[k] = v;
  };
  const d = partial ? undefined : DEFAULT_RUNS;
  // null turns a bound off (SPEC §5: each bound can be turned off).
  pick('tokenBudget', r.intOrNull('tokenBudget', d?.tokenBudget, 1, 1 << 30));
  pick('maxToolRounds', r.intOrNull('maxToolRounds', d?.maxToolRounds, 1, 64));
  pick('timeBudgetSeconds', r.intOrNull('timeBudgetSeconds', d?.timeBudgetSeconds, 1, 86_400));
  pick('patience', r.intOrNull('patience', d?.patience, 1, 100));
  const reserve = r.int('answerReserveTokens', undefined, 0, 1 << 20);
  if (reserve !== undefined) out.answerReserveTokens = reserve;
  else if (d) out.answerReserveTokens = d.answerReserveTokens;
  return out;
}

function readUpstream(r: Reader, names: Set<string>): UpstreamConfig {
  const kind = r.oneOf('kind', ['openai', 'llamacpp'] as const, undefined);
  const name = r.str('name', undefined)!;
  if (names.has(name)) r.fail('name', `duplicate upstream name "${name}"`);
  names.add(name);
  return {
    name,
    kind: kind!,
    baseUrl: r.url('baseUrl', undefined)!,
    apiKeyEnv: r.strOrNull('apiKeyEnv', null) ?? null,
    models: r.strList('models', ['*'], true)!,
    billing: r.oneOf('billing', ['local', 'plan', 'metered'] as const, kind === 'llamacpp' ? 'local' : 'metered')!,
    contextWindow: r.intOrNull('contextWindow', null, 1, 1 << 26) ?? null,
    maxTokens: r.intOrNull('maxTokens', null, 1, 1 << 24) ?? null,
    prefixCache: r.bool('prefixCache', true)!,
    prefixCacheTtlSeconds: r.int('prefixCacheTtlSeconds', 300, 0, 86_400 * 30)!,
    tools: r.bool('tools', true)!,
    timeoutMs: r.int('timeoutMs', 600_000, 1, 3_600_000)!,
    connections: r.int('connections', 128, 1, 4096)!,
    allowanceField: readAllowanceField(r, kind!),
  };
}

/** The allowance a request that names none gets on `upstream`, and the setting it comes from (for messages). */
export function defaultAllowance(config: Config, upstream: UpstreamConfig): { tokens: number; setting: string } {
  if (upstream.maxTokens !== null) return { tokens: upstream.maxTokens, setting: `upstream "${upstream.name}" maxTokens` };
  return { tokens: config.defaults.maxTokens, setting: 'defaults.maxTokens' };
}

function readAllowanceField(r: Reader, kind: UpstreamKind): UpstreamConfig['allowanceField'] {
  if (!r.has('allowanceField')) return null;
  const field = r.oneOf('allowanceField', ['max_tokens', 'max_completion_tokens'] as const, undefined)!;
  // llama.cpp reads max_tokens (or n_predict) and nothing else.
  if (kind === 'llamacpp' && field === 'max_completion_tokens') r.fail('allowanceField', 'a llama.cpp server reads only max_tokens');
  return field;
}

/** The shortest `store.recoverAfterSeconds`: replicas say their requests alive five times within it (server/app.ts). */
export const MIN_RECOVER_AFTER_SECONDS = 60;

function readStore(r: Reader, env: NodeJS.ProcessEnv): StoreConfig {
  const kind = r.oneOf('kind', ['sqlite', 'postgres'] as const, 'sqlite')!;
  if (kind === 'postgres') {
    const url = r.strOrNull('url', env.DATABASE_URL || null);
    if (!url) r.fail('url', 'must be a postgres:// URL (or set DATABASE_URL)');
    if (!isPostgresUrl(url)) {
      const from = r.has('url') ? '' : ' (from DATABASE_URL)';
      r.fail('url', `must be a postgres:// URL such as postgres://user:password@host:5432/db (or socket:, or a socket directory)${from}`);
    }
    const schema = r.str('schema', 'public')!;
    if (!/^[a-z_][a-z0-9_]{0,62}$/.test(schema)) r.fail('schema', 'must be a lower-case SQL identifier');
    const recoverAfterSeconds = r.int('recoverAfterSeconds', 600, MIN_RECOVER_AFTER_SECONDS, 86_400)!;
    return { kind, url: url!, schema, recoverAfterSeconds };
  }
  if (r.has('recoverAfterSeconds')) r.fail('recoverAfterSeconds', 'applies to a postgres store only: SQLite recovers every open reservation at start');
  return {
    kind,
    path: r.str('path', 'tollgate.db')!,
    synchronous: r.oneOf('synchronous', ['NORMAL', 'FULL'] as const, 'NORMAL')!,
  };
}

/**
 * A connection string node-postgres reads, by its start: `postgres://` or `postgresql://` (the
 * host may be empty, `…@/db?host=/var/run/postgresql`, which a WHATWG URL does not take),
 * `socket:`, or a socket directory (`/var/run/postgresql db`). Anything else (`notaurl`, a
 * `mysql://` URL) would fail later as a host named by its pieces.
 */
function isPostgresUrl(url: string): boolean {
  if (/^(socket:|\/)/i.test(url)) return true;
  if (!/^postgres(ql)?:\/\//i.test(url)) return false;
  // And it parses, as node-postgres parses it: an empty host after credentials is read with a stand-in.
  for (const candidate of [url, url.replace(/@\//, '@localhost/')]) {
    try {
      new URL(candidate);
      return true;
    } catch {
      // try the next reading
    }
  }
  return false;
}

/** The zero-config default (SPEC §8): SQLite on disk and one upstream taken from the environment. */
function defaultUpstreams(env: NodeJS.ProcessEnv): unknown[] {
  if (env.OPENAI_BASE_URL || env.OPENAI_API_KEY) {
    return [
      {
        name: 'openai',
        kind: 'openai',
        // Set but empty is unset, as for TOLLGATE_HOST and TOLLGATE_PORT.
        baseUrl: env.OPENAI_BASE_URL || 'https://api.openai.com/v1',
        apiKeyEnv: 'OPENAI_API_KEY',
        models: ['*'],
        billing: 'metered',
      },
    ];
  }
  return [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:8080', models: ['*'], billing: 'local' }];
}

export function parseConfig(raw: unknown, env: NodeJS.ProcessEnv = process.env): Config {
  // Only no file at all is the zero-config default: a file that says `null` is a bad file.
  const root = new Reader(raw === undefined ? {} : raw, '');
  root.allowOnly(['store', 'upstreams', 'limits', 'defaults', 'runs', 'auth', 'tenants', 'prices', 'metrics', 'logging', 'tokenCache']);
  const names = new Set<string>();
  const upstreamsRaw = root.has('upstreams') ? undefined : defaultUpstreams(env);
  let upstreams: UpstreamConfig[];
  try {
    upstreams = root.list('upstreams', upstreamsRaw, (r) => readUpstream(r, names));
  } catch (err) {
    // The zero-config upstream's URL is the operator's OPENAI_BASE_URL: named as they set it.
    if (upstreamsRaw !== undefined && env.OPENAI_BASE_URL && err instanceof ConfigError && err.message.startsWith('upstreams[0].baseUrl: ')) {
      // Not quoted: a URL refused for its credentials or query may hold a secret.
      const why = err.message.slice('upstreams[0].baseUrl: '.length).replace('(put a key in apiKeyEnv)', '(put the key in OPENAI_API_KEY)');
      throw new ConfigError(`OPENAI_BASE_URL: ${why}`);
    }
    throw err;
  }
  if (upstreams.length === 0) root.fail('upstreams', 'must list at least one upstream');

  const limits = root.obj('limits');
  const defaults = root.obj('defaults');
  const runs = root.obj('runs');
  const auth = root.obj('auth');
  const prices = root.obj('prices');
  const metrics = root.obj('metrics');
  const logging = root.obj('logging');
  const tokenCache = root.obj('tokenCache');

  const config: Config = {
    store: readStore(root.obj('store'), env),
    upstreams,
    limits: {
      maxRows: limits.int('maxRows', DEFAULT_LIMITS.maxRows, 1, 1 << 20)!,
      maxRowTokens: limits.int('maxRowTokens', DEFAULT_LIMITS.maxRowTokens, 1, 1 << 26)!,
      maxRequestTokens: limits.int('maxRequestTokens', DEFAULT_LIMITS.maxRequestTokens, 1, 1 << 30)!,
      maxBodyBytes: limits.int('maxBodyBytes', DEFAULT_LIMITS.maxBodyBytes, 1, 1 << 30)!,
      maxInFlightPerKey: limits.intOrNull('maxInFlightPerKey', null, 1, 1_000_000) ?? null,
    },
    defaults: { maxTokens: defaults.int('maxTokens', 4096, 1, 1 << 24)! },
    runs: { ...(readRunBounds(runs, false) as RunBoundsConfig), writeTools: runs.strList('writeTools', [])! },
    auth: {
      keys: auth.list('keys', [], (k) => ({
        key: k.str('key', undefined)!,
        tenant: k.str('tenant', undefined)!,
        monthlyBudgetUsd: budgetOf(k),
        runs: readRunBounds(k.obj('runs'), true),
      })),
    },
    tenants: root.list('tenants', [], (t) => ({
      id: t.str('id', undefined)!,
      monthlyBudgetUsd: budgetOf(t),
      runs: readRunBounds(t.obj('runs'), true),
    })),
    prices: {
      overrides: prices.strOrNull('overrides', null) ?? null,
      unpriced: prices.oneOf('unpriced', ['refuse', 'allow'] as const, 'refuse')!,
    },
    metrics: { token: metrics.strOrNull('token', null) ?? null },
    logging: {
      level: logging.oneOf('level', ['fatal', 'error', 'warn', 'info', 'debug', 'trace', 'silent'] as const, 'info')!,
      prompts: logging.bool('prompts', false)!,
    },
    tokenCache: {
      maxBytes: tokenCache.int('maxBytes', 16 * 1024 * 1024, 0, 1 << 30)!,
      workers: tokenCache.int('workers', 1, 1, 2)!,
      prefixMemoBytes: tokenCache.int('prefixMemoBytes', DEFAULT_PREFIX_MEMO_BYTES, 0, 1 << 30)!,
    },
  };
  root.rejectUnknown();
  checkAnswerReserves(root, config);
  const keys = new Map<string, number>();
  /** Each tenant's first key that gives a monthlyBudgetUsd. */
  const budgetFrom = new Map<string, number>();
  for (const [i, k] of config.auth.keys.entries()) {
    if (!k.key.startsWith('tg-')) root.fail(`auth.keys[${i}].key`, 'must start with "tg-"');
    if (!TENANT_ID.test(k.tenant)) root.fail(`auth.keys[${i}].tenant`, TENANT_ID_RULE);
    // One key, one tenant: a repeated key would silently belong to the last tenant it names.
    const first = keys.get(k.key);
    if (first !== undefined) root.fail(`auth.keys[${i}].key`, `repeats auth.keys[${first}].key: a key belongs to one tenant`);
    keys.set(k.key, i);
    // A key's monthlyBudgetUsd is its tenant's (server/configured-tenants.ts): two keys giving one
    // tenant different budgets would leave the last to win, unsaid. The same figure again is fine.
    if (k.monthlyBudgetUsd !== undefined) {
      const from = budgetFrom.get(k.tenant);
      const given = from === undefined ? undefined : config.auth.keys[from].monthlyBudgetUsd;
      if (from === undefined) budgetFrom.set(k.tenant, i);
      else if (given !== k.monthlyBudgetUsd) {
        root.fail(`auth.keys[${i}].monthlyBudgetUsd`, `tenant "${k.tenant}" already has monthlyBudgetUsd ${given} from auth.keys[${from}]`);
      }
    }
  }
  const tenants = new Map<string, number>();
  for (const [i, tenant] of config.tenants.entries()) {
    // The operator API's rule for tenant ids, so every configured tenant can be named in its routes.
    if (!TENANT_ID.test(tenant.id)) root.fail(`tenants[${i}].id`, TENANT_ID_RULE);
    const first = tenants.get(tenant.id);
    if (first !== undefined) root.fail(`tenants[${i}].id`, `repeats tenants[${first}].id`);
    tenants.set(tenant.id, i);
  }
  return deepFreeze(config);
}

/**
 * The answer's reserve comes out of the run's token budget, so it must be smaller — in the config's
 * `runs` and in every tenant's and key's bounds as they combine with it. Otherwise every tool turn
 * of every run would start in final-answer mode.
 */
function checkAnswerReserves(root: Reader, config: Config): void {
  const check = (path: string, ...layers: Array<Partial<RunBoundsConfig> | undefined>) => {
    const b = Object.assign({}, ...layers) as Partial<RunBoundsConfig>;
    if (typeof b.tokenBudget === 'number' && typeof b.answerReserveTokens === 'number' && b.answerReserveTokens >= b.tokenBudget) {
      root.fail(
        `${path}.answerReserveTokens`,
        `${b.answerReserveTokens} must be less than the run token budget it applies with (${b.tokenBudget}): the answer is reserved out of that budget`,
      );
    }
  };
  check('runs', config.runs);
  config.tenants.forEach((t, i) => check(`tenants[${i}].runs`, config.runs, t.runs));
  config.auth.keys.forEach((k, i) => check(`auth.keys[${i}].runs`, config.runs, config.tenants.find((t) => t.id === k.tenant)?.runs, k.runs));
}

export function loadConfig(env: NodeJS.ProcessEnv = process.env): Config {
  const path = env.TOLLGATE_CONFIG;
  if (!path) return parseConfig({}, env);
  let text: string;
  try {
    text = readFileSync(path, 'utf8');
  } catch (err) {
    throw new ConfigError(`TOLLGATE_CONFIG: cannot read ${path}: ${(err as Error).message}`);
  }
  let raw: unknown;
  try {
    // A file saved with a byte-order mark (Windows editors) is JSON all the same.
    raw = JSON.parse(text.replace(/^\uFEFF/, ''));
  } catch (err) {
    throw new ConfigError(`TOLLGATE_CONFIG: ${path} is not valid JSON: ${(err as Error).message}`);
  }
  return parseConfig(besideConfig(raw, dirname(resolve(path))), env);
}

/**
 * A relative `prices.overrides` names a file beside the config file, wherever the gateway is
 * started from: a config and its prices are kept together (a file not there but in the working
 * directory is taken from there). `store.path` stays relative to the working directory, as its
 * default is: the ledger is data, kept where the process writes (a volume), not with a config
 * that may be mounted read-only.
 */
function besideConfig(raw: unknown, dir: string): unknown {
  if (typeof raw !== 'object' || raw === null || Array.isArray(raw)) return raw;
  const config = raw as Record<string, unknown>;
  const place = (section: string, field: string) => {
    const obj = config[section];
    if (typeof obj !== 'object' || obj === null || Array.isArray(obj)) return;
    const value = (obj as Record<string, unknown>)[field];
    if (typeof value !== 'string' || value === '' || isAbsolute(value)) return;
    const beside = resolve(dir, value);
    const chosen = !existsSync(beside) && existsSync(value) ? value : beside;
    config[section] = { ...obj, [field]: chosen };
  };
  place('prices', 'overrides');
  return config;
}

function deepFreeze<T>(value: T): T {
  if (value && typeof value === 'object') {
    for (const v of Object.values(value)) deepFreeze(v);
    Object.freeze(value);
  }
  return value;
}

export { ConfigError };
