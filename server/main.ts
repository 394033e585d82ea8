#!/usr/bin/env node
// Start-up: read the environment, build the app, listen, and shut down gracefully (SPEC §8).
//   TOLLGATE_CONFIG       JSON config file (optional: a zero-config default is served without it)
//   TOLLGATE_HOST         default 127.0.0.1
//   TOLLGATE_PORT         default 8787
//   TOLLGATE_DRAIN_MS     how long a stopping gateway lets requests run, default 25000
//   TOLLGATE_ADMIN_TOKEN  enables the operator API (read by server/app.ts; unset or empty: off)
// (set but empty is the default, as unset: `TOLLGATE_PORT=` in a compose file is not port 0)
// The config reads its own (server/config.ts): OPENAI_BASE_URL and OPENAI_API_KEY for the
// zero-config upstream, DATABASE_URL for a PostgreSQL store without `url`, each `apiKeyEnv`.

import { existsSync } from 'node:fs';
import { lookup } from 'node:dns/promises';
import { isIP } from 'node:net';
import { buildApp } from './app.js';
import { ConfigError, loadConfig } from './config.js';
import { isStoreFailure } from './ledger-guard.js';
import { routeStopSignals } from './stop-signals.js';
import { OWNER_LOCK_WAIT_MS } from '../metering/stores/sqlite-owner-lock.js';

const LOOPBACK = new Set(['127.0.0.1', '::1', 'localhost']);

/** How long a stopping gateway lets requests in flight run before it stops them (ms), by default. */
const DEFAULT_DRAIN_MS = 25_000;
/** A signal within this long of the first is taken as the same one, delivered twice (ms). */
const SAME_SIGNAL_MS = 1_000;
/** How much longer than the drain a stopping gateway waits before it exits whatever is left (ms). */
const HARD_EXIT_AFTER_DRAIN_MS = 5_000;

/**
 * Whether the gateway listens on loopback alone (keys may then be left out). A name is taken as
 * loopback only if it is `localhost`: `127.example.com` is a name like any other.
 */
export function isLoopback(host: string): boolean {
  return LOOPBACK.has(host) || (isIP(host) === 4 && host.startsWith('127.'));
}

/** Why `host` cannot be listened on (not an address, a name that does not resolve), or null. */
export async function unusableHost(host: string): Promise<string | null> {
  if (isIP(host) !== 0) return null;
  try {
    await lookup(host);
    return null;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? 'error';
    const spaces = host !== host.trim() ? ' (it has spaces around it)' : '';
    return `TOLLGATE_HOST "${host}" is neither an IP address nor a name that resolves (${code})${spaces}`;
  }
}

/** A mistake in the configuration (or a file it names) ends the start with its message, exit 2. */
function exitIfConfigProblem(err: unknown): void {
  if (err instanceof ConfigError || (err instanceof Error && err.name === 'PriceOverridesError')) {
    process.stderr.write(`tollgate: invalid configuration: ${err.message}\n`);
    process.exit(2);
  }
}

