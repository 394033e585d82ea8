// The worker must start from compiled JavaScript too (`dist/…/count-worker.js`, no tsx), not only
// from source under tsx: compile the tokenizers to a temp folder and count there in a plain node.
import t from 'tap';
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

const root = fileURLToPath(new URL('../../', import.meta.url));

function run(cmd: string, args: string[], cwd: string): Promise<{ code: number | null; out: string; err: string }> {
  return new Promise((resolve) => {
    const child = spawn(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '';
    let err = '';
    child.stdout.on('data', (b: Buffer) => (out += b.toString()));
    child.stderr.on('data', (b: Buffer) => (err += b.toString()));
    child.on('exit', (code) => resolve({ code, out, err }));
  });
}

t.test('compiled count-worker.js runs in plain node and gives the inline count', async (t) => {
  const dir = mkdtempSync(join(tmpdir(), 'tollgate-worker-'));
  t.teardown(() => rmSync(dir, { recursive: true, force: true }));
  // 1. compile the tokenizers and what they import, with the options of tsconfig.json (only these
  // files, so a colleague's half-written route elsewhere cannot fail this test)
  const tsc = join(root, 'node_modules/typescript/bin/tsc');
  const options = ['--target', 'ES2022', '--module', 'NodeNext', '--moduleResolution', 'NodeNext', '--strict', '--esModuleInterop', '--skipLibCheck'];
  const built = await run(
    process.execPath,
    [tsc, ...options, '--rootDir', '.', '--outDir', join(dir, 'dist'), 'metering/tokenizers/index.ts', 'metering/tokenizers/count-worker.ts'],
    root,
  );
  t.equal(built.code, 0, built.out + built.err);
  symlinkSync(join(root, 'node_modules'), join(dir, 'node_modules'));
  writeFileSync(join(dir, 'package.json'), '{"type":"module"}');
  // 2. count a large text through the pool, and the same text inline, with no tsx loaded
  writeFileSync(
    join(dir, 'count.mjs'),
    `import { TiktokenCounter, CountPool } from './dist/metering/tokenizers/index.js';
     import { TokenCache } from './dist/metering/token-cache.js';
     const text = 'compiled worker '.repeat(8000) + 'x'.repeat(5000);
     const pool = new CountPool();
     const pooled = new TiktokenCounter('o200k_base', { cache: new TokenCache(), pool });
     const inline = new TiktokenCounter('o200k_base', { cache: new TokenCache() });
     const a = await pooled.countText(text);
     const b = await inline.countText(text);
     console.log(JSON.stringify({ a, b, stats: pooled.stats() }));`,
  );
  const ran = await run(process.execPath, ['count.mjs'], dir);
  t.equal(ran.code, 0, ran.err);
  const { a, b, stats } = JSON.parse(ran.out) as { a: unknown; b: unknown; stats: unknown };
  t.same(stats, { inline: 0, pooled: 1 }, 'the count ran in the compiled worker');
  t.same(a, b, 'same count as inline');
});
