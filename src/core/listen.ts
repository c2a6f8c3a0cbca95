// Starts a server listening; rejects with the listen error itself
// (EADDRINUSE, EACCES, ...), for the caller to explain.
import type { Server } from 'node:net';

/** Listens on host:port; rejects with the listen error itself (EADDRINUSE, ...). */
export function listen(server: Server, port: number, host: string): Promise<void> {
  return new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(port, host, () => {
      server.off('error', reject);
      resolve();
    });
  });
}
