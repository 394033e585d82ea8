// The app factory (STYLE §1): builds the Fastify instance from config and injectable services
// (store, clock, metrics registry, upstream dispatchers). It never listens; server/main.ts does.

import Fastify, { LogController, type FastifyInstance, type FastifyReply, type FastifyServerOptions } from 'fastify';
import type { Dispatcher } from 'undici';
import { Registry } from 'prom-client';
import type { Config, UpstreamConfig } from './config.js';
import { MIN_RECOVER_AFTER_SECONDS } from './config.js';
import { ConfigError } from './config-reader.js';
import { setMaxListeners } from 'node:events';
import { statSync } from 'node:fs';
import { join } from 'node:path';
import type { Ledger } from '../metering/ledger.js';
import { openStore } from '../metering/stores/open-store.js';
import { initMetrics } from './metrics.js';
import { UpstreamRegistry } from './upstreams.js';
import { Authenticator } from './auth.js';
import { encodingsServed, gatewayCounters } from './counters.js';
import { applyConfiguredTenants } from './configured-tenants.js';
import { loadEncoders } from '../metering/tokenizers/index.js';
import { PrefixMemo } from '../metering/prefix-memo.js';
import { SettlementRetry } from './pipeline/settle-retry.js';
import { KeySlots, registerSlotRelease } from './key-slots.js';
import { guardLedger, StoreFailures } from './ledger-guard.js';
import { PriceTable } from '../pricing/price-table.js';
import { registerJsonBodyParser } from './body.js';
import { registerErrorHandling } from './error-handler.js';
import { ERRORS, GatewayError, NO_RETRY_HEADERS, envelope } from './errors.js';
import type { Clock, Gateway } from './gateway.js';
import chatRoute from '../routes/chat-completions.js';
import completionsRoute from '../routes/completions.js';
import embeddingsRoute from '../routes/embeddings.js';
import modelsRoute from '../routes/models.js';
import healthRoutes from '../routes/health.js';
import metricsRoute from '../routes/metrics.js';
import admissionRoute from '../routes/admission.js';
import spendRoute from '../routes/spend.js';
import { NowAndThen } from './log-now-and-then.js';
import adminRoutes from '../routes/admin.js';
import { ANSWER_COUNT_TIMEOUT_MS } from './pipeline/count-answer.js';


/** How long a client may take to send a whole request (headers and body). */
/**
 * How often a PostgreSQL replica says its requests alive and sweeps for stale ones: a fifth of the
 * shortest `store.recoverAfterSeconds` (60 s), so no replica's live request is ever taken for a
 * crash by one configured with that threshold.
 */
export const KEEP_ALIVE_EVERY_MS = (MIN_RECOVER_AFTER_SECONDS * 1000) / 5;

export const REQUEST_TIMEOUT_MS = 300_000;

/** Node's own rule for the headers' time: 60 s, or the whole request's time if that is less. */
function headersTimeoutMs(requestTimeoutMs: number): number {
  return Math.min(60_000, requestTimeoutMs);
}
export interface AppOptions {
  config: Config;
  ledger?: Ledger;
  clock?: Clock;
  registry?: Registry;
  env?: NodeJS.ProcessEnv;
  dispatcherFor?: (u: UpstreamConfig) => Dispatcher;
  logger?: FastifyServerOptions['logger'];
  /** How old an open reservation must be to count as left by a crash (default 10 minutes). */
  staleReservationMs?: number;
  /** How often in-flight reservations are kept alive and stale ones swept (default 12 s; tests shorten it). */
  sweepIntervalMs?: number;
  /**
   * Load the tiktoken encodings the OpenAI-kind upstreams can need before serving (server/main.ts
   * does; default off, so a test that never counts does not pay ~0.6 s for them).
   */
  loadTokenizers?: boolean;
  /** How long to wait for another process to let go of the SQLite ledger file (default 35 s; ADR 0016). */
  ledgerLockWaitMs?: number;
  /** How often settlements the ledger refused are tried again (default 5 s; tests shorten it). */
  settleRetryMs?: number;
  /** Whether the gateway may serve without any key (default true; server/main.ts: on loopback only). */
  openWithoutKeys?: boolean;
  /** How long a client may take to send a whole request (default REQUEST_TIMEOUT_MS; tests shorten it). */
  requestTimeoutMs?: number;
  /** How long a llama.cpp server's /props may take (default PROPS_TIMEOUT_MS; tests shorten it). */
  propsTimeoutMs?: number;
  /** How long an answer waits on a llama.cpp server's /tokenize for its count (default ANSWER_COUNT_TIMEOUT_MS; tests shorten it). */
  answerCountTimeoutMs?: number;
}

