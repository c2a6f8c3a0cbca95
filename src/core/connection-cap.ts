// At most `max` open connections per source address on a server: more are
// destroyed on arrival, before a byte is read, so one client cannot take
// the slots every other client shares (server.maxConnections is global).
import type { Server } from 'node:net';

/** An IPv4-mapped IPv6 address (`::ffff:10.0.0.1`) as plain IPv4; others as given. */
export function unwrapMapped(address: string): string {
  return address.startsWith('::ffff:') && address.includes('.') ? address.slice(7) : address;
}

/**
 * Destroys a connection on arrival when its source address already has `max`
 * open on `server`; `onRefused` is told of each one refused.
 */
export function capConnectionsPerSource(server: Server, max: number, onRefused?: (source: string) => void): void {
  const open = new Map<string, number>();
  server.on('connection', (socket) => {
    const source = unwrapMapped(socket.remoteAddress ?? '');
    const n = (open.get(source) ?? 0) + 1;
    if (n > max) {
      // Nothing written: a client over its share gets a reset, not a slot.
      socket.destroy();
      onRefused?.(source);
      return;
    }
    open.set(source, n);
    socket.once('close', () => {
      const left = (open.get(source) ?? 1) - 1;
      if (left <= 0) open.delete(source);
      else open.set(source, left);
    });
  });
}
