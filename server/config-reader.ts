// A small typed reader over untrusted JSON that names the exact field on error
// (`upstreams[1].baseUrl: must be a URL`). Used for the config file; it fails on the first problem.

export class ConfigError extends Error {
  override name = 'ConfigError';
}

type Obj = Record<string, unknown>;

function isObj(v: unknown): v is Obj {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

export class Reader {
  private readonly value: Obj;
  /** Fields asked for (present or not): what this object may hold. */
  private readonly known = new Set<string>();
  private readonly children: Reader[] = [];

  constructor(
    value: unknown,
    private readonly path: string,
  ) {
    if (!isObj(value)) throw new ConfigError(`${path || '(config)'}: must be an object`);
    this.value = value;
  }

  private at(key: string): string {
    return this.path ? `${this.path}.${key}` : key;
  }

  fail(key: string, message: string): never {
    const where = key.includes('.') || key.includes('[') ? key : this.at(key);
    throw new ConfigError(`${where}: ${message}`);
  }

  has(key: string): boolean {
    return this.peek(key) !== undefined;
  }

  private peek(key: string): unknown {
    this.known.add(key);
    return this.value[key];
  }

  /**
   * Fails on the first field, here or in any object or list read through this reader, that no
   * reader asked for: a typo (`monthlyBudget` for `monthlyBudgetUsd`) must not pass as "no budget".
   * Call once everything has been read.
   */
  rejectUnknown(): void {
    for (const k of Object.keys(this.value)) {
      if (!this.known.has(k)) this.fail(k, `unknown field (expected one of ${[...this.known].join(', ')})`);
    }
    for (const child of this.children) child.rejectUnknown();
  }

  allowOnly(keys: string[]): void {
    for (const k of Object.keys(this.value)) {
      if (!keys.includes(k)) this.fail(k, `unknown field (expected one of ${keys.join(', ')})`);
    }
  }

  private get(key: string, fallback: unknown): unknown {
    const v = this.peek(key);
    if (v === undefined) {
      if (fallback === undefined) this.fail(key, 'is required');
      return fallback;
    }
    return v;
  }

  obj(key: string): Reader {
    const v = this.peek(key);
    return this.child(new Reader(v === undefined ? {} : v, this.at(key)));
  }

  private child(r: Reader): Reader {
    this.children.push(r);
    return r;
  }

  str(key: string, fallback: string | undefined): string | undefined {
    const v = this.get(key, fallback);
    if (typeof v !== 'string' || v.length === 0) this.fail(key, 'must be a non-empty string');
    return v as string;
  }

  strOrNull(key: string, fallback: string | null): string | null | undefined {
    const v = this.peek(key) === undefined ? fallback : this.value[key];
    if (v === null) return null;
    if (typeof v !== 'string' || v.length === 0) this.fail(key, 'must be a non-empty string or null');
    return v as string;
  }

  url(key: string, fallback: string | undefined): string | undefined {
    const v = this.get(key, fallback);
    let ok = typeof v === 'string';
    let parsed: URL | null = null;
    if (ok) {
      try {
        parsed = new URL(v as string);
        ok = parsed.protocol === 'http:' || parsed.protocol === 'https:';
      } catch {
        ok = false;
      }
    }
    if (!ok) this.fail(key, 'must be a URL (http:// or https://)');
    // Requests go to the base URL's origin and path: a query, a fragment or credentials in it would
    // be dropped without a word (a key belongs in apiKeyEnv).
    if (parsed && (parsed.search !== '' || parsed.hash !== '' || parsed.username !== '' || parsed.password !== '')) {
      this.fail(key, 'must be a URL without a query, a fragment or credentials (put a key in apiKeyEnv)');
    }
    return (v as string).replace(/\/+$/, '');
  }

  bool(key: string, fallback: boolean | undefined): boolean | undefined {
    const v = this.get(key, fallback);
    if (typeof v !== 'boolean') this.fail(key, 'must be true or false');
    return v as boolean;
  }

  int(key: string, fallback: number | undefined, min: number, max: number): number | undefined {
    const v = this.peek(key) === undefined ? fallback : this.value[key];
    if (v === undefined) return undefined;
    if (typeof v !== 'number' || !Number.isInteger(v) || v < min || v > max) {
      this.fail(key, `must be an integer from ${min} to ${max}`);
    }
    return v as number;
  }

  intOrNull(key: string, fallback: number | null | undefined, min: number, max: number): number | null | undefined {
    if (this.peek(key) === null) return null;
    return this.int(key, fallback ?? undefined, min, max) ?? (fallback === null ? null : undefined);
  }

  numOrNull(key: string, fallback: number | null, min: number): number | null | undefined {
    const v = this.peek(key) === undefined ? fallback : this.value[key];
    if (v === null) return null;
    if (typeof v !== 'number' || !Number.isFinite(v) || v < min) this.fail(key, `must be a number ≥ ${min} or null`);
    return v as number;
  }

  oneOf<T extends string>(key: string, options: readonly T[], fallback: T | undefined): T | undefined {
    const v = this.get(key, fallback);
    if (typeof v !== 'string' || !options.includes(v as T)) {
      this.fail(key, `must be one of ${options.map((o) => `"${o}"`).join(', ')}`);
    }
    return v as T;
  }

  strList(key: string, fallback: string[] | undefined, nonEmpty = false): string[] | undefined {
    const v = this.get(key, fallback);
    if (!Array.isArray(v)) this.fail(key, 'must be a list of strings');
    if (nonEmpty && (v as unknown[]).length === 0) this.fail(key, 'must name at least one model or pattern');
    (v as unknown[]).forEach((s, i) => {
      if (typeof s !== 'string' || s.length === 0) this.fail(`${this.at(key)}[${i}]`, 'must be a non-empty string');
    });
    return [...(v as string[])];
  }

  list<T>(key: string, fallback: unknown[] | undefined, each: (r: Reader) => T): T[] {
    const v = this.get(key, fallback);
    if (!Array.isArray(v)) this.fail(key, 'must be a list');
    return (v as unknown[]).map((item, i) => each(this.child(new Reader(item, `${this.at(key)}[${i}]`))));
  }
}
