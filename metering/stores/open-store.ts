// Opens the configured ledger and brings its schema up to date, so callers always get a store
// that is ready for admissions.
import type { Ledger } from '../ledger.js';
import { PostgresLedger } from './postgres-store.js';
import { SqliteLedger } from './sqlite-store.js';

export type StoreConfig =
  | { kind: 'sqlite'; path: string; synchronous?: 'NORMAL' | 'FULL' }
  | { kind: 'postgres'; url: string; schema?: string };

export async function openStore(config: StoreConfig): Promise<Ledger> {
  const store: Ledger =
    config.kind === 'sqlite'
      ? new SqliteLedger({ path: config.path, synchronous: config.synchronous })
      : new PostgresLedger({ url: config.url, schema: config.schema });
  try {
    await store.migrate();
  } catch (err) {
    await store.close();
    throw err;
  }
  return store;
}
