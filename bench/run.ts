// `npm run bench`: the gateway side by side with a bare pass-through proxy and the upstream itself
// (ADR 0008). Everything listens on 127.0.0.1; every loop is bounded by a request count.
//   1. Servers start in child processes: upstream, bare proxy, gateway (SQLite NORMAL, FULL, and
//      PostgreSQL when TOLLGATE_TEST_PG_URL is set).
//   2. Each target is warmed up, then measured in interleaved rounds (the order rotates every round)
//      so machine noise hits all targets alike: latency at concurrency 1, throughput at 16.
//   3. Counting benchmarks run in this process: a 100-turn conversation, pathological inputs.
// Prints markdown (paste into bench/RESULTS.md). BENCH_ROUNDS and BENCH_SCALE shrink or grow it.

import { fork, type ChildProcess } from 'node:child_process';
import { cpus, platform, release } from 'node:os';
import { fileURLToPath } from 'node:url';
import { dirname, join } from 'node:path';
import { performance } from 'node:perf_hooks';
import { runLoad } from './load.js';
import { chatBody } from './workload.js';
import { percentile, median, mean, fmt, table } from './stats.js';
import { conversationBench, pathologicalBench } from './counting.js';
import type { Role } from './serve.js';

const ROUNDS = Math.max(1, Number(process.env.BENCH_ROUNDS ?? 5));
const SCALE = Math.max(0.05, Number(process.env.BENCH_SCALE ?? 1));
const LATENCY = { concurrency: 1, requests: Math.round(150 * SCALE) };
const THROUGHPUT = { concurrency: 16, requests: Math.round(600 * SCALE) };
const WARMUP = Math.round(300 * SCALE);
const here = dirname(fileURLToPath(import.meta.url));
const root = join(here, '..');

interface Child {
  proc: ChildProcess;
  url: string;
}

function spawn(role: Role, env: NodeJS.ProcessEnv = {}): Promise<Child> {
  // BENCH_CPU_PROF=<dir>: the SQLite NORMAL gateway writes a V8 CPU profile there when it stops.
  const prof = process.env.BENCH_CPU_PROF && role === 'gateway-normal' ? ['--cpu-prof', '--cpu-prof-dir', process.env.BENCH_CPU_PROF] : [];
  const proc = fork(join(here, 'serve.ts'), [role], { cwd: root, execArgv: ['--import', 'tsx', ...prof], env: { ...process.env, ...env }, stdio: ['ignore', 'inherit', 'inherit', 'ipc'] });
  return new Promise((resolve, reject) => {
    proc.once('message', (m) => resolve({ proc, url: (m as { url: string }).url }));
    proc.once('exit', (code) => reject(new Error(`bench server "${role}" exited with ${code}`)));
  });
}

function cpuMicros(c: Child): Promise<number> {
  return new Promise((resolve) => {
    const onMessage = (m: unknown) => {
      if (typeof m === 'object' && m !== null && 'cpuMicros' in m) {
        c.proc.off('message', onMessage);
        resolve((m as { cpuMicros: number }).cpuMicros);
      }
    };
    c.proc.on('message', onMessage);
    c.proc.send('cpu');
  });
}

async function stopChild(c: Child): Promise<void> {
  if (c.proc.exitCode !== null) return;
  const exited = new Promise<void>((resolve) => c.proc.once('exit', () => resolve()));
  c.proc.send('stop');
  await exited;
}

interface Target {
  name: string;
  url: string;
  /** The process serving this target (its CPU time per request is reported). */
  child: Child;
  headers: Record<string, string>;
}

type Mode = 'json' | 'stream';
type Phase = 'latency' | 'throughput';
const MODES: Mode[] = ['json', 'stream'];

async function sideBySide(targets: Target[]) {
  const samples = new Map<string, { lat: number[]; rps: number[]; cpuMs: number[] }>();
  const slot = (t: string, m: Mode, p: Phase) => {
    const k = `${t}|${m}|${p}`;
    let s = samples.get(k);
    if (!s) samples.set(k, (s = { lat: [], rps: [], cpuMs: [] }));
    return s;
  };
  let index = 0;
  const trial = async (t: Target, mode: Mode, shape: { concurrency: number; requests: number }) => {
    const r = await runLoad({ url: t.url, path: '/v1/chat/completions', headers: t.headers, body: (i) => chatBody(i, mode === 'stream'), firstIndex: index, ...shape });
    index += shape.requests;
    return r;
  };
  // 1. Warm-up: JIT, connection pools, the SQLite file and tokenizer; not measured.
  for (const t of targets) for (const mode of MODES) await trial(t, mode, { concurrency: 8, requests: WARMUP });
  // 2. Interleaved rounds; the order rotates (and reverses every other round).
  for (let round = 0; round < ROUNDS; round++) {
    const rotated = targets.map((_, i) => targets[(i + round) % targets.length]);
    const order = round % 2 === 0 ? rotated : rotated.reverse();
    for (const mode of MODES) {
      for (const [phase, shape] of [['latency', LATENCY], ['throughput', THROUGHPUT]] as const) {
        for (const t of order) {
          const cpuBefore = await cpuMicros(t.child);
          const r = await trial(t, mode, shape);
          const cpuAfter = await cpuMicros(t.child);
          const s = slot(t.name, mode, phase);
          s.lat.push(...r.latenciesMs);
          s.rps.push(r.rps);
          s.cpuMs.push((cpuAfter - cpuBefore) / 1000 / shape.requests);
        }
      }
    }
    process.stderr.write(`round ${round + 1}/${ROUNDS} done\n`);
  }
  return slot;
}