declare module 'fastify' {
  interface FastifyInstance {
    gateway: Gateway;
  }
}

function isDirectory(path: string): boolean {
  try {
    return statSync(path).isDirectory();
  } catch {
    return false;
  }
}

export async function buildApp(opts: AppOptions): Promise<FastifyInstance> {
  const { config } = opts;
  const env = opts.env ?? process.env;
  const clock = opts.clock ?? Date.now;
  const requestTimeoutMs = opts.requestTimeoutMs ?? REQUEST_TIMEOUT_MS;
  const app = Fastify({
    logger: opts.logger ?? {
      level: config.logging.level,
      // Keys and the admin token never reach a log line (SPEC §10).
      redact: ['req.headers.authorization', 'headers.authorization', 'authorization'],
    },
    // Bodies are bounded by our own parser, which counts bytes exactly (server/body.ts).
    bodyLimit: Number.MAX_SAFE_INTEGER,
    // A request must have arrived whole within this time (Node's own default, which Fastify turns
    // off): a client that sends its headers and then its body a byte at a time, or never, does not
    // hold a connection and a buffered body for ever. Answers (streams) are not bounded by it.
    requestTimeout: requestTimeoutMs,
    // A request that arrives on a kept-alive connection while the gateway closes is answered below,
    // in the OpenAI envelope (Fastify's own 503 is a body no SDK reads as an error).
    return503OnClosing: false,
    // One structured line per request comes from the pipeline itself (SPEC §10).
    logController: new LogController({ disableRequestLogging: true }),
    requestIdHeader: false,
    // A conversation id may be 256 characters (server/pipeline/plan.ts); its spend and cap routes
    // take it in the path, percent-encoded up to three bytes a character.
    routerOptions: { maxParamLength: 1024 },
    // A URL Fastify cannot even route (bad percent-encoding) gets the OpenAI envelope too.
    frameworkErrors: (err, _request, reply) => {
      void (reply as unknown as FastifyReply)
        .code(400)
        .headers(NO_RETRY_HEADERS)
        .send(envelope('invalid_request', `the request URL is malformed: ${err.message}`, 'invalid_request_error'));
    },
    // What Node's HTTP parser refuses before there is a request (a header too large, control
    // characters, Content-Length beside Transfer-Encoding) is answered in the OpenAI envelope too.
    clientErrorHandler: (err: NodeJS.ErrnoException, socket) => {
      if (!socket.writable) return;
      const [status, reason, error] = clientErrorAnswer(err, requestTimeoutMs);
      // A request whose body did not arrive in time is answered here; its request, still reading
      // its body, then fails as a client gone: the error handler gives it its line and its count.
      if (status === 408) (socket as { tollgateTimedOut?: boolean }).tollgateTimedOut = true;
      const body = JSON.stringify(error);
      // A request that was too slow may be sent again (the SDKs retry a 408); one Node could not
      // read will fail the same way again.
      const retry = status === 408 ? '' : 'x-should-retry: false\r\n';
      socket.end(
        `HTTP/1.1 ${status} ${reason}\r\n` +
          `content-type: application/json; charset=utf-8\r\ncontent-length: ${Buffer.byteLength(body)}\r\n${retry}connection: close\r\n\r\n${body}`,
      );
    },
    genReqId: () => `http-${Math.random().toString(36).slice(2, 10)}`,
  });
  // Fastify sets the request timeout after Node made the server, so Node's own rule for the headers'
  // time is applied here (else they keep 60 s past a shorter request time); Node looks for requests past
  // their time every 30 s by default, every tenth of the limit here (the property Node reads when
  // the server starts listening, from its `connectionsCheckingInterval` option; not in its types).
  const server = app.server as unknown as { connectionsCheckingInterval: number; headersTimeout: number };
  server.headersTimeout = headersTimeoutMs(requestTimeoutMs);
  server.connectionsCheckingInterval = Math.min(30_000, Math.max(10, Math.floor(requestTimeoutMs / 10)));

  // What the config names and can still be wrong (the price overrides file) is read before the
  // store is opened: a start refused for it leaves no ledger file and no migration behind.
  const prices = PriceTable.load(config.prices.overrides);

  // A folder named as the ledger is said before anything is made: opening it first left a stray
  // `<folder>-lock` file beside it (the owner lock, ADR 0016).
  if (!opts.ledger && config.store.kind === 'sqlite' && isDirectory(config.store.path)) {
    throw new ConfigError(`store.path: ${config.store.path} is a folder: name the ledger's file (for example ${join(config.store.path, 'tollgate.db')})`);
  }
  // A gateway serves its SQLite file alone: it waits for a process still holding it (ADR 0016).
  const ledger =
    opts.ledger ??
    (await openStore(config.store, {
      sqliteOwner: {
        waitMs: opts.ledgerLockWaitMs,
        onWait: (path) => app.log.warn({ path }, 'the SQLite ledger is held by another Tollgate process: waiting for it to stop'),
      },
      onCheckpointEvent: (e) => {
        if (e.event === 'checkpoint-recovered') app.log.info('WAL checkpoints succeed again');
        else if (e.event === 'checkpoint-failed') app.log.warn({ reason: e.reason }, 'a WAL checkpoint failed (tried again every second; the -wal file grows meanwhile)');
        else app.log.error({ reason: e.reason, retryInMs: e.retryInMs }, 'the WAL checkpoint worker failed: the ledger connection checkpoints on the event loop until a new worker starts');
      },
    }).catch((err: unknown) => {
      // A file that cannot be opened (its folder missing or not writable) is the config's problem:
      // said with the field and the path, not as a stack trace.
      const code = (err as { code?: string }).code;
      if (config.store.kind === 'sqlite' && code === 'SQLITE_READONLY') {
        throw new ConfigError(`store.path: the SQLite ledger ${config.store.path} cannot be written by this user (${(err as Error).message}): the file, its -wal and -shm files and its folder must be writable`);
      }
      if (config.store.kind === 'sqlite' && (code === 'SQLITE_CANTOPEN' || (err instanceof TypeError && /directory does not exist/.test(err.message)))) {
        throw new ConfigError(`store.path: cannot open the SQLite ledger ${config.store.path} (or its lock ${config.store.path}-lock): ${(err as Error).message}; the folder must exist and be writable`);
      }
      throw err;
    }));
  // Which ledger this is, and whether it is new: a changed store.path (or a relative one started
  // from another folder) is a fresh ledger with no spend, keys or caps, and must not pass unsaid.
  if (!opts.ledger) {
    if (ledger.createdNow) app.log.warn({ store: ledger.kind, location: ledger.location }, 'created a new, empty ledger: no spend, keys or caps from any earlier ledger apply');
    else app.log.info({ store: ledger.kind, location: ledger.location }, 'ledger opened');
  }
  // Reservations left open by a crash are settled conservatively before serving (SPEC §9).
  // SQLite has one gateway process per file, so every open reservation at start was left by a
  // crash — all of them, whatever their time: a restart with the clock set back (before NTP) finds
  // rows stamped after its own now, which a cutoff on time would leave reserved for good. Replicas
  // sharing PostgreSQL may have requests in flight: there only reservations not made or kept alive
  // for the threshold count (`store.recoverAfterSeconds`, 10 minutes by default), swept every
  // 12 s, and each replica first keeps its own in-flight ones alive — a stream may outlast the
  // threshold (ADR 0011). The interval is a fifth of the shortest threshold allowed, whatever this
  // replica's: replicas configured apart still say theirs alive often enough for any of them.
  const recoverAfterMs = config.store.kind === 'postgres' ? config.store.recoverAfterSeconds * 1000 : 10 * 60_000;
  const staleMs = opts.staleReservationMs ?? (ledger.kind === 'sqlite' ? 0 : recoverAfterMs);
  const recovered = ledger.kind === 'sqlite' ? await ledger.recoverOpen(clock()) : await ledger.recoverStale(staleMs, clock());
  if (recovered > 0) app.log.warn({ recovered }, 'settled reservations left open by a previous run');
  const inFlight = new Set<string>();
  const sweepEvery = opts.sweepIntervalMs ?? KEEP_ALIVE_EVERY_MS;
  const sweep =
    staleMs > 0
      ? setInterval(() => {
          ledger
            .keepAlive([...inFlight], clock())
            .then(() => ledger.recoverStale(Math.max(staleMs, sweepEvery), clock()))
            .then((n) => {
              if (n > 0) app.log.warn({ recovered: n }, 'settled reservations left open by a replica that went away');
            })
            .catch((err: unknown) => app.log.warn({ err }, 'stale reservation sweep failed'));
        }, sweepEvery)
      : null;
  sweep?.unref();
  await applyConfiguredTenants(ledger, config, app.log);

  const upstreams = new UpstreamRegistry(config, env, opts.dispatcherFor);
  // A key the config names but the environment lacks: the upstream would answer every request 401.
  for (const u of config.upstreams) {
    if (u.apiKeyEnv && !env[u.apiKeyEnv]) app.log.warn({ upstream: u.name, apiKeyEnv: u.apiKeyEnv }, 'the upstream\'s API key variable is not set: its requests go without a key');
  }
  // Models an upstream lists that an earlier upstream lists too (the same name or pattern: the
  // first in the config routes): said at start, as nothing else would show that requests for them
  // never reach it.
  const shadowed = upstreams.shadowed();
  for (const [at, u] of upstreams.list.entries()) {
    const mine = shadowed.filter((s) => s.upstream === u);
    if (mine.length > 0) {
      const takenBy = [...new Set(mine.map((s) => s.takenBy.name))];
      app.log.warn({ upstream: u.name, models: mine.map((s) => s.model), routedTo: takenBy }, `upstreams[${at}] ("${u.name}"): an earlier upstream lists these of its models too, and takes them: requests for them never reach it`);
    }
  }
  // A run budget below a default allowance refuses every request that names no max_tokens.
  for (const [setting, allowance] of defaultAllowancesInUse(config)) {
    for (const [where, budget] of runBudgetsBelow(config, allowance)) {
      app.log.warn({ [where]: budget, [setting]: allowance }, `${where} is below ${setting}: a request that names no max_tokens is refused (402) under it; lower ${setting} or raise the budget`);
    }
  }
  if (opts.loadTokenizers) {
    const started = performance.now();
    const encodings = encodingsServed(upstreams);
    loadEncoders(encodings);
    if (encodings.length > 0) app.log.info({ encodings, ms: Math.round(performance.now() - started) }, 'tokenizers loaded');
  }
  // Every request in flight listens on it: no limit on listeners (Node warns past 10).
  const drain = new AbortController();
  setMaxListeners(0, drain.signal);
  const storeFailures = new StoreFailures();
  const guarded = guardLedger(ledger, storeFailures);
  const gateway: Gateway = {
    config,
    // Store failures on the request path are 503 ledger_unavailable (server/ledger-guard.ts).
    ledger: guarded,
    storeFailures,
    metrics: initMetrics(opts.registry ?? new Registry(), { defaults: !opts.registry }),
    upstreams,
    auth: new Authenticator(config, guarded, { openWithoutKeys: opts.openWithoutKeys ?? true }),
    // Intervals inside this process (a refresh, a warning's minute) are on a monotonic clock, not `clock`.
    counters: gatewayCounters(config, undefined, opts.propsTimeoutMs),
    prices,
    warnings: new NowAndThen(),
    prefixMemo: new PrefixMemo(config.tokenCache.prefixMemoBytes),
    inFlight,
    keySlots: new KeySlots(config.limits.maxInFlightPerKey),
    settleRetry: new SettlementRetry(guarded, inFlight, app.log, opts.settleRetryMs, clock),
    drain,
    clock,
    answerCountTimeoutMs: opts.answerCountTimeoutMs ?? ANSWER_COUNT_TIMEOUT_MS,
    log: app.log,
    // Trimmed as a presented bearer token is (server/auth.ts `bearer`): a secret read from a file
    // ends in a newline, and kept as it was it could never be sent (every operator call a 401).
    adminToken: env.TOLLGATE_ADMIN_TOKEN?.trim() || null,
  };
  app.decorate('gateway', gateway);

  registerJsonBodyParser(app, config.limits.maxBodyBytes);
  registerSlotRelease(app);
  registerErrorHandling(app);
  let closing = false;
  app.addHook('preClose', (done) => {
    closing = true;
    done();
  });
  app.addHook('onRequest', async () => {
    // Retryable: another replica, or this one once restarted, takes it (the SDKs retry a 503).
    if (closing) throw new GatewayError('shutting_down', 'the gateway is shutting down: the request was not started; send it again');
  });

  await app.register(healthRoutes);
  await app.register(metricsRoute);
  await app.register(modelsRoute);
  await app.register(chatRoute);
  await app.register(completionsRoute);
  await app.register(embeddingsRoute);
  await app.register(admissionRoute);
  await app.register(spendRoute);
  await app.register(adminRoutes);

  app.addHook('onClose', async () => {
    if (sweep) clearInterval(sweep);
    await gateway.settleRetry.close();
    await gateway.counters.close();
    await upstreams.close();
    if (!opts.ledger) await ledger.close();
  });
  return app;
}

