// Where the domain's QEMU finds the seed image. With libvirt on the host the
// image in the agent's state directory is already visible (identity). In
// KubeVirt each VM's QEMU runs in its virt-launcher pod, which does not mount
// the agent's state directory; the image is copied into that pod's
// `ephemeral-disks` emptyDir instead (seen in the launcher at
// /var/run/kubevirt-ephemeral-disks, where KubeVirt keeps its own cloud-init
// ISO): under a `vmseed/` directory of ours, a path KubeVirt's launcher never
// detaches, ejects or deletes (unlike `hotplug-disks`, whose foreign disks
// its syncDisks removes).
//
// The directory is writable by the launcher (emptyDirs are 2777), so nothing
// in it is trusted: every path is resolved from a directory opened with
// O_NOFOLLOW (through /proc/self/fd, Linux's openat for path-based APIs), no
// symlink is followed, only regular files are read, reads are bounded, and
// only names of vmseed's own images are deleted.
import * as fsSync from 'node:fs';
import { constants as C } from 'node:fs';
import * as fs from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import { VmseedError } from '../errors.ts';
import { parseTemplate, renderForTarget, usesPodUID, type Template } from './template.ts';
import type { InjectionTarget } from './injector-contract.ts';

export interface ImagePublisher {
  // Makes the image available to the target's domain; returns the host path
  // of the copy the domain will open ({path} of --image-path-in-domain).
  publish(target: InjectionTarget, imagePath: string): Promise<string>;
  // Removes what publish() placed (after the disk is detached).
  unpublish(target: InjectionTarget): Promise<void>;
  // Removes what publish() placed for the target except `keepPath` (a
  // publish() result), once the domain's disk points at it.
  prune?(target: InjectionTarget, keepPath: string): Promise<void>;
  // It lives in the launcher pod (its directory names {podUID}).
  readonly perPod?: boolean;
  // publish() returns the image's own path and touches no file: the
  // injector has no copy to overlap with its read of the domain.
  readonly passThrough?: boolean;
}

export const identityPublisher: ImagePublisher = {
  publish: async (_target, imagePath) => imagePath,
  unpublish: async () => {},
  passThrough: true,
};

export interface DirPublisherOptions {
  // An existing directory, never created here (the launcher's volume), e.g.
  // `/pods/{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks`; its
  // placeholders come checked (parseTemplate in template.ts).
  dirTemplate: Template<'publish-dir'>;
  // A directory of ours inside it, created when missing (e.g. `vmseed`).
  subdir?: string;
  // Seeds may carry passwords: owner and group only. In KubeVirt the agent
  // runs as the launcher's qemu user (107), so QEMU opens its own file.
  fileMode?: number;
  // setgid keeps the emptyDir's group (107) on what is created inside.
  dirMode?: number;
  // Largest image copied (the store's images are far smaller).
  maxBytes?: number;
}

const PREFIX = 'vmseed-';
// Image names as the store makes them (`<datasource>-<sha16>.iso`),
// published as `vmseed-<name>`; temporaries are
// `.vmseed-<name>.vmseed-tmp-<12 hex>`. KubeVirt's own files never match.
const IMAGE = '(?:nocloud|configdrive)-[0-9a-f]{16}\\.iso';
const OURS_RE = new RegExp(`^${PREFIX}${IMAGE}$`);
const TMP_RE = new RegExp(`^\\.${PREFIX}${IMAGE}\\.vmseed-tmp-[0-9a-f]{12}$`);
const DEFAULT_MAX_BYTES = 256 * 1024 * 1024;
// A launcher can fill its emptyDir with names; a listing stops here.
const MAX_DIR_ENTRIES = 10_000;

export function isPublishedName(name: string): boolean {
  return OURS_RE.test(name) || TMP_RE.test(name);
}

function errCode(e: unknown): string | undefined {
  return (e as { code?: string }).code;
}

const gone = (e: unknown) => errCode(e) === 'ENOENT' || errCode(e) === 'ENOTDIR';