function verdict(ok: boolean): string {
  return ok ? 'meets' : '**misses**';
}

type Slot = Awaited<ReturnType<typeof sideBySide>>;

function ratioTable(slot: Slot, targets: Target[]): string {
  const ratios: string[][] = [];
  for (const mode of MODES) {
    const direct = median(slot('upstream direct', mode, 'latency').lat);
    const bareP50 = median(slot('bare proxy', mode, 'latency').lat);
    const bareRps = median(slot('bare proxy', mode, 'throughput').rps);
    for (const t of targets.filter((x) => x.name.startsWith('gateway'))) {
      const p50 = median(slot(t.name, mode, 'latency').lat);
      const rps = median(slot(t.name, mode, 'throughput').rps);
      const p50Ratio = p50 / bareP50;
      const rpsRatio = rps / bareRps;
      ratios.push([
        t.name,
        mode,
        `${fmt(p50Ratio)}× (${verdict(p50Ratio <= 1.25)})`,
        `${fmt(p50 - direct)} vs ${fmt(bareP50 - direct)} ms (${fmt((p50 - direct) / (bareP50 - direct), 1)}×)`,
        `${fmt(rpsRatio)}× (${verdict(rpsRatio >= 0.8)})`,
      ]);
    }
  }
  return table(['gateway', 'mode', 'p50 gateway / bare', 'added p50: gateway vs bare', 'throughput gateway / bare'], ratios);
}

const AUTH = { 'content-type': 'application/json', authorization: 'Bearer tg-bench' };

/** Starts the upstream and the proxies in front of it; returns them as targets (and the children to stop). */
async function startTargets(upstreamEnv: NodeJS.ProcessEnv, gateways: Array<[name: string, role: Role]>) {
  const upstream = await spawn('upstream', upstreamEnv);
  const children: Child[] = [upstream];
  const env = { BENCH_UPSTREAM_URL: upstream.url };
  const targets: Target[] = [{ name: 'upstream direct', url: upstream.url, child: upstream, headers: { 'content-type': 'application/json' } }];
  try {
    for (const [name, role] of [['bare proxy', 'bare'] as [string, Role], ...gateways]) {
      const child = await spawn(role, env);
      children.push(child);
      targets.push({ name, url: child.url, child, headers: AUTH });
    }
  } catch (err) {
    for (const c of children.reverse()) await stopChild(c);
    throw err;
  }
  return { targets, children };
}

/** The same comparison in front of an upstream that takes as long as a fast model to answer. */
async function modelLike(out: string[], delayMs: number): Promise<void> {
  const { targets, children } = await startTargets({ BENCH_UPSTREAM_DELAY_MS: String(delayMs) }, [['gateway (SQLite NORMAL)', 'gateway-normal']]);
  try {
    const slot = await sideBySide(targets);
    out.push(`## In front of a model-like upstream (${delayMs} ms before it answers)`);
    out.push('');
    const rows: string[][] = [];
    for (const mode of MODES) {
      for (const t of targets) {
        const l = slot(t.name, mode, 'latency').lat;
        const th = slot(t.name, mode, 'throughput');
        rows.push([t.name, mode, fmt(median(l)), fmt(percentile(l, 99)), fmt(median(th.rps), 0)]);
      }
    }
    out.push(table(['target', 'mode', 'p50 ms (c=1)', 'p99 ms (c=1)', `req/s (c=${THROUGHPUT.concurrency})`], rows));
    out.push('');
    out.push(ratioTable(slot, targets));
    out.push('');
  } finally {
    for (const c of children.reverse()) await stopChild(c);
  }
}

