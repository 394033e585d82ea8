// Counts the Map operations a piece of code makes (every Map in the process, while `run` runs):
// deletes, sets, and iterators started. The LRU caches assert with it that their operations are
// O(1) — V8 keeps a deleted Map entry until the table is rebuilt, so a cache that deletes and
// re-inserts on every hit, or evicts through a fresh iterator, slows down quadratically — without
// timing anything (the project forbids timed tests).

export interface MapCalls {
  delete: number;
  set: number;
  iterators: number;
}

export function countMapCalls(run: () => void): MapCalls {
  const proto = Map.prototype as unknown as Record<string | symbol, (...args: unknown[]) => unknown>;
  const calls: MapCalls = { delete: 0, set: 0, iterators: 0 };
  // (An array, not a Map: the spies would count their own bookkeeping.)
  const originals: Array<[string | symbol, (...args: unknown[]) => unknown]> = [];
  const spy = (name: string | symbol, count: () => void) => {
    const original = proto[name]!;
    originals.push([name, original]);
    proto[name] = function (this: unknown, ...args: unknown[]) {
      count();
      return original.apply(this, args);
    };
  };
  spy('delete', () => calls.delete++);
  spy('set', () => calls.set++);
  for (const name of ['keys', 'values', 'entries', 'forEach', Symbol.iterator]) spy(name, () => calls.iterators++);
  try {
    run();
  } finally {
    for (const [name, original] of originals) proto[name] = original;
  }
  return calls;
}
