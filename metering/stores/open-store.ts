// Opens the configured ledger and brings its schema up to date, so callers always get a store
// that is ready for admissions.
import type { Ledger } from '../ledger.js';
import { PostgresLedger } from './postgres-store.js';
import { SqliteLedger } from './sqlite-store.js';
import { acquireOwnerLock, type OwnerLock, type OwnerLockOptions } from './sqlite-owner-lock.js';
import type { CheckpointEvent } from './sqlite-checkpointer.js';

export type StoreConfig =
  | { kind: 'sqlite'; path: string; synchronous?: 'NORMAL' | 'FULL' }
  | { kind: 'postgres'; url: string; schema?: string };

export interface OpenStoreOptions {
  /**
   * The gateway serving an SQLite file holds it alone for as long as it runs (ADR 0016): the store
   * is opened only once no other process holds it. Stores opened for tools and tests leave it out.
   */
  sqliteOwner?: OwnerLockOptions;
  /** SQLite: told when WAL checkpoints start or stop failing. */
  onCheckpointEvent?: (e: CheckpointEvent) => void;
}

export async function openStore(config: StoreConfig, opts: OpenStoreOptions = {}): Promise<Ledger> {
  let owner: OwnerLock | null = null;
  if (config.kind === 'sqlite' && opts.sqliteOwner && config.path !== ':memory:' && config.path !== '') {
    owner = await acquireOwnerLock(config.path, opts.sqliteOwner);
  }
  let store: Ledger;
  try {
    store =
      config.kind === 'sqlite'
        ? new SqliteLedger({ path: config.path, synchronous: config.synchronous, owner, onCheckpointEvent: opts.onCheckpointEvent })
        : new PostgresLedger({ url: config.url, schema: config.schema });
  } catch (err) {
    owner?.release();
    throw err;
  }
  try {
    await store.migrate();
  } catch (err) {
    await store.close();
    throw err;
  }
  return store;
}