function unsafe(path: string, what: string): VmseedError {
  return new VmseedError(
    'STORE_UNSAFE_PATH',
    `${path} ${what}; vmseed follows no symlink and writes only into a directory it can verify: remove it (the launcher pod's volume is writable from inside the pod)`,
    { kind: 'terminal', field: 'publishDir' },
  );
}

// Publishing is a few small file calls (open the volume and our directory,
// read the image, create, write, chmod, rename, and a copy of a ~68 KiB
// image), made with synchronous calls for the reason the store writes small
// images that way (DEFAULT_SYNC_MAX_BYTES in disk/store.ts): on KubeVirt the
// copy is on the path of every seed (a paused VM waits for it). Nothing here
// can block: a FIFO is opened O_NONBLOCK and never read, the image is our
// store's, and a file under our name is read only when it has the image's
// size. Removing copies lists a directory the launcher can fill, so it stays
// asynchronous.

// A directory held open: names below it resolve from this inode, whatever
// happens to the path it was opened by.
class HeldDir {
  readonly fd: number;
  readonly path: string;
  constructor(fd: number, path: string) {
    this.fd = fd;
    this.path = path;
  }
  at(name: string): string {
    return `/proc/self/fd/${this.fd}/${name}`;
  }
  close(): void {
    closeQuietly(this.fd);
  }
}

function closeQuietly(fd: number): void {
  try {
    fsSync.closeSync(fd);
  } catch {
    // Nothing was written through it; the descriptor is gone either way.
  }
}

// Opens `path` as a directory without following a symlink at its last
// component (O_DIRECTORY: nothing else opens); undefined when it does not
// exist.
function openDir(path: string, at: string = path): HeldDir | undefined {
  try {
    return new HeldDir(fsSync.openSync(at, C.O_RDONLY | C.O_DIRECTORY | C.O_NOFOLLOW), path);
  } catch (e) {
    if (errCode(e) === 'ENOENT') return undefined;
    if (errCode(e) !== 'ELOOP' && errCode(e) !== 'ENOTDIR') throw failed(`cannot open ${path}`, e);
    // The last component is a symlink (ELOOP, or ENOTDIR with O_DIRECTORY)
    // or not a directory; ENOTDIR from a parent that is not one: not there.
    let st: fsSync.Stats | undefined;
    try {
      st = fsSync.lstatSync(at);
    } catch (e2) {
      if (gone(e2)) return undefined;
      throw failed(`cannot stat ${path}`, e2);
    }
    throw unsafe(path, st.isSymbolicLink() ? 'is a symlink' : 'is not a directory');
  }
}

function failed(what: string, e: unknown): VmseedError {
  if (e instanceof VmseedError) return e;
  return new VmseedError('SEED_PUBLISH_FAILED', `${what}: ${errCode(e) ?? 'I/O error'}; will retry`, {
    kind: 'retryable',
    cause: e,
  });
}

// Opens a regular file for reading without following a symlink or blocking
// on a FIFO or device; undefined when there is none (or something else).
function openRegular(path: string): { fd: number; size: number } | undefined {
  let fd: number;
  try {
    fd = fsSync.openSync(path, C.O_RDONLY | C.O_NOFOLLOW | C.O_NONBLOCK);
  } catch (e) {
    if (gone(e) || errCode(e) === 'ELOOP') return undefined;
    throw e;
  }
  try {
    const st = fsSync.fstatSync(fd);
    if (st.isFile()) return { fd, size: st.size };
  } catch (e) {
    closeQuietly(fd);
    throw e;
  }
  closeQuietly(fd);
  return undefined;
}

// Exactly `size` bytes of an open file, or undefined when it is shorter.
function readAll(fd: number, size: number): Uint8Array | undefined {
  const buf = Buffer.alloc(size);
  let off = 0;
  while (off < size) {
    const n = fsSync.readSync(fd, buf, off, size - off, off);
    if (n === 0) break;
    off += n;
  }
  return off === size ? buf : undefined;
}

// The image's bytes, never more than `max`.
function readImage(path: string, max: number): Uint8Array | undefined {
  const f = openRegular(path);
  if (!f) return undefined;
  try {
    if (f.size > max)
      throw new VmseedError(
        'SEED_PUBLISH_FAILED',
        `${path} is ${f.size} bytes, more than the ${max} a seed image may have`,
        { kind: 'terminal' },
      );
    return readAll(f.fd, f.size);
  } finally {
    closeQuietly(f.fd);
  }
}

