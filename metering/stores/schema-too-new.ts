// A ledger written by a newer Tollgate: its schema has versions this code does not know, and what
// those versions hold (a column another settlement reads, a row format) this code would ignore or
// misread. Starting on it is refused, before anything is read or written.

export class LedgerSchemaTooNewError extends Error {
  constructor(store: 'SQLite' | 'PostgreSQL', found: number, known: number) {
    super(
      `the ${store} ledger is at schema version ${found}, newer than this Tollgate knows (${known}): ` +
        'a newer Tollgate wrote it; run that version, or restore a backup taken before the upgrade',
    );
    this.name = 'LedgerSchemaTooNewError';
  }
}
