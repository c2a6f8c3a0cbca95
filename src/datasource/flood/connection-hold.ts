// A client its own rate-limit bucket refused was told `Retry-After`; its
// connection is not read again before that time has passed. A 429 alone
// still costs the listener a parse and an answer per request, so a flood
// over keep-alive connections would be refused request by request on the
// event loop every guest shares; a held connection costs nothing until it
// resumes. What the client sends meanwhile waits in the kernel's socket
// buffers, bounded by TCP flow control, not in the agent's memory. A client
// that honours Retry-After never notices; other connections, of the same
// VM or any other, are not held.
import type { IncomingMessage, ServerResponse } from 'node:http';
import type { Socket } from 'node:net';

const held = new WeakSet<Socket>();

/**
 * Stops reading the request's connection for `ms` to `2 * ms` once the
 * answer is on the wire. Connections a flood tool had refused together would
 * come back together, a burst every `ms` on the listener every guest shares;
 * a random share of one more `ms` spreads them out. A connection already
 * held is left as it is: the first refusal's time stands, so a pipelined
 * burst cannot lengthen it.
 */
export function holdConnection(req: IncomingMessage, res: ServerResponse, ms: number): void {
  // Node detaches the socket from the response when it finishes: taken now.
  const socket = req.socket;
  if (held.has(socket) || socket.destroyed) return;
  held.add(socket);
  res.once('finish', () => {
    if (socket.destroyed) return;
    socket.pause();
    const release = () => {
      clearTimeout(timer);
      socket.off('close', release);
      held.delete(socket);
      socket.resume();
    };
    const timer = setTimeout(release, ms * (1 + Math.random()));
    timer.unref();
    socket.once('close', release);
  });
}
