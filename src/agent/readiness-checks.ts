// /readyz checks beyond the watch: can the agent do its job on this node
// right now? Each returns a reason (our own words, paths the operator set)
// or undefined. They run on every probe, so each is one or two syscalls.
import { constants } from 'node:fs';
import { access, stat, statfs } from 'node:fs/promises';
import { delimiter, join } from 'node:path';
import { formatBytes } from '../http/html.ts';

export type ReadinessCheck = () => Promise<string | undefined>;

// libvirt on: the virsh binary the agent will run. A bare name is looked up
// on PATH the way spawn() will.
export function virshCheck(virshPath: string, envPath: string | undefined): ReadinessCheck {
  return async () => {
    if (virshPath.includes('/')) {
      const why = await notExecutable(virshPath);
      return why && `virsh (--virsh-path ${virshPath}) ${why}`;
    }
    const dirs = (envPath ?? '').split(delimiter).filter(Boolean);
    for (const d of dirs) if ((await notExecutable(join(d, virshPath))) === undefined) return undefined;
    return `virsh (--virsh-path ${virshPath}) is not on PATH (${dirs.join(delimiter) || 'empty'}); install libvirt-clients or set --virsh-path`;
  };
}

async function notExecutable(path: string): Promise<string | undefined> {
  try {
    if (!(await stat(path)).isFile()) return 'is not a file';
    await access(path, constants.X_OK);
    return undefined;
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    return code === 'ENOENT' ? 'does not exist' : `is not executable (${code ?? 'error'})`;
  }
}

// The state directory's filesystem has room for one more seed of the
// largest size allowed, and a few inodes. A full disk otherwise shows only
// as each reconcile failing with STORE_IO_FAILED.
export function freeSpaceCheck(dir: string, minFreeBytes: number, minFreeInodes = 16): ReadinessCheck {
  return async () => {
    let s;
    try {
      s = await statfs(dir);
    } catch {
      return undefined; // the store's own check reports a missing directory
    }
    const free = s.bavail * s.bsize;
    if (free < minFreeBytes) return `state directory ${dir} is full: ${formatBytes(free)} free, needs at least ${formatBytes(minFreeBytes)} (room for the largest seed)`;
    // Filesystems without inode accounting report files = 0.
    if (s.files > 0 && s.ffree < minFreeInodes) return `state directory ${dir} is out of inodes: ${s.ffree} free`;
    return undefined;
  };
}