/** The status, reason phrase and OpenAI envelope for what Node's HTTP server refused before routing. */
function clientErrorAnswer(err: NodeJS.ErrnoException, requestTimeoutMs: number): [number, string, ReturnType<typeof envelope>] {
  if (err.code === 'HPE_HEADER_OVERFLOW') {
    return [431, 'Request Header Fields Too Large', envelope('invalid_request', 'the request headers are too large', ERRORS.invalid_request.type)];
  }
  if (err.code === 'ERR_HTTP_REQUEST_TIMEOUT') {
    const limits = `its headers within ${headersTimeoutMs(requestTimeoutMs) / 1000} s, the whole request within ${requestTimeoutMs / 1000} s`;
    return [408, 'Request Timeout', envelope('request_timeout', `the request did not arrive in time (${limits})`, ERRORS.request_timeout.type)];
  }
  return [400, 'Bad Request', envelope('invalid_request', `the request is not valid HTTP: ${err.code ?? err.message}`, ERRORS.invalid_request.type)];
}

/** The default allowances some upstream gives, by the setting they come from: `defaults.maxTokens`, an upstream's `maxTokens`. */
function defaultAllowancesInUse(config: Config): Array<[string, number]> {
  const own = config.upstreams.flatMap((u, i): Array<[string, number]> => (u.maxTokens === null ? [] : [[`upstreams[${i}].maxTokens`, u.maxTokens]]));
  return config.upstreams.some((u) => u.maxTokens === null) ? [['defaults.maxTokens', config.defaults.maxTokens], ...own] : own;
}

/** Run token budgets (`runs`, a tenant's, a key's) smaller than `allowance`, by where they are set. */
function runBudgetsBelow(config: Config, allowance: number): Array<[string, number]> {
  const below = (b: number | null | undefined) => typeof b === 'number' && b < allowance;
  const out: Array<[string, number]> = [];
  if (below(config.runs.tokenBudget)) out.push(['runs.tokenBudget', config.runs.tokenBudget!]);
  config.tenants.forEach((t, i) => below(t.runs?.tokenBudget) && out.push([`tenants[${i}].runs.tokenBudget`, t.runs!.tokenBudget!]));
  config.auth.keys.forEach((k, i) => below(k.runs?.tokenBudget) && out.push([`auth.keys[${i}].runs.tokenBudget`, k.runs!.tokenBudget!]));
  return out;
}
