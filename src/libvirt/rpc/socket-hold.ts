// A libvirt socket path resolved to the socket's own inode before it is
// dialled. A launcher pod owns its emptyDirs (and the agent shares its uid,
// 107), so anything below them can change between a check of the path and
// connect(): a symlink swapped in there would reach another pod's daemon.
// The path is walked one component at a time from `/` with O_PATH|O_NOFOLLOW
// opens through the previous directory's descriptor (Node has no openat;
// /proc/self/fd/<fd>/<name> resolves from that inode). A symlink is followed
// only where nobody but root can have put it (a root-owned directory no
// group or other may write: `/var/run` in `/`), the last component never.
// The result is an O_PATH descriptor of the socket, verified to be one with
// fstat; connecting to /proc/self/fd/<fd> reaches exactly that inode,
// whatever the name points to by then. The readiness checks walk the
// directory above per-launcher sockets the same way, so they report ready
// only for what a dial would reach.
import { closeSync, constants as C, fstatSync, openSync, readlinkSync, type Stats } from 'node:fs';
import { VmseedError } from '../../errors.ts';

// Not in Node's fs.constants; 010000000 on Linux's common architectures
// (x86, arm, arm64, riscv, ppc, s390).
const O_PATH = (C as Record<string, number | undefined>).O_PATH ?? 0o10000000;
// Linux's own limit on symlinks in one lookup.
const MAX_LINKS = 40;

/** An O_PATH descriptor held open on a verified inode; close() it when done. */
export interface HeldSocket {
  // What to connect() to (or access()): the held inode, through /proc.
  readonly path: string;
  // The O_PATH descriptor itself, for a child process to inherit.
  readonly fd: number;
  close(): void;
}

function refused(socketPath: string, why: string): VmseedError {
  return new VmseedError(
    'LIBVIRT_ACCESS_DENIED',
    `${socketPath} ${why}; refusing to connect (a launcher pod can change its own volumes, so no symlink there is followed); check the libvirt URI`,
    { kind: 'terminal', field: 'uri' },
  );
}

function errno(code: string): NodeJS.ErrnoException {
  return Object.assign(new Error(code), { code });
}

function closeQuietly(fd: number): void {
  try {
    closeSync(fd);
  } catch {
    // An O_PATH descriptor holds nothing to flush.
  }
}

// Only root can add, remove or rename entries (POSIX ACLs show in the group
// bits as their mask).
function onlyRootWrites(st: Stats): boolean {
  return st.uid === 0 && (st.mode & 0o022) === 0;
}

// Components to resolve, the next one last (a stack).
function components(path: string): string[] {
  return path.split('/').reverse();
}

/**
 * The socket at `socketPath`, walked as the module comment describes.
 * Throws VmseedError LIBVIRT_ACCESS_DENIED (terminal) when the path is
 * refused, an errno error (ENOENT, EACCES, ENOTDIR, ELOOP) when it cannot be
 * resolved.
 */
export function holdSocket(socketPath: string): HeldSocket {
  return holdInode(socketPath, 'socket');
}

/**
 * A directory by the same walk (the last component no symlink either),
 * throwing as holdSocket does.
 */
export function holdDirectory(path: string): HeldSocket {
  return holdInode(path, 'directory');
}

function held(fd: number): HeldSocket {
  return { path: `/proc/self/fd/${fd}`, fd, close: () => closeQuietly(fd) };
}

function holdInode(path: string, kind: 'socket' | 'directory'): HeldSocket {
  const pending = components(path);
  const named = (n: string) => n !== '' && n !== '.';
  if (kind === 'directory' && !pending.some(named)) return held(openSync('/', O_PATH | C.O_DIRECTORY));
  let dir = openSync('/', O_PATH | C.O_DIRECTORY);
  try {
    let trusted = onlyRootWrites(fstatSync(dir));
    let links = 0;
    while (pending.length > 0) {
      const name = pending.pop()!;
      if (!named(name)) continue;
      if (name === '..' && !trusted) throw refused(path, 'climbs out of a directory others than root can write');
      const at = `/proc/self/fd/${dir}/${name}`;
      const fd = openSync(at, O_PATH | C.O_NOFOLLOW);
      let st: Stats;
      try {
        st = fstatSync(fd);
      } catch (e) {
        closeQuietly(fd);
        throw e;
      }
      const last = !pending.some(named);
      if (st.isSymbolicLink()) {
        closeQuietly(fd);
        if (last) throw refused(path, `is a symlink, not a ${kind === 'socket' ? 'unix socket' : 'directory'}`);
        if (!trusted)
          throw refused(path, `passes through a symlink (${name}) in a directory others than root can write`);
        if (++links > MAX_LINKS) throw errno('ELOOP');
        // The directory is root's alone: the link read is the link opened.
        const target = readlinkSync(at);
        if (target.startsWith('/')) {
          const root = openSync('/', O_PATH | C.O_DIRECTORY);
          closeQuietly(dir);
          dir = root;
          trusted = onlyRootWrites(fstatSync(dir));
        }
        pending.push(...components(target));
        continue;
      }
      if (last && kind === 'socket') {
        if (!st.isSocket()) {
          closeQuietly(fd);
          throw refused(path, 'is not a unix socket');
        }
        return held(fd);
      }
      if (!st.isDirectory()) {
        closeQuietly(fd);
        throw errno('ENOTDIR');
      }
      if (last) return held(fd);
      closeQuietly(dir);
      dir = fd;
      trusted = onlyRootWrites(st);
    }
    throw errno('ENOENT');
  } finally {
    closeQuietly(dir);
  }
}
