// The signals that stop the gateway, each with one listener for the life of the process.
//
// What a signal does changes once the gateway serves (stop the start at once, then drain). Taking
// the start's listeners off and putting the shutdown's on left a moment with none, and Node stops
// watching a signal that has no listener: one that came while the tokenizers loaded (the event
// loop held, the signal waiting) was dropped there, and the gateway started and served on (an
// audit, twenty-second session). So the listeners stay, and only what they call changes.

/** SIGINT and SIGTERM; SIGHUP too (a closed terminal's, and many reload scripts' signal). */
export const STOP_SIGNALS = ['SIGINT', 'SIGTERM', 'SIGHUP'] as const;

export type StopSignal = (typeof STOP_SIGNALS)[number];

export interface StopSignals {
  /** From now on, a stop signal calls `handler`. */
  route(handler: (signal: StopSignal) => void): void;
  /** Takes the listeners off (tests). */
  close(): void;
}

export function routeStopSignals(first: (signal: StopSignal) => void): StopSignals {
  let handler = first;
  const listeners = STOP_SIGNALS.map((signal) => {
    const listener = () => handler(signal);
    process.on(signal, listener);
    return [signal, listener] as const;
  });
  return {
    route: (next) => {
      handler = next;
    },
    close: () => {
      for (const [signal, listener] of listeners) process.off(signal, listener);
    },
  };
}
