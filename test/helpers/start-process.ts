// Starting server/main.ts as a process, for the start-up tests (SPEC §8): in a temp folder, with
// only the environment a test gives it, killed at teardown.

import type { Test } from 'tap';
import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

export const root = new URL('../..', import.meta.url).pathname;
// The process runs in a temp folder (the default ledger file lands there), so tsx is given by URL.
const tsx = import.meta.resolve('tsx');

export interface Started {
  child: ChildProcess;
  stdout: () => string;
  stderr: () => string;
  exited: Promise<number | null>;
}

export function start(cwd: string, env: Record<string, string>, uid?: number): Started {
  // Only what the test chooses: no TOLLGATE_CONFIG, OPENAI_* or TOLLGATE_HOST from the outer shell.
  const base: Record<string, string> = { PATH: process.env.PATH ?? '', HOME: process.env.HOME ?? cwd };
  const child = spawn(process.execPath, ['--import', tsx, join(root, 'server/main.ts')], {
    cwd,
    env: { ...base, ...env },
    stdio: ['ignore', 'pipe', 'pipe'],
    ...(uid === undefined ? {} : { uid, gid: uid }),
  });
  let out = '';
  let err = '';
  child.stdout?.on('data', (d: Buffer) => (out += d.toString('utf8')));
  child.stderr?.on('data', (d: Buffer) => (err += d.toString('utf8')));
  const exited = new Promise<number | null>((resolve) => child.on('exit', (code) => resolve(code)));
  return { child, stdout: () => out, stderr: () => err, exited };
}

/** A SQLite ledger in `dir` and one llama.cpp upstream that is not there, plus `extra`. */
export const minimalConfig = (dir: string, extra: Record<string, unknown>) => ({
  store: { kind: 'sqlite', path: join(dir, 'ledger.db') },
  upstreams: [{ name: 'local', kind: 'llamacpp', baseUrl: 'http://127.0.0.1:9' }],
  ...extra,
});

/** Writes `raw` as the config file in `dir` and starts the gateway with it; killed at teardown. */
export function startConfigured(t: Test, dir: string, raw: unknown, env: Record<string, string>, uid?: number): Started {
  const config = join(dir, 'config.json');
  writeFileSync(config, JSON.stringify(raw));
  const s = start(dir, { ...env, TOLLGATE_CONFIG: config }, uid);
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  return s;
}

export async function waitHealthy(url: string, s: Started): Promise<void> {
  let done = false;
  void s.exited.then(() => (done = true));
  while (!done) {
    try {
      if ((await fetch(`${url}/healthz`)).ok) {
        // What the start logged reaches this process by a pipe, which the answer can overtake: the
        // line Fastify writes once listening comes after every line of the start.
        for (let i = 0; i < 50 && !s.stdout().includes('Server listening at'); i++) await new Promise((r) => setTimeout(r, 20));
        return;
      }
    } catch {
      // not listening yet
    }
    await new Promise((r) => setTimeout(r, 100));
  }
  throw new Error(`gateway exited before answering: ${s.stderr()}`);
}

export function tempDir(t: { teardown(fn: () => void): void }): string {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-start-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  return dir;
}

/** Resolves with the exit code, or 'listening' once the start-up line says so (killed at teardown). */
export async function exitedOrListening(t: Test, s: Started): Promise<number | null | 'listening'> {
  t.teardown(() => {
    s.child.kill('SIGKILL');
  });
  let code: number | null | undefined;
  void s.exited.then((c) => (code = c));
  while (code === undefined && !s.stdout().includes('tollgate listening')) await new Promise((r) => setTimeout(r, 50));
  return code === undefined ? 'listening' : code;
}
