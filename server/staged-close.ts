// Closing a connection whose request body is still arriving, after its answer was written.
//
// Node closes a `connection: close` response's socket with `socket.destroySoon()` as soon as the
// response is flushed (resOnFinish in lib/_http_server.js). With the client still writing, the
// unread bytes make the kernel send a reset, and the client may fail its write, or lose the
// answer, before it reads it: curl says "empty reply from server", the SDKs report a connection
// error and retry. RFC 9112 §9.6 closes in stages instead: close the write side (FIN), read on
// until the client closes or is done, then close. nginx does the same, bounded in time
// (`lingering_close`, `lingering_time`); here it is bounded in bytes too.

import type { IncomingMessage } from 'node:http';
import type { Socket } from 'node:net';

export interface LingerBounds {
  /** The most bytes read (and discarded) from the refusal on; past them the socket is not read. */
  bytes: number;
  /** The longest the connection stays open once the answer is written (ms). */
  ms: number;
}

/**
 * Called when a request is refused before its body ended (its answer says `connection: close`):
 * what arrives from here on is discarded, and the socket, once the answer is flushed, is closed in
 * stages. It is destroyed at once when the body has ended (nothing unread: a clean close), or when
 * the client closes. Past `bounds.bytes` it is no longer read: the client's writes stall, while
 * one that reads as it writes (fetch, curl) has its answer and goes. After `bounds.ms` it is
 * destroyed whatever the state — a reset for a client still trying to write, the bounded cost of
 * not reading a body without end. `lingering` holds the sockets waiting, so that a stopping
 * gateway need not wait for them.
 */
export function closeInStages(req: IncomingMessage, bounds: LingerBounds, lingering: Set<Socket>): void {
  const socket = req.socket as Socket | null;
  // app.inject's stand-in socket has nothing to close.
  if (!socket || typeof socket.destroySoon !== 'function' || socket.destroyed) return;
  let read = 0;
  let answered = false;
  let timer: NodeJS.Timeout | null = null;
  const settle = () => {
    if (timer) clearTimeout(timer);
    lingering.delete(socket);
    req.off('data', discard);
    req.off('end', onEnd);
  };
  const closeWhenFlushed = () => {
    settle();
    if (socket.writableFinished) socket.destroy();
    else socket.once('finish', () => socket.destroy());
  };
  const discard = (chunk: Buffer) => {
    read += chunk.length;
    if (read > bounds.bytes) {
      // Stop reading: the request stream applies back-pressure to the socket (and the socket is
      // paused at once), so the kernel's window closes on the client.
      req.off('data', discard);
      req.pause();
      socket.pause();
    }
  };
  const onEnd = () => {
    if (answered) closeWhenFlushed();
  };
  req.on('data', discard);
  req.once('end', onEnd);
  socket.once('close', settle);
  socket.destroySoon = () => {
    answered = true;
    socket.end();
    // The body ended while the answer was being written: nothing left to read.
    if (req.complete) return closeWhenFlushed();
    lingering.add(socket);
    timer = setTimeout(() => {
      settle();
      socket.destroy();
    }, bounds.ms);
    timer.unref();
  };
}