// Whether a regular file holds exactly `bytes` (a file of another size is
// not read at all).
function holds(path: string, bytes: Uint8Array): boolean {
  const f = openRegular(path);
  if (!f) return false;
  try {
    if (f.size !== bytes.length) return false;
    const current = readAll(f.fd, f.size);
    return current !== undefined && Buffer.from(current).equals(Buffer.from(bytes));
  } finally {
    closeQuietly(f.fd);
  }
}

/**
 * Copies images into a directory per target, KubeVirt's launcher
 * `ephemeral-disks` volume (see the module comment; forDir() builds it from
 * --publish-dir). Failures are VmseedErrors: SEED_PUBLISH_FAILED (retryable;
 * terminal for an image over maxBytes) and STORE_UNSAFE_PATH (terminal) for
 * a symlink or non-directory in the way.
 */
export class DirPublisher implements ImagePublisher {
  readonly #dirTemplate: Template<'publish-dir'>;
  readonly #subdir: string | undefined;
  readonly #fileMode: number;
  readonly #dirMode: number;
  readonly #maxBytes: number;
  readonly perPod: boolean;

  // --publish-dir: its last component is ours to create (e.g. `vmseed` in
  // the launcher's emptyDir); its parent must exist.
  static forDir(dir: Template<'publish-dir'>): DirPublisher {
    const last = basename(dir);
    if (last === '' || last.includes('{') || dirname(dir) === dir) return new DirPublisher({ dirTemplate: dir });
    return new DirPublisher({ dirTemplate: parseTemplate('publish-dir', dirname(dir)), subdir: last });
  }

  constructor(options: DirPublisherOptions) {
    if (options.subdir !== undefined && !/^[A-Za-z0-9][A-Za-z0-9._-]*$/.test(options.subdir)) {
      throw new VmseedError('CONFIG_INVALID', `publish subdirectory '${options.subdir}' must be one plain name`, {
        field: 'publishDir',
      });
    }
    this.perPod = usesPodUID(options.dirTemplate);
    this.#dirTemplate = options.dirTemplate;
    this.#subdir = options.subdir;
    this.#fileMode = options.fileMode ?? 0o640;
    this.#dirMode = options.dirMode ?? 0o2750;
    this.#maxBytes = options.maxBytes ?? DEFAULT_MAX_BYTES;
  }

