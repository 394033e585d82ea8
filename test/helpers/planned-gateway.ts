// A gateway in front of the OpenAI double, with the two calls the upper-bound regressions make:
// `post` (any route, the JSON answer) and `plan` (the /v1/admission answer for a request).

import type { Test } from 'tap';
import { startOpenAiDouble } from '../doubles/openai.js';
import { startGateway, openaiUpstream } from './gateway.js';

export type Body = Record<string, unknown> & { error: Record<string, unknown> };

export interface Planned {
  row_tokens: number[];
  sum_tokens: number;
  count_method: string;
  count_is_upper_bound: boolean;
  mode: string;
  verdict: { admit: boolean; status: number; error: Body | null };
}

export async function plannedGateway(t: Test, raw: Record<string, unknown>, upstreamExtra: Record<string, unknown> = {}) {
  const upstream = await startOpenAiDouble();
  t.teardown(upstream.close);
  const gw = await startGateway(t, { upstreams: [openaiUpstream(upstream.url, upstreamExtra)], ...raw });
  const post = async (path: string, body: unknown) => {
    const res = await fetch(`${gw.url}${path}`, { method: 'POST', headers: { 'content-type': 'application/json' }, body: JSON.stringify(body) });
    return { status: res.status, headers: res.headers, body: (await res.json()) as Body };
  };
  const plan = async (endpoint: string, request: Record<string, unknown>) =>
    (await post('/v1/admission', { endpoint, request })).body as unknown as Planned;
  return { upstream, gw, post, plan };
}
