// One benchmark server per child process, so the load generator, the upstream and the proxy under
// test do not share an event loop (on 2 cores they still share the CPU, alike for every target).
// Usage (forked by bench/run.ts): serve.ts <upstream|bare|gateway-normal|gateway-full|gateway-postgres>
// Reports `{ url }` over IPC when listening; closes and exits on "stop" or when the parent goes away.

import { startBenchUpstream } from './upstream.js';
import { startBareProxy } from './bare-proxy.js';
import { startBenchGateway } from './gateway-target.js';

export type Role = 'upstream' | 'bare' | 'gateway-normal' | 'gateway-full' | 'gateway-postgres';

async function start(role: Role, upstreamUrl: string): Promise<{ url: string; close(): Promise<void> }> {
  switch (role) {
    case 'upstream':
      return startBenchUpstream({ delayMs: Number(process.env.BENCH_UPSTREAM_DELAY_MS ?? 0) });
    case 'bare':
      return startBareProxy(upstreamUrl);
    case 'gateway-normal':
      return startBenchGateway(upstreamUrl, { kind: 'sqlite', synchronous: 'NORMAL' });
    case 'gateway-full':
      return startBenchGateway(upstreamUrl, { kind: 'sqlite', synchronous: 'FULL' });
    case 'gateway-postgres':
      return startBenchGateway(upstreamUrl, { kind: 'postgres', url: process.env.TOLLGATE_TEST_PG_URL ?? '' });
  }
}

const role = process.argv[2] as Role;
const server = await start(role, process.env.BENCH_UPSTREAM_URL ?? '');
const stop = async () => {
  await server.close();
  process.exit(0);
};
process.on('message', (m) => {
  if (m === 'stop') void stop();
  // CPU time this process has used so far (µs), so the runner can report CPU per request.
  if (m === 'cpu') {
    const u = process.cpuUsage();
    process.send?.({ cpuMicros: u.user + u.system });
  }
});
process.on('disconnect', () => void stop());
process.send?.({ url: server.url });
