// Helpers for tests that drive the gateway with the official openai SDK.

import OpenAI from 'openai';

/** The HTTP status of the SDK error a call rejects with (null when it does not reject). */
export async function sdkStatus(call: Promise<unknown>): Promise<number | null> {
  try {
    await call;
    return null;
  } catch (err) {
    if (err instanceof OpenAI.APIError) return err.status ?? null;
    throw err;
  }
}
