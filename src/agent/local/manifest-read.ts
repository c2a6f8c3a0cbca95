// Reading one local-mode manifest (`--local DIR`): a regular file of at most
// MAX_MANIFEST_BYTES, opened without blocking. A FIFO or a device named
// like a manifest would otherwise hang the read in open(2) (a thread of the
// pool, for good: SIGTERM could not end the process cleanly), and a huge file
// would be read whole into the agent's 128 MiB heap.
//
// Symlinks are followed: the directory is the operator's (nothing a VM
// owner writes), and a ConfigMap or Secret mounted as a volume, the usual
// way to give a pod a directory of manifests, is made of symlinks into its
// `..data` directory. The file they lead to must still be a regular file
// within the budget.
import { constants as C } from 'node:fs';
import { open, type FileHandle } from 'node:fs/promises';
import { VmseedError } from '../../errors.ts';

// Four times the annotation's own limit and of the largest Secret the API
// server stores: room for a VMI, its Secrets and ConfigMaps in one file.
export const MAX_MANIFEST_BYTES = 4 * 1024 * 1024;

export async function readManifest(path: string, field: string, maxBytes = MAX_MANIFEST_BYTES): Promise<string> {
  let handle: FileHandle | undefined;
  try {
    handle = await open(path, C.O_RDONLY | C.O_NONBLOCK);
    const st = await handle.stat();
    if (!st.isFile()) {
      throw new VmseedError(
        'MANIFEST_INVALID',
        `${field} is not a regular file (a FIFO, socket or device named like a manifest); remove it or give it another name`,
        { kind: 'terminal', field },
      );
    }
    if (st.size > maxBytes) throw tooLarge(field, st.size, maxBytes);
    // The file may grow between the stat and the read: one byte more than
    // the budget tells.
    const buf = Buffer.allocUnsafe(Math.min(st.size, maxBytes) + 1);
    let n = 0;
    for (;;) {
      const { bytesRead } = await handle.read(buf, n, buf.length - n, n);
      if (bytesRead === 0) break;
      n += bytesRead;
      if (n === buf.length) break;
    }
    if (n > maxBytes) throw tooLarge(field, n, maxBytes);
    return buf.toString('utf8', 0, n);
  } finally {
    await handle?.close();
  }
}

function tooLarge(field: string, size: number, max: number): VmseedError {
  return new VmseedError(
    'MANIFEST_TOO_LARGE',
    `${field} is more than ${Math.max(size, max + 1)} bytes, over the limit of ${max} bytes per manifest; split it into several files`,
    { kind: 'terminal', field },
  );
}