async function main(): Promise<void> {
  // A signal while the gateway is still starting (its host looked up, its tokenizers loading, or a
  // wait of up to a drain for another process to let go of the SQLite file) stops it there: nothing is in flight,
  // and a stop is exit 0, said on stderr as every other end of a start is. SQLite's locks and
  // transactions need no closing: the operating system drops the one and the file undoes the other.
  const stopStarting = (signal: NodeJS.Signals) => {
    process.stderr.write(`tollgate: ${signal} before the start finished: stopped\n`);
    process.exit(0);
  };
  // One listener a signal for the life of the process; what it calls changes once the gateway serves.
  const stopSignals = routeStopSignals(stopStarting);
  const env = process.env;
  let config;
  try {
    config = loadConfig(env);
  } catch (err) {
    exitIfConfigProblem(err);
    throw err;
  }
  const host = env.TOLLGATE_HOST || '127.0.0.1';
  // Digits only: Number() reads '' and ' ' as 0 (a random port) and '0x1f90' as 8080.
  const portText = env.TOLLGATE_PORT || '8787';
  const port = /^\d{1,5}$/.test(portText) ? Number(portText) : NaN;
  if (Number.isNaN(port) || port > 65535) {
    process.stderr.write(`tollgate: TOLLGATE_PORT must be a port number, got "${env.TOLLGATE_PORT}"\n`);
    process.exit(2);
  }
  // The drain, like the port: digits or unset, never a silent fall-back to the default.
  const drainText = env.TOLLGATE_DRAIN_MS || String(DEFAULT_DRAIN_MS);
  if (!/^\d{1,9}$/.test(drainText)) {
    process.stderr.write(`tollgate: TOLLGATE_DRAIN_MS must be a number of milliseconds, got "${env.TOLLGATE_DRAIN_MS}"\n`);
    process.exit(2);
  }
  const drainMs = Number(drainText);
  // Before anything is opened or created: a host that cannot be listened on ends the start here.
  const hostProblem = await unusableHost(host);
  if (hostProblem !== null) {
    process.stderr.write(`tollgate: ${hostProblem}\n`);
    process.exit(2);
  }
  const loopback = isLoopback(host);
  const refuseWithoutKeys = (): never => {
    process.stderr.write(
      `tollgate: refusing to listen on ${host} without client keys: add auth.keys to the config (or make one with POST /admin/keys on a loopback start), or listen on 127.0.0.1\n`,
    );
    process.exit(2);
  };
  // A ledger file that is not there holds no keys either, and a refused start does not make one.
  if (config.auth.keys.length === 0 && !loopback && config.store.kind === 'sqlite' && !existsSync(config.store.path)) refuseWithoutKeys();

  // The price overrides file is read while the app is built: a bad one is a config problem too.
  // A gateway still stopping holds the SQLite file for up to its drain and hard exit: a new one
  // (a restart) waits at least that long for it, with 5 s to spare.
  const ledgerLockWaitMs = Math.max(OWNER_LOCK_WAIT_MS, drainMs + HARD_EXIT_AFTER_DRAIN_MS + 5_000);
  const app = await buildApp({ config, loadTokenizers: true, openWithoutKeys: loopback, ledgerLockWaitMs }).catch((err: unknown) => {
    exitIfConfigProblem(err);
    // The store could not be reached (PostgreSQL down, say): what it said, and which one, no stack.
    if (isStoreFailure(err)) {
      const where = config.store.kind === 'postgres' ? 'the PostgreSQL server of store.url' : `store.path ${config.store.path}`;
      process.stderr.write(`tollgate: cannot open the ledger (${where}): ${err.message}\n`);
      process.exit(1);
    }
    throw err;
  });
  // Keys are the config's or the operator API's (kept in the ledger): with neither, only loopback.
  if (config.auth.keys.length === 0 && !(await app.gateway.ledger.hasKeys())) {
    if (!loopback) {
      await app.close().catch(() => undefined);
      refuseWithoutKeys();
    }
    app.log.warn('no client keys (none in the config, none made with the operator API): every request is tenant "local"');
  }
  let closing = false;
  let firstSignalAt = 0;
  let stopNow: (() => void) | null = null;
  const shutdown = async (signal: string) => {
    // A second signal (Ctrl-C twice, an impatient supervisor): requests still running are stopped
    // at once, each settled for what it generated, rather than after the rest of the drain. One
    // that comes within a second is the same signal twice (npm passes on to its child what the
    // whole process group was sent, so the gateway gets it a couple of milliseconds apart).
    if (closing) {
      if (performance.now() - firstSignalAt >= SAME_SIGNAL_MS) stopNow?.();
      else app.log.debug({ signal }, 'the same signal again within a second: taken as one');
      return;
    }
    closing = true;
    firstSignalAt = performance.now();
    app.log.info({ signal, drainMs }, 'shutting down');
    // Stop taking connections, let requests in flight finish and settle, then close pools and the
    // store. A keep-alive connection goes as soon as it is idle (Fastify keeps one open 72 s).
    const idle = setInterval(() => app.server.closeIdleConnections(), 100);
    idle.unref();
    // Requests still running after the drain are stopped: each settles what was generated and ends
    // its response (a stream with a `shutting_down` error event) — none is left to be recovered,
    // charged in full, at the next start. 5 s past the drain the process exits regardless.
    const stop = (why: string) => {
      if (app.gateway.drain.signal.aborted) return;
      app.log.warn({ inFlight: app.gateway.inFlight.size }, why);
      app.gateway.drain.abort();
    };
    const drain = setTimeout(() => stop('requests still running at the drain deadline: stopping them'), drainMs);
    drain.unref();
    stopNow = () => {
      clearTimeout(drain);
      stop('a second signal: stopping the requests still running now');
    };
    // The log's last line says which way it went: stopped, or given up on.
    const timer = setTimeout(() => {
      app.log.error({ inFlight: app.gateway.inFlight.size, afterMs: drainMs + HARD_EXIT_AFTER_DRAIN_MS }, 'shutdown did not finish in time: exiting (1)');
      process.exit(1);
    }, drainMs + HARD_EXIT_AFTER_DRAIN_MS);
    timer.unref();
    await app.close();
    app.log.info({ signal }, 'stopped');
    process.exit(0);
  };
  // SIGINT and SIGTERM drain. A closed terminal or ssh session (and many `reload` scripts) send
  // SIGHUP, whose default ends the process at once and leaves every request in flight reserved,
  // charged in full at the next start: it drains too. (Config is read only at start: a reload is
  // a restart.)
  stopSignals.route((signal) => void shutdown(signal));

  try {
    await app.listen({ host, port });
  } catch (err) {
    // Another process has the address: say so plainly, with what to change (no stack needed).
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EADDRINUSE' || code === 'EADDRNOTAVAIL' || code === 'EACCES') {
      const why = code === 'EADDRINUSE' ? 'is already in use' : code === 'EACCES' ? 'may not be used by this user' : 'is not an address of this machine';
      process.stderr.write(`tollgate: cannot listen on ${host}:${port} (${code}): it ${why}; set TOLLGATE_HOST / TOLLGATE_PORT\n`);
      await app.close().catch(() => undefined);
      process.exit(1);
    }
    throw err;
  }
  // The port it got (TOLLGATE_PORT=0 asks for any free one).
  const address = app.server.address();
  const listening = typeof address === 'object' && address !== null ? address.port : port;
  // Which upstreams, of which kind and where: the zero-config default says what it chose.
  const upstreams = config.upstreams.map((u) => ({ name: u.name, kind: u.kind, baseUrl: u.baseUrl, models: u.models }));
  app.log.info({ host, port: listening, store: config.store.kind, upstreams }, 'tollgate listening');
}

main().catch((err: unknown) => {
  // Another gateway serves the SQLite file (ADR 0016): the message says what to do, no stack needed.
  // So does a ledger a newer Tollgate wrote.
  if (err instanceof Error && (err.name === 'LedgerInUseError' || err.name === 'LedgerSchemaTooNewError')) {
    process.stderr.write(`tollgate: ${err.message}\n`);
    process.exit(1);
  }
  process.stderr.write(`tollgate: failed to start: ${err instanceof Error ? err.stack ?? err.message : String(err)}\n`);
  process.exit(1);
});
