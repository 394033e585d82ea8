// Real gateway processes for tests that kill them: `node --import tsx server/main.ts`.

import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';

const root = new URL('../..', import.meta.url).pathname;

export async function freePort(): Promise<number> {
  return new Promise((resolve) => {
    const s = createServer();
    s.listen(0, '127.0.0.1', () => {
      const port = (s.address() as { port: number }).port;
      s.close(() => resolve(port));
    });
  });
}

export async function waitHealthy(url: string, child?: ChildProcess): Promise<void> {
  for (let i = 0; i < 300; i++) {
    if (child && child.exitCode !== null) throw new Error(`gateway exited with ${child.exitCode}`);
    try {
      if ((await fetch(`${url}/healthz`)).ok) return;
    } catch {
      // still starting
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error('gateway did not start');
}

/** Starts `server/main.ts` with this config on a free port and waits until it is healthy. */
export async function startGatewayProcess(configPath: string, env: NodeJS.ProcessEnv = {}): Promise<{ url: string; child: ChildProcess }> {
  const port = await freePort();
  const child = spawn(process.execPath, ['--import', 'tsx', join(root, 'server/main.ts')], {
    cwd: root,
    env: { ...process.env, TOLLGATE_CONFIG: configPath, TOLLGATE_PORT: String(port), TOLLGATE_ADMIN_TOKEN: 'admin-secret', ...env },
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  const url = `http://127.0.0.1:${port}`;
  try {
    await waitHealthy(url, child);
  } catch (err) {
    child.kill('SIGKILL');
    throw err;
  }
  return { url, child };
}

/**
 * A config file in a fresh temp folder (removed at teardown) for a gateway process in front of the
 * OpenAI double at `upstreamUrl`: an SQLite ledger in the same folder, `gpt-*` models, billing local.
 */
export function processConfig(t: { teardown(fn: () => void): void }, upstreamUrl: string, prefix: string): { dir: string; configPath: string } {
  const dir = mkdtempSync(join(tmpdir(), prefix));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  const configPath = join(dir, 'config.json');
  writeFileSync(
    configPath,
    JSON.stringify({
      store: { kind: 'sqlite', path: join(dir, 'ledger.db') },
      upstreams: [{ name: 'openai', kind: 'openai', baseUrl: `${upstreamUrl}/v1`, models: ['gpt-*'], billing: 'local' }],
      logging: { level: 'silent' },
    }),
  );
  return { dir, configPath };
}
