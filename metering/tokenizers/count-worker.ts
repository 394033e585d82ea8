// The body of one counting worker thread (ADR 0009). It counts texts with the very same
// `countBounded` the main thread uses, so a count is identical wherever it ran. Its encoders live
// in this thread's own WASM memory for the thread's whole life (SPEC §3: never recreate them).
import { parentPort } from 'node:worker_threads';
import { countBounded } from './bounded-encode.js';
import type { CountReply, CountRequest } from './count-protocol.js';

const port = parentPort;
if (port === null) throw new Error('count-worker.ts must run in a worker thread');

port.on('message', (req: CountRequest) => {
  if (req.kind === 'crash') {
    // Test hook: die the way a WASM abort or an out-of-memory would, mid-job, so the pool's
    // replacement path is exercised for real (test/tokenizers/worker-pool.test.ts).
    process.exit(70);
  }
  let reply: CountReply;
  try {
    reply = { id: req.id, counts: req.texts.map((text) => countBounded(req.encoding, text, req.exactRunBudget, req.preTokenBudget)) };
  } catch (err) {
    reply = { id: req.id, error: err instanceof Error ? err.message : String(err) };
  }
  port.postMessage(reply);
});
