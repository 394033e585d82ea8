// Client keys → tenants. Keys are kept only as SHA-256 hashes, in memory (config keys) and in the
// ledger (keys made with the operator API). Looking a key up by its hash compares hashes, never the
// secret itself, so timing tells an attacker nothing about a key (ADR 0002).

import { createHash, timingSafeEqual } from 'node:crypto';
import type { Config, KeyConfig, RunBoundsConfig } from './config.js';
import type { Ledger } from '../metering/ledger.js';
import { GatewayError } from './errors.js';

/** Every request's tenant when no keys are configured (SPEC §8). */
export const OPEN_TENANT = 'local';

export interface Principal {
  tenant: string;
  keyId: string | null;
  /** Run-bound overrides from the key's configuration (tenant overrides are applied separately). */
  runs: Partial<RunBoundsConfig>;
}

export function hashKey(key: string): string {
  return createHash('sha256').update(key, 'utf8').digest('hex');
}

export function bearer(header: string | string[] | undefined): string | null {
  const value = Array.isArray(header) ? header[0] : header;
  if (!value) return null;
  const m = /^Bearer\s+(.+)$/i.exec(value.trim());
  return m ? m[1].trim() : null;
}

/** How long an open gateway trusts its last look at the ledger's keys (another replica may make one). */
const STORED_KEYS_TTL_MS = 1000;

export interface AuthOptions {
  /**
   * Whether the gateway may serve without keys (SPEC §8: on loopback only). False on any other
   * address: there, a gateway whose operator-made keys were all deleted refuses every request.
   */
  openWithoutKeys?: boolean;
  /**
   * A monotonic clock (ms) for how long the last look at the keys holds: with the wall clock, a
   * step back of an hour kept a replica open for that hour after a key was made elsewhere.
   */
  now?: () => number;
}

export class Authenticator {
  private readonly configured = new Map<string, { key: KeyConfig; id: string }>();
  private readonly openWithoutKeys: boolean;
  private readonly now: () => number;
  /** The ledger has operator-made keys (as last looked), and until when that look holds. */
  private stored: { any: boolean; until: number } | null = null;

  constructor(
    private readonly config: Config,
    private readonly ledger: Ledger,
    options: AuthOptions = {},
  ) {
    this.openWithoutKeys = options.openWithoutKeys ?? true;
    this.now = options.now ?? (() => performance.now());
    for (const key of config.auth.keys) {
      const hash = hashKey(key.key);
      // A stable, non-secret id for a configured key: a prefix of its hash.
      this.configured.set(hash, { key, id: `cfg-${hash.slice(0, 12)}` });
    }
  }

  /** The config file's keys, as the operator API lists them: their ids and tenants, never the keys. */
  configuredKeys(): Array<{ id: string; tenant: string }> {
    return [...this.configured.values()].map(({ key, id }) => ({ id, tenant: key.tenant }));
  }

  /**
   * With no keys at all — none in the config, none made with the operator API — the gateway is a
   * loopback-only development setup where every request is tenant `local` (SPEC §8). One key made
   * with the operator API is enough to close it: a key the operator made is meant to be needed.
   */
  async open(): Promise<boolean> {
    if (this.configured.size > 0 || !this.openWithoutKeys) return false;
    const at = this.now();
    if (this.stored === null || at >= this.stored.until) {
      this.stored = { any: await this.ledger.hasKeys(), until: at + STORED_KEYS_TTL_MS };
    }
    return !this.stored.any;
  }

  /** The operator API made or deleted a key: look again at the next request. */
  keysChanged(): void {
    this.stored = null;
  }

  /** `authorization`: the header as sent, every copy of it (IncomingMessage.headersDistinct), or one value. */
  async authenticate(authorization: string | string[] | undefined): Promise<Principal> {
    // Node keeps the first of two Authorization headers: two keys are refused, not one picked.
    if (Array.isArray(authorization) && authorization.length > 1 && !(await this.open())) {
      throw new GatewayError('invalid_api_key', `Authorization sent ${authorization.length} times: send one key`);
    }
    const token = bearer(authorization);
    if (token) {
      const hash = hashKey(token);
      const cfg = this.configured.get(hash);
      if (cfg) return { tenant: cfg.key.tenant, keyId: cfg.id, runs: cfg.key.runs };
      const stored = await this.ledger.findKeyByHash(hash);
      if (stored) return { tenant: stored.tenant, keyId: stored.id, runs: {} };
    }
    if (await this.open()) return { tenant: OPEN_TENANT, keyId: null, runs: {} };
    if (!token) {
      // (What it holds is not quoted back: it may be a key sent without its scheme.)
      const sent = Array.isArray(authorization) ? authorization[0] : authorization;
      const how = sent?.trim() ? 'the Authorization header holds no Bearer key' : 'missing API key';
      throw new GatewayError('missing_api_key', `${how}: send "Authorization: Bearer tg-…"`);
    }
    throw new GatewayError('invalid_api_key', 'invalid API key');
  }
}

/** Constant-time comparison for the admin token. */
export function sameSecret(a: string, b: string): boolean {
  const ha = createHash('sha256').update(a).digest();
  const hb = createHash('sha256').update(b).digest();
  return timingSafeEqual(ha, hb);
}