/** The gateway beside a bare proxy and the upstream itself, upstream answering at once. */
async function proxyBench(out: string[]): Promise<void> {
  const gateways: Array<[string, Role]> = [
    ['gateway (SQLite NORMAL)', 'gateway-normal'],
    ['gateway (SQLite FULL)', 'gateway-full'],
  ];
  if (process.env.TOLLGATE_TEST_PG_URL) gateways.push(['gateway (PostgreSQL)', 'gateway-postgres']);
  const { targets, children } = await startTargets({}, gateways);
  try {
    const slot = await sideBySide(targets);

    out.push('## Latency and throughput, side by side');
    out.push('');
    const rows: string[][] = [];
    for (const mode of MODES) {
      const direct = median(slot('upstream direct', mode, 'latency').lat);
      for (const t of targets) {
        const l = slot(t.name, mode, 'latency').lat;
        const th = slot(t.name, mode, 'throughput');
        rows.push([
          t.name,
          mode,
          fmt(median(l)),
          fmt(percentile(l, 99)),
          t.name === 'upstream direct' ? '—' : fmt(median(l) - direct),
          fmt(median(th.rps), 0),
          fmt(median(th.lat)),
          fmt(percentile(th.lat, 99)),
          fmt(median([...slot(t.name, mode, 'latency').cpuMs, ...th.cpuMs]), 3),
        ]);
      }
    }
    out.push(table(['target', 'mode', 'p50 ms (c=1)', 'p99 ms (c=1)', 'added p50 ms vs direct', `req/s (c=${THROUGHPUT.concurrency})`, `p50 ms (c=${THROUGHPUT.concurrency})`, `p99 ms (c=${THROUGHPUT.concurrency})`, 'CPU ms / request (its process)'], rows));
    out.push('');
    out.push('## Ratios: gateway vs bare proxy (targets: p50 ≤ 1.25×, throughput ≥ 0.8×)');
    out.push('');
    out.push(ratioTable(slot, targets));
    out.push('');
  } finally {
    for (const c of children.reverse()) await stopChild(c);
  }

}

/** Counting: a 100-turn conversation, and pathological input without spaces. */
async function countingBench(out: string[]): Promise<void> {
  process.stderr.write('counting benchmarks…\n');
  const conv = await conversationBench();
  const n = conv.planMs.length;
  out.push(`## ${n}-turn conversation (median over ${conv.conversations / 2} conversations each)`);
  out.push('');
  const first10 = (a: number[]) => mean(a.slice(0, 10));
  const last10 = (a: number[]) => mean(a.slice(-10));
  out.push(
    table(
      ['measure', 'turn 1 ms', `turn ${n} ms`, `turn ${n} / turn 1`, 'turns 1–10 mean ms', `turns ${n - 9}–${n} mean ms`, 'last 10 / first 10 (target ≤ 1.2×)'],
      [
        ['plan() (new messages not yet counted)', conv.planMs, ''] as const,
        ['tollgate_gateway_overhead_seconds, over HTTP', conv.overheadMs, ''] as const,
      ].map(([label, a]) => [label, fmt(a[0], 3), fmt(a[n - 1], 3), `${fmt(a[n - 1] / a[0])}×`, fmt(first10(a), 3), fmt(last10(a), 3), `${fmt(last10(a) / first10(a))}× (${verdict(last10(a) / first10(a) <= 1.2)})`]),
    ),
  );
  out.push('');
  const patho = await pathologicalBench();
  out.push('## Pathological input without spaces: plan() time (target: linear, 1 MB ≤ 20 ms)');
  out.push('');
  out.push(
    table(
      ['shape', 'size', 'plan ms (median of 5)', 'ms per 100 KB', 'tokens counted', 'count method'],
      patho.map((r) => [r.shape, r.bytes >= 1e6 ? `${r.bytes / 1e6} MB` : `${r.bytes / 1e3} KB`, fmt(r.planMs), fmt((r.planMs / r.bytes) * 1e5), String(r.tokens), r.countMethod]),
    ),
  );
  out.push('');
  for (const shape of ['repeated', 'random'] as const) {
    const byBytes = new Map(patho.filter((r) => r.shape === shape).map((r) => [r.bytes, r.planMs]));
    const mb = byBytes.get(1_000_000) ?? NaN;
    out.push(
      `- ${shape}: 100 KB / 10 KB = ${fmt((byBytes.get(100_000) ?? NaN) / (byBytes.get(10_000) ?? NaN), 1)}×, 1 MB / 100 KB = ${fmt(mb / (byBytes.get(100_000) ?? NaN), 1)}× (linear is 10×); 1 MB in ${fmt(mb)} ms (${verdict(mb <= 20)}).`,
    );
  }
  out.push('');
}

async function main(): Promise<void> {
  const started = performance.now();
  const out: string[] = [];
  const cpu = cpus();
  out.push(`# Tollgate bench — ${new Date().toISOString()}`);
  out.push('');
  out.push(`Machine: ${cpu.length} cores (${cpu[0]?.model.trim() ?? 'unknown'}), ${platform()} ${release()}, Node ${process.version}.`);
  out.push(`Rounds: ${ROUNDS}; per round and target: latency ${LATENCY.requests} requests at concurrency ${LATENCY.concurrency}, throughput ${THROUGHPUT.requests} at concurrency ${THROUGHPUT.concurrency}.`);
  out.push('');

  // BENCH_PARTS: a comma list of proxy, model, counting (default: all).
  const parts = new Set((process.env.BENCH_PARTS ?? 'proxy,model,counting').split(',').map((p) => p.trim()));
  if (parts.has('proxy')) await proxyBench(out);
  if (parts.has('model')) {
    process.stderr.write('model-like upstream…\n');
    await modelLike(out, Number(process.env.BENCH_MODEL_DELAY_MS ?? 25));
  }
  if (parts.has('counting')) await countingBench(out);
  out.push(`Whole run: ${fmt((performance.now() - started) / 1000, 0)} s.`);
  process.stdout.write(`${out.join('\n')}\n`);
}

await main();
