// /readyz checks beyond the watch: can the agent do its job on this node
// right now? Each returns a reason (our own words, paths the operator set)
// or undefined. They run on every probe, so each is a few syscalls.
import { constants } from 'node:fs';
import { access, stat, statfs } from 'node:fs/promises';
import { delimiter, dirname, join } from 'node:path';
import { isVmseedError } from '../../errors.ts';
import { formatBytes } from '../../core/format.ts';
import { holdDirectory, holdSocket, type HeldSocket } from '../../libvirt/rpc/socket-hold.ts';
import { localUriSocket, resolveUri } from '../../libvirt/rpc/uri.ts';
import type { Template } from '../../libvirt/template.ts';

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
    if (free < minFreeBytes)
      return `state directory ${dir} is full: ${formatBytes(free)} free, needs at least ${formatBytes(minFreeBytes)} (room for the largest seed)`;
    // Filesystems without inode accounting report files = 0.
    if (s.files > 0 && s.ffree < minFreeInodes) return `state directory ${dir} is out of inodes: ${s.ffree} free`;
    return undefined;
  };
}

// libvirt on, a local URI: can the agent reach libvirt's socket? A fixed
// URI names one socket (it must exist, be a socket and be writable: a unix
// socket connect needs write permission). A per-VMI template (KubeVirt:
// `…?socket=/pods/{podUID}/…/virtqemud-sock`) names one per launcher, so the
// check is the directory above them: the kubelet's pods directory is 0750
// root:root, and an agent without group 0 stops there with EACCES on every
// VMI. Either path is walked as a dial walks it (libvirt/rpc/socket-hold.ts), so a
// symlink a launcher could have planted is reported, never followed, and
// ready means a dial would get there. Undefined for URIs the agent does not
// dial itself (ssh, tls).
export function libvirtSocketCheck(uriTemplate: Template<'uri'>): ReadinessCheck | undefined {
  const local = localUriSocket(uriTemplate);
  if (!local) return undefined;
  const socketParam = local.socket;
  if (socketParam !== undefined && socketParam.includes('{')) {
    const prefix = safeDecode(socketParam.slice(0, socketParam.indexOf('{')));
    if (prefix === undefined || !prefix.startsWith('/')) return undefined;
    const dir = prefix.endsWith('/') ? prefix.slice(0, -1) || '/' : dirname(prefix);
    return async () => {
      try {
        await accessHeld(holdDirectory(dir), constants.X_OK);
        return undefined;
      } catch (e) {
        if (isVmseedError(e)) return `${dir}, where the per-VM libvirt sockets are (--libvirt-uri): ${e.message}`;
        const code = (e as NodeJS.ErrnoException).code ?? 'error';
        if (code === 'ENOENT')
          return `${dir}, where the per-VM libvirt sockets are (--libvirt-uri), does not exist; mount the kubelet's pods directory there (--pods-dir)`;
        if (code === 'ENOTDIR')
          return `${dir}, where the per-VM libvirt sockets are (--libvirt-uri), is not a directory`;
        return `cannot enter ${dir}, where the per-VM libvirt sockets are (${code}): the kubelet makes its pods directory 0750 root:root; run the agent with supplementalGroups: [0] as manifests/daemonset.yaml does`;
      }
    };
  }
  return async () => {
    let socket: string;
    try {
      socket = resolveUri(uriTemplate).socketPath;
    } catch (e) {
      return (e as Error).message;
    }
    try {
      await accessHeld(holdSocket(socket), constants.W_OK);
      return undefined;
    } catch (e) {
      if (isVmseedError(e)) return `libvirt socket for ${uriTemplate}: ${e.message}`;
      const code = (e as NodeJS.ErrnoException).code ?? 'error';
      if (code === 'ENOENT')
        return `libvirt socket ${socket} (for ${uriTemplate}) does not exist: libvirtd (or virtqemud) is not running there, or its directory is not mounted`;
      return `libvirt socket ${socket} (for ${uriTemplate}) is not usable by this agent (${code}); check its owner and mode (libvirtd's unix_sock_rw_perms)`;
    }
  };
}

// access(2) on the inode the walk found, through /proc.
async function accessHeld(held: HeldSocket, mode: number): Promise<void> {
  try {
    await access(held.path, mode);
  } finally {
    held.close();
  }
}

function safeDecode(s: string): string | undefined {
  try {
    return decodeURIComponent(s);
  } catch {
    return undefined;
  }
}
