// Configuration (SPEC §8, STYLE §4): validated once, a bad field named in the error, defaults
// filled in, the zero-config default taken from the environment, and the result frozen.

import t from 'tap';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig, parseConfig } from '../../server/config.js';

const upstream = (extra: Record<string, unknown> = {}) => ({ name: 'a', kind: 'openai', baseUrl: 'http://127.0.0.1:9/v1', ...extra });

/** The message of the ConfigError that parsing `raw` throws. */
function configError(raw: unknown, env: NodeJS.ProcessEnv = {}): string {
  try {
    parseConfig(raw, env);
  } catch (err) {
    if (err instanceof ConfigError) return err.message;
    throw err;
  }
  throw new Error('expected a ConfigError');
}

t.test('errors name the bad field', async (t) => {
  t.match(
    configError({ upstreams: [upstream(), upstream({ name: 'b', baseUrl: 'ftp://x' })] }),
    /^upstreams\[1\]\.baseUrl: must be a URL/,
    'the second upstream, by index',
  );
  t.match(configError({ upstreams: [upstream({ baseUrl: 'not a url' })] }), /^upstreams\[0\]\.baseUrl: must be a URL/);
  t.match(configError({ upstreams: [upstream({ maxTokens: 0 })] }), /^upstreams\[0\]\.maxTokens: must be an integer from 1 to/);
  t.equal(parseConfig({ upstreams: [upstream({ maxTokens: 32768 })] }, {}).upstreams[0]!.maxTokens, 32768, "an upstream's own default allowance");
  t.equal(parseConfig({ upstreams: [upstream()] }, {}).upstreams[0]!.maxTokens, null, 'none: defaults.maxTokens');
  t.match(configError({ upstream: [] }), /^upstream: unknown field/, 'a misspelt top-level field is not ignored');
  // A file that holds JSON null is no configuration (regression: the zero-config default was served).
  t.equal(configError(null), '(config): must be an object');
  t.equal(configError([]), '(config): must be an object');
  t.match(configError({ limits: { maxRows: 0 } }), /^limits\.maxRows: must be an integer from 1 to/);
  t.match(configError({ limits: { maxRows: '1024' } }), /^limits\.maxRows: must be an integer/);
  t.match(configError({ runs: { maxToolRounds: 65 } }), /^runs\.maxToolRounds: must be an integer from 1 to 64/);
  t.match(configError({ runs: { maxToolRounds: 0 } }), /^runs\.maxToolRounds: must be an integer from 1 to 64/);
  t.match(configError({ auth: { keys: [{ key: 'tg-ok', tenant: 'a' }, { key: 'sk-bad', tenant: 'b' }] } }), /^auth\.keys\[1\]\.key: must start with "tg-"/);
  t.match(configError({ upstreams: [upstream({ kind: 'vllm' })] }), /^upstreams\[0\]\.kind: must be one of "openai", "llamacpp"/);
  t.match(configError({ upstreams: [upstream(), upstream()] }), /^upstreams\[1\]\.name: duplicate upstream name "a"/);
  t.match(configError({ upstreams: [upstream({ allowanceField: 'max_new_tokens' })] }), /^upstreams\[0\]\.allowanceField: must be one of "max_tokens", "max_completion_tokens"/);
  t.match(configError({ upstreams: [upstream({ kind: 'llamacpp', allowanceField: 'max_completion_tokens' })] }), /^upstreams\[0\]\.allowanceField: a llama.cpp server reads only max_tokens/);
  t.match(configError({ upstreams: [] }), /^upstreams: must list at least one upstream/);
  t.match(configError({ upstreams: [{ kind: 'openai', baseUrl: 'http://x' }] }), /^upstreams\[0\]\.name: is required/);
  // What requests would silently drop is no base URL (they go to its origin and path).
  for (const baseUrl of ['http://x/v1?api-version=2024-10-21', 'http://x/v1#a', 'http://user:secret@x/v1']) {
    t.match(configError({ upstreams: [upstream({ baseUrl })] }), /^upstreams\[0\]\.baseUrl: must be a URL without a query, a fragment or credentials/, baseUrl);
  }
  t.match(configError({ upstreams: [upstream({ models: [] })] }), /^upstreams\[0\]\.models: must name at least one model or pattern/, 'an upstream that serves nothing');
});

