// A lean, fast OpenAI-compatible upstream for the benchmark: no recording, no knobs, responses
// built from a template. It answers POST /v1/chat/completions with `completionTokens` words (capped
// by the request's max_completion_tokens / max_tokens), streamed as one SSE event per token, with
// the usage chunk when `stream_options.include_usage` is set — the shapes OpenAI sends.
// test/doubles/openai.ts records every request, which would grow without bound under load.

import { createServer, type IncomingMessage } from 'node:http';
import type { AddressInfo } from 'node:net';

export interface BenchUpstream {
  url: string;
  close(): Promise<void>;
}

export interface BenchUpstreamOptions {
  /** Tokens generated per request (" tok" each: one token in o200k/cl100k). Default 128. */
  completionTokens?: number;
  /** Time before the response starts, like a model's time to first token. Default 0. */
  delayMs?: number;
}

async function readJson(req: IncomingMessage): Promise<Record<string, unknown> | null> {
  const chunks: Buffer[] = [];
  for await (const c of req) chunks.push(c as Buffer);
  try {
    const v: unknown = JSON.parse(Buffer.concat(chunks).toString('utf8'));
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

export async function startBenchUpstream(opts: BenchUpstreamOptions = {}): Promise<BenchUpstream> {
  const want = opts.completionTokens ?? 128;
  let seq = 0;
  const server = createServer(async (req, res) => {
    const body = await readJson(req);
    if (req.method !== 'POST' || !body || !String(req.url).endsWith('/chat/completions')) {
      res.writeHead(404, { 'content-type': 'application/json' });
      res.end('{"error":{"message":"not found","type":"invalid_request_error","param":null,"code":null}}');
      return;
    }
    if (opts.delayMs) await new Promise((r) => setTimeout(r, opts.delayMs));
    const model = String(body.model);
    const max = Number(body.max_completion_tokens ?? body.max_tokens ?? want);
    const count = Math.min(want, max);
    const finish = count < want ? 'length' : 'stop';
    const messages = JSON.stringify(body.messages ?? '');
    const promptTokens = Math.ceil(messages.length / 4);
    const usage = { prompt_tokens: promptTokens, completion_tokens: count, total_tokens: promptTokens + count, prompt_tokens_details: { cached_tokens: 0 } };
    const id = `chatcmpl-bench-${++seq}`;
    const created = Math.floor(Date.now() / 1000);
    if (body.stream !== true) {
      res.writeHead(200, { 'content-type': 'application/json' });
      res.end(
        JSON.stringify({
          id,
          object: 'chat.completion',
          created,
          model,
          choices: [{ index: 0, message: { role: 'assistant', content: ' tok'.repeat(count) }, finish_reason: finish }],
          usage,
        }),
      );
      return;
    }
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    // With include_usage OpenAI ends every chunk with `"usage":null`, and sends the figures last.
    const so = body.stream_options as { include_usage?: unknown } | undefined;
    const withUsage = so?.include_usage === true;
    const tail = withUsage ? ',"usage":null}' : '}';
    const head = `{"id":"${id}","object":"chat.completion.chunk","created":${created},"model":${JSON.stringify(model)},"choices":`;
    res.write(`data: ${head}[{"index":0,"delta":{"role":"assistant","content":""},"finish_reason":null}]${tail}\n\n`);
    const tokenEvent = `data: ${head}[{"index":0,"delta":{"content":" tok"},"finish_reason":null}]${tail}\n\n`;
    for (let i = 0; i < count; i++) res.write(tokenEvent);
    res.write(`data: ${head}[{"index":0,"delta":{},"finish_reason":"${finish}"}]${tail}\n\n`);
    if (withUsage) res.write(`data: ${head}[],"usage":${JSON.stringify(usage)}}\n\n`);
    res.end('data: [DONE]\n\n');
  });
  server.keepAliveTimeout = 30_000;
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  return {
    url: `http://127.0.0.1:${port}`,
    close: () =>
      new Promise<void>((resolve) => {
        server.closeAllConnections();
        server.close(() => resolve());
      }),
  };
}