  // The directory the image is copied into, as the agent sees it.
  dirFor(target: InjectionTarget): string {
    const base = renderForTarget(this.#dirTemplate, target);
    return this.#subdir ? join(base, this.#subdir) : base;
  }

  // Our directory held open (created in the volume when missing), or
  // undefined when `create` is false and it is not there.
  #ours(target: InjectionTarget, create: boolean): HeldDir | undefined {
    const base = renderForTarget(this.#dirTemplate, target);
    const volume = openDir(base);
    if (!volume) {
      if (!create) return undefined;
      throw new VmseedError(
        'SEED_PUBLISH_FAILED',
        `publish directory ${base} does not exist (launcher pod not started yet, or check --publish-dir / --pods-dir and that the kubelet pods directory is mounted); will retry`,
        { kind: 'retryable', field: 'publishDir' },
      );
    }
    if (!this.#subdir) return volume;
    const path = join(base, this.#subdir);
    try {
      let held = openDir(path, volume.at(this.#subdir));
      if (!held && create) {
        try {
          fsSync.mkdirSync(volume.at(this.#subdir), { mode: this.#dirMode & 0o777 });
        } catch (e) {
          if (errCode(e) !== 'EEXIST') throw failed(`cannot create ${path}`, e);
        }
        held = openDir(path, volume.at(this.#subdir));
        if (!held) throw failed(`cannot create ${path}`, Object.assign(new Error('vanished'), { code: 'ENOENT' }));
        // On the held inode: the mode umask filtered, and setgid (a mode
        // bit mkdir does not set).
        try {
          try {
            fsSync.fchmodSync(held.fd, this.#dirMode);
          } catch {
            fsSync.fchmodSync(held.fd, this.#dirMode & 0o777);
          }
        } catch (e) {
          held.close();
          throw failed(`cannot set the mode of ${path}`, e);
        }
      }
      return held;
    } finally {
      volume.close();
    }
  }

  async publish(target: InjectionTarget, imagePath: string): Promise<string> {
    const name = PREFIX + basename(imagePath);
    if (!OURS_RE.test(name)) {
      throw new VmseedError(
        'INTERNAL',
        `image ${basename(imagePath)} does not have a store image name; refusing to publish it`,
        { kind: 'terminal' },
      );
    }
    const dir = this.#ours(target, true)!;
    const dest = join(dir.path, name);
    try {
      const bytes = readImage(imagePath, this.#maxBytes);
      if (!bytes)
        throw failed(
          `cannot read the seed image ${imagePath}`,
          Object.assign(new Error('not a regular file'), { code: 'ENOENT' }),
        );
      // Identical (the name says so, the bytes confirm): keep the file.
      if (holds(dir.at(name), bytes)) return dest;
      const tmp = `.${name}.vmseed-tmp-${randomBytes(6).toString('hex')}`;
      let fd: number | undefined;
      try {
        fd = fsSync.openSync(dir.at(tmp), C.O_WRONLY | C.O_CREAT | C.O_EXCL | C.O_NOFOLLOW, this.#fileMode);
        let off = 0;
        while (off < bytes.length) off += fsSync.writeSync(fd, bytes, off, bytes.length - off, off);
        fsSync.fchmodSync(fd, this.#fileMode); // the umask filtered open's mode
        fsSync.closeSync(fd);
        fd = undefined;
        // rename replaces whatever has our name (a symlink is replaced, not
        // followed).
        try {
          fsSync.renameSync(dir.at(tmp), dir.at(name));
        } catch (e) {
          throw errCode(e) === 'EISDIR' || errCode(e) === 'ENOTEMPTY' ? unsafe(dest, 'is a directory') : e;
        }
      } catch (e) {
        if (fd !== undefined) closeQuietly(fd);
        try {
          fsSync.unlinkSync(dir.at(tmp));
        } catch {
          // not created, or already renamed
        }
        throw e;
      }
      return dest;
    } catch (e) {
      throw failed(`cannot copy the seed image into ${dir.path}`, e);
    } finally {
      dir.close();
    }
  }

  async unpublish(target: InjectionTarget): Promise<void> {
    await this.#removeOurs(target, undefined);
  }

  // Older seeds' copies, once the domain uses `keepPath`.
  async prune(target: InjectionTarget, keepPath: string): Promise<void> {
    await this.#removeOurs(target, basename(keepPath));
  }

  async #removeOurs(target: InjectionTarget, keep: string | undefined): Promise<void> {
    let dir: HeldDir | undefined;
    try {
      dir = this.#ours(target, false);
    } catch (e) {
      // Our directory replaced by something else: nothing of ours is in it.
      if (e instanceof VmseedError && e.code === 'STORE_UNSAFE_PATH') return;
      throw e;
    }
    // Not there: never published, or the pod (and its emptyDir) is gone.
    if (!dir) return;
    try {
      const names: string[] = [];
      const listing = await fs.opendir(dir.at('.')).catch((e) => {
        if (gone(e)) return undefined;
        throw failed(`cannot list ${dir.path}`, e);
      });
      if (listing) {
        let seen = 0;
        for await (const entry of listing) {
          if (++seen > MAX_DIR_ENTRIES) break;
          if (entry.name !== keep && isPublishedName(entry.name)) names.push(entry.name);
        }
      }
      for (const n of names) {
        const st = await fs.lstat(dir.at(n)).catch(() => undefined);
        if (!st || st.isDirectory()) continue;
        await fs.unlink(dir.at(n)).catch((e) => {
          if (!gone(e)) throw failed(`cannot remove the seed image from ${dir.path}`, e);
        });
      }
    } finally {
      dir.close();
    }
  }
}