t.test('a misspelt field at any depth is an error, not a silent default', async (t) => {
  const keys = (k: Record<string, unknown>) => ({ upstreams: [upstream()], auth: { keys: [{ key: 'tg-a', tenant: 'a', ...k }] } });
  // The money case: `monthlyBudget` for `monthlyBudgetUsd` would otherwise mean no budget at all.
  t.match(configError(keys({ monthlyBudget: 1 })), /^auth\.keys\[0\]\.monthlyBudget: unknown field \(expected one of .*monthlyBudgetUsd/);
  t.match(configError({ upstreams: [upstream({ contextwindow: 8192 })] }), /^upstreams\[0\]\.contextwindow: unknown field \(expected one of .*contextWindow/);
  t.match(configError({ upstreams: [upstream()], limits: { maxRow: 10 } }), /^limits\.maxRow: unknown field/);
  t.match(configError({ upstreams: [upstream()], defaults: { maxToken: 10 } }), /^defaults\.maxToken: unknown field/);
  t.match(configError({ upstreams: [upstream()], runs: { maxToolRound: 3 } }), /^runs\.maxToolRound: unknown field/);
  t.match(configError({ upstreams: [upstream()], prices: { override: 'p.json' } }), /^prices\.override: unknown field/);
  t.match(configError({ upstreams: [upstream()], metrics: { tokn: 'x' } }), /^metrics\.tokn: unknown field/);
  t.match(configError({ upstreams: [upstream()], store: { kind: 'sqlite', url: 'postgres://x' } }), /^store\.url: unknown field/, 'a field of the other store kind');
  t.match(configError({ upstreams: [upstream()], store: { kind: 'sqlite', recoverAfterSeconds: 120 } }), /^store\.recoverAfterSeconds: applies to a postgres store only/);
  t.match(configError({ upstreams: [upstream()], store: { kind: 'postgres', url: 'postgres://x', recoverAfterSeconds: 30 } }), /^store\.recoverAfterSeconds: must be an integer from 60 to 86400/);
  const pgStore = (extra: Record<string, unknown>) => parseConfig({ upstreams: [upstream()], store: { kind: 'postgres', url: 'postgres://x', ...extra } }, {}).store;
  t.match(pgStore({}), { kind: 'postgres', recoverAfterSeconds: 600 }, 'ten minutes by default');
  t.match(pgStore({ recoverAfterSeconds: 90 }), { recoverAfterSeconds: 90 });
  t.match(configError({ upstreams: [upstream()], tenants: [{ id: 't', runs: { writeTools: ['w'] } }] }), /^tenants\[0\]\.runs\.writeTools: unknown field/, 'write tools are set once, for every run');
  t.match(configError(keys({ runs: { patienc: 2 } })), /^auth\.keys\[0\]\.runs\.patienc: unknown field/);
});

t.test("the answer's reserve must be smaller than the token budget it is taken from", async (t) => {
  const base = { upstreams: [upstream()] };
  t.match(configError({ ...base, runs: { tokenBudget: 2000, answerReserveTokens: 5000 } }), /^runs\.answerReserveTokens: 5000 must be less than the run token budget it applies with \(2000\)/);
  // A tenant's budget under a configured global reserve, and a key's reserve over its tenant's budget.
  t.match(
    configError({ ...base, runs: { answerReserveTokens: 1024 }, tenants: [{ id: 't', runs: { tokenBudget: 1000 } }] }),
    /^tenants\[0\]\.runs\.answerReserveTokens: 1024 must be less than .* \(1000\)/,
  );
  // No reserve configured: any budget starts (one no larger than the default 1,024 leaves no room for tool rounds).
  t.doesNotThrow(() => parseConfig({ ...base, runs: { tokenBudget: 1000 } }, {}));
  t.doesNotThrow(() => parseConfig({ ...base, tenants: [{ id: 't', runs: { tokenBudget: 1000 } }], auth: { keys: [{ key: 'tg-k', tenant: 't', runs: { tokenBudget: 1 } }] } }, {}));
  t.match(
    configError({ ...base, tenants: [{ id: 't', runs: { tokenBudget: 4000 } }], auth: { keys: [{ key: 'tg-k', tenant: 't', runs: { answerReserveTokens: 4000 } }] } }),
    /^auth\.keys\[0\]\.runs\.answerReserveTokens: 4000 must be less than .* \(4000\)/,
  );
  // A budget turned off (null) leaves nothing to compare; a smaller reserve is fine.
  t.doesNotThrow(() => parseConfig({ ...base, runs: { tokenBudget: null, answerReserveTokens: 5000 } }, {}));
  t.doesNotThrow(() => parseConfig({ ...base, tenants: [{ id: 't', runs: { tokenBudget: 1000, answerReserveTokens: 200 } }] }, {}));
});

t.test('a key belongs to one tenant; tenant ids are ones the operator API can name', async (t) => {
  const base = { upstreams: [upstream()] };
  t.match(
    configError({ ...base, auth: { keys: [{ key: 'tg-shared', tenant: 'alpha', monthlyBudgetUsd: 5 }, { key: 'tg-shared', tenant: 'beta' }] } }),
    /^auth\.keys\[1\]\.key: repeats auth\.keys\[0\]\.key/,
  );
  t.match(configError({ ...base, tenants: [{ id: 'a' }, { id: 'a', monthlyBudgetUsd: 1 }] }), /^tenants\[1\]\.id: repeats tenants\[0\]\.id/);
  t.match(configError({ ...base, tenants: [{ id: 'team a/b' }] }), /^tenants\[0\]\.id: must be 1–128 letters/);
  t.match(configError({ ...base, auth: { keys: [{ key: 'tg-k', tenant: 'has space' }] } }), /^auth\.keys\[0\]\.tenant: must be 1–128 letters/);
});

t.test("keys of one tenant give it one monthly budget: a different one is an error, not the last winning", async (t) => {
  const base = { upstreams: [upstream()] };
  const keys = (...budgets: Array<number | null | undefined>) => ({
    ...base,
    auth: { keys: budgets.map((b, i) => ({ key: `tg-k${i}`, tenant: 't', ...(b === undefined ? {} : { monthlyBudgetUsd: b }) })) },
  });
  t.equal(configError(keys(5, 7)), 'auth.keys[1].monthlyBudgetUsd: tenant "t" already has monthlyBudgetUsd 5 from auth.keys[0]');
  // The first key that gives one is named, past keys that give none.
  t.equal(configError(keys(undefined, 5, 5, 0)), 'auth.keys[3].monthlyBudgetUsd: tenant "t" already has monthlyBudgetUsd 5 from auth.keys[1]');
  // The same figure again, or none on some keys, is one budget; null is a budget too (none), so a
  // key that says null and one that says 5 disagree.
  t.equal(parseConfig(keys(5, 5), {}).auth.keys[1].monthlyBudgetUsd, 5);
  t.equal(configError(keys(5, null)), 'auth.keys[1].monthlyBudgetUsd: tenant "t" already has monthlyBudgetUsd 5 from auth.keys[0]', 'null is a budget too: none');
  t.equal(parseConfig(keys(undefined, null), {}).auth.keys[1].monthlyBudgetUsd, null);
  t.equal(parseConfig(keys(undefined, null), {}).auth.keys[0].monthlyBudgetUsd, undefined, 'left out: not given');
  t.doesNotThrow(() => parseConfig(keys(5, undefined, 5), {}));
  t.doesNotThrow(() => parseConfig(keys(null, undefined, null), {}));
  // Keys of different tenants are not compared.
  t.doesNotThrow(() => parseConfig({ ...base, auth: { keys: [{ key: 'tg-a', tenant: 'a', monthlyBudgetUsd: 5 }, { key: 'tg-b', tenant: 'b', monthlyBudgetUsd: 7 }] } }, {}));
});

t.test('defaults', async (t) => {
  const c = parseConfig({ upstreams: [upstream()] }, {});
  t.same(c.limits, { maxRows: 1024, maxRowTokens: 36_864, maxRequestTokens: 1_048_576, maxBodyBytes: 33_554_432, maxInFlightPerKey: null });
  t.same(c.runs, { tokenBudget: 65_536, maxToolRounds: 12, timeBudgetSeconds: 300, patience: 3, answerReserveTokens: null, writeTools: [] });
  t.same(c.store, { kind: 'sqlite', path: 'tollgate.db', synchronous: 'NORMAL' });
  t.same(c.auth.keys, [], 'no keys: a loopback development setup');
  t.equal(c.metrics.token, null, 'metrics open by default');
  t.equal(c.logging.prompts, false, 'prompt text is not logged by default');
  const u = c.upstreams[0];
  t.equal(u.billing, 'metered', 'an openai upstream is metered by default');
  t.same(u.models, ['*']);
  t.equal(u.apiKeyEnv, null);
  t.equal(u.prefixCache, true);
  t.equal(u.baseUrl, 'http://127.0.0.1:9/v1');
  t.equal(parseConfig({ upstreams: [upstream({ kind: 'llamacpp' })] }, {}).upstreams[0].billing, 'local', 'a llama.cpp upstream is local by default');
  t.equal(parseConfig({ upstreams: [upstream({ baseUrl: 'http://h:1/v1/' })] }, {}).upstreams[0].baseUrl, 'http://h:1/v1', 'trailing slash dropped');
  t.equal(parseConfig({ upstreams: [upstream()], runs: { maxToolRounds: null } }, {}).runs.maxToolRounds, null, 'null turns a bound off');
  t.same(c.tokenCache, { maxBytes: 16 * 1024 * 1024, workers: 1, prefixMemoBytes: 32 * 1024 * 1024 });
  t.equal(parseConfig({ upstreams: [upstream()], tokenCache: { prefixMemoBytes: 0 } }, {}).tokenCache.prefixMemoBytes, 0, '0 turns the prefix memo off');
  t.throws(() => parseConfig({ upstreams: [upstream()], tokenCache: { prefixMemoBytes: -1 } }, {}), /tokenCache\.prefixMemoBytes/);
});

t.test('zero-config default: llama.cpp on 127.0.0.1:8080, or OpenAI from the environment', async (t) => {
  const local = parseConfig({}, {});
  t.equal(local.upstreams.length, 1);
  t.match(local.upstreams[0], { name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:8080', billing: 'local', models: ['*'] });
  t.equal(local.store.kind, 'sqlite', 'an embedded SQLite ledger');

  const fromEnv = parseConfig({}, { OPENAI_BASE_URL: 'http://127.0.0.1:7777/v1', OPENAI_API_KEY: 'sk-x' });
  t.match(fromEnv.upstreams[0], { kind: 'openai', baseUrl: 'http://127.0.0.1:7777/v1', apiKeyEnv: 'OPENAI_API_KEY', billing: 'metered' });
  const keyOnly = parseConfig({}, { OPENAI_API_KEY: 'sk-x' });
  t.match(keyOnly.upstreams[0], { kind: 'openai', baseUrl: 'https://api.openai.com/v1' });

  // loadConfig without TOLLGATE_CONFIG serves the same default.
  t.same(loadConfig({}), local);
  t.same(loadConfig({ OPENAI_API_KEY: 'sk-x' }), keyOnly);
});

t.test('config is frozen, deeply', async (t) => {
  const c = parseConfig({ upstreams: [upstream()], auth: { keys: [{ key: 'tg-a', tenant: 'a' }] } }, {});
  t.ok(Object.isFrozen(c));
  t.ok(Object.isFrozen(c.limits));
  t.ok(Object.isFrozen(c.upstreams));
  t.ok(Object.isFrozen(c.upstreams[0]));
  t.ok(Object.isFrozen(c.auth.keys[0]));
  t.throws(() => {
    (c.limits as { maxRows: number }).maxRows = 1;
  }, TypeError);
  t.equal(c.limits.maxRows, 1024);
});

t.test('loadConfig reads TOLLGATE_CONFIG and names what is wrong with it', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-config-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const good = join(dir, 'good.json');
  writeFileSync(good, JSON.stringify({ upstreams: [upstream()], limits: { maxRows: 7 } }));
  t.equal(loadConfig({ TOLLGATE_CONFIG: good }).limits.maxRows, 7);

  const bad = join(dir, 'bad.json');
  writeFileSync(bad, JSON.stringify({ upstreams: [upstream({ baseUrl: 'nope' })] }));
  t.throws(() => loadConfig({ TOLLGATE_CONFIG: bad }), { name: 'ConfigError', message: /^upstreams\[0\]\.baseUrl: must be a URL/ });

  const notJson = join(dir, 'broken.json');
  writeFileSync(notJson, '{ "upstreams": [');
  t.throws(() => loadConfig({ TOLLGATE_CONFIG: notJson }), { name: 'ConfigError', message: /^TOLLGATE_CONFIG: .*broken\.json is not valid JSON/ });
  t.throws(() => loadConfig({ TOLLGATE_CONFIG: join(dir, 'missing.json') }), { name: 'ConfigError', message: /^TOLLGATE_CONFIG: cannot read .*missing\.json/ });
});

t.test('a relative prices.overrides is beside the config file, wherever the gateway starts; else in the working directory', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-cfg-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const configPath = join(dir, 'tollgate.json');
  writeFileSync(join(dir, 'prices.json'), '{"models": {}}');
  writeFileSync(configPath, JSON.stringify({ upstreams: [upstream()], store: { path: 'ledger.db' }, prices: { overrides: 'prices.json' } }));
  const config = loadConfig({ TOLLGATE_CONFIG: configPath });
  t.equal(config.prices.overrides, join(dir, 'prices.json'), 'the file beside the config');
  t.equal(config.store.kind === 'sqlite' && config.store.path, 'ledger.db', 'the ledger stays in the working directory');
  // Not beside the config, but in the working directory: as before.
  writeFileSync(configPath, JSON.stringify({ upstreams: [upstream()], prices: { overrides: 'package.json' } }));
  t.equal(loadConfig({ TOLLGATE_CONFIG: configPath }).prices.overrides, 'package.json');
  // An absolute path is left alone.
  writeFileSync(configPath, JSON.stringify({ upstreams: [upstream()], prices: { overrides: '/nowhere/prices.json' } }));
  t.equal(loadConfig({ TOLLGATE_CONFIG: configPath }).prices.overrides, '/nowhere/prices.json');
});

// An outside audit: the zero-config upstream's mistakes were named as a config file's field the
// operator never wrote, and an empty OPENAI_BASE_URL counted as set.
t.test('zero config: OPENAI_BASE_URL is named in its errors, and set but empty is unset', async (t) => {
  t.equal(configError({}, { OPENAI_BASE_URL: 'localhost:8000/v1' }), 'OPENAI_BASE_URL: must be a URL (http:// or https://)');
  const secret = configError({}, { OPENAI_BASE_URL: 'https://me:sk-live-SECRET@x.example/v1?key=sk-live-SECRET' });
  t.match(secret, /^OPENAI_BASE_URL: must be a URL without a query.*\(put the key in OPENAI_API_KEY\)/);
  t.notMatch(secret, /SECRET/, 'the value is not quoted: it may hold a secret');
  const empty = parseConfig({}, { OPENAI_BASE_URL: '', OPENAI_API_KEY: 'sk-x' });
  t.equal(empty.upstreams[0]!.baseUrl, 'https://api.openai.com/v1');
  // A config file's own upstreams keep their own names in errors.
  t.match(configError({ upstreams: [upstream({ baseUrl: 'nope' })] }, { OPENAI_BASE_URL: 'http://127.0.0.1:1/v1' }), /^upstreams\[0\]\.baseUrl: /);
});

t.test('store.url must be a postgres:// URL (it failed later, as a host named "base")', async (t) => {
  const rule = 'store.url: must be a postgres:// URL such as postgres://user:password@host:5432/db (or socket:, or a socket directory)';
  t.equal(configError({ store: { kind: 'postgres', url: 'notaurl' } }), rule);
  t.equal(configError({ store: { kind: 'postgres', url: 'mysql://u@h/db' } }), rule);
  t.equal(configError({ store: { kind: 'postgres' } }, { DATABASE_URL: 'notaurl' }), `${rule} (from DATABASE_URL)`);
  // Every form node-postgres reads (a review: an empty host with a user, a socket, were refused).
  for (const url of [
    'postgres://u:p@127.0.0.1:5432/db',
    'postgresql://u@h/db',
    'postgres:///db?host=/var/run/postgresql',
    'postgres://tollgate:secret@/tollgate?host=/var/run/postgresql',
    'socket:/var/run/postgresql?db=tollgate',
    '/var/run/postgresql tollgate',
  ]) {
    t.equal(parseConfig({ store: { kind: 'postgres', url } }, {}).store.kind, 'postgres', url);
  }
});

t.test('store.url with the right start that does not parse is refused at start (it crashed with a stack)', async (t) => {
  for (const url of ['postgres://h:99999/db', 'postgres://[::1/db']) {
    t.match(configError({ store: { kind: 'postgres', url } }), /^store\.url: must be a postgres:\/\/ URL/, url);
  }
});
