// Seed images on the node:
//   <root>/<namespace>/<name>_<uid>/<datasource>-<first 16 hex of sha256>.iso
// Content-addressed names: a running QEMU keeps the inode it opened, so an
// image replaced in place under a stable name is never seen by the guest
// (the domain's source path did not change, so nothing re-attaches it).
// With the hash in the name, "the domain's source is the desired path" means
// "the domain has this content", and the injector's path compare replaces
// the disk when the seed changes. A new seed is a new file: write() never
// deletes an older one (a shut-off domain's config may still name it until
// the injector replaced it); prune() does, once the caller moved on.
// One directory per VMI, not <name>/<uid>/: a mkdir costs more than building
// the image, and a new VMI would pay for two. `_` cannot
// occur in a Kubernetes name or UID, so the directory name splits back
// unambiguously.
// Writes are atomic (temporary file in the same directory, write, fsync,
// rename, fsync of the directory), so QEMU or a reader never sees a partial
// image; temporaries left by a crash are removed by cleanupTemporaries() at
// start. An identical image (same name, same bytes) is not rewritten.
// Seed-sized images take a path of synchronous calls (see
// DEFAULT_SYNC_MAX_BYTES); the steps are the same.
//
// The state dir cannot be turned against the node: before any
// operation the VMI's directory and its namespace directory are lstat'ed and
// must be real directories (a symlink or anything else is STORE_UNSAFE_PATH,
// terminal, and left alone); files are read only through
// O_NOFOLLOW|O_NONBLOCK opens checked with fstat (regular files only, reads
// bounded by the size expected), so neither a symlink nor a FIFO named like
// an image is followed or hangs a read; only names of vmseed's own images and
// temporaries are ever unlinked, and unlink/rename act on the entry itself,
// never on what a symlink points to. Node has no openat(), so a directory
// swapped between the lstat and the use is not caught; the state dir is the
// agent's own (0750), which such a swap already needs write access to.
import type { Datasource } from '../api/objects.ts';
import * as nodeFs from 'node:fs/promises';
import * as nodeFsSync from 'node:fs';
import { constants as fsConstants } from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { basename, dirname, join, relative } from 'node:path';
import { DATASOURCES } from '../cloudinit/seed.ts';
import { VmseedError, cancelledBy } from '../errors.ts';

/** The VMI an image belongs to; the store refuses names that could leave its root. */
export interface ImageKey {
  namespace: string;
  name: string;
  uid: string;
}

/** An image found in the store (list()), with what its file name says. */
export interface StoredImage extends ImageKey {
  datasource: Datasource;
  path: string;
  size: number;
  // The first 16 hex digits of the image's sha256, from its name.
  sha16: string;
}

// The few node:fs/promises calls the store makes, so tests can inject faults.
export interface StoreStat {
  size: number;
  ino: number;
  mtimeMs: number;
  isFile(): boolean;
  isDirectory(): boolean;
  isSymbolicLink(): boolean;
}

export interface StoreFileHandle {
  read(buffer: Uint8Array, offset: number, length: number, position: number): Promise<{ bytesRead: number }>;
  writeFile(data: Uint8Array): Promise<void>;
  chmod(mode: number): Promise<void>;
  stat(): Promise<StoreStat>;
  sync(): Promise<void>;
  close(): Promise<void>;
}

export interface StoreFs {
  open(path: string, flags: string | number, mode?: number): Promise<StoreFileHandle>;
  lstat(path: string): Promise<StoreStat>;
  rename(from: string, to: string): Promise<void>;
  unlink(path: string): Promise<void>;
  mkdir(path: string, options: { recursive: true; mode?: number }): Promise<unknown>;
  readdir(path: string): Promise<string[]>;
  rmdir(path: string): Promise<void>;
  chmod(path: string, mode: number): Promise<void>;
}

// The synchronous calls of the small-image path (see ImageStore.write).
export interface StoreSyncFs {
  openSync(path: string, flags: string | number, mode?: number): number;
  readSync(fd: number, buffer: Uint8Array, offset: number, length: number, position: number): number;
  writeSync(fd: number, data: Uint8Array, offset: number, length: number, position: number): number;
  fchmodSync(fd: number, mode: number): void;
  // fsync stays off the event loop: it takes milliseconds.
  fsync(fd: number, callback: (err: Error | null) => void): void;
  fstatSync(fd: number): StoreStat;
  closeSync(fd: number): void;
  renameSync(from: string, to: string): void;
  unlinkSync(path: string): void;
  mkdirSync(path: string, options: { recursive: true; mode?: number }): unknown;
  lstatSync(path: string, options: { throwIfNoEntry: false }): StoreStat | undefined;
}

export interface ImageStoreOptions {
  root: string;
  fileMode?: number;
  fs?: StoreFs;
  // Synchronous calls for images up to syncMaxBytes. Default: node:fs when
  // `fs` is not given; a store given only `fs` stays fully asynchronous.
  syncFs?: StoreSyncFs;
  syncMaxBytes?: number;
}

// Up to this size an image is written with synchronous calls. A seed write
// is a few short syscalls and a copy into the page cache; through
// fs/promises every call is a round trip to the thread pool, which costs more
// than the call itself. At 16 KiB of user-data the synchronous path is the
// faster one (`npm run bench:iso` compares it with the "through fs/promises
// only" row), and the event loop is blocked for less time than those round
// trips would take. Larger images, where copying dominates, go through the
// thread pool, and so does fsync (file and directory) whenever it is asked
// for: it takes milliseconds.
export const DEFAULT_SYNC_MAX_BYTES = 256 * 1024;

const TMP_MARK = '.tmp-';
// Small records of the agent's about one VMI, kept next to its images so
// they go with them (remove()): `seed-gate-opened`, the seed gate's unpause
// done (agent/domain/kubevirt-resume.ts). Fixed names, never an image's.
export const VMI_RECORDS = ['seed-gate-opened'] as const;
export type VmiRecord = (typeof VMI_RECORDS)[number];
export const MAX_RECORD_BYTES = 4096;
// A temporary of write() or writeRecord(): `.<name>.tmp-<store prefix>-<counter>`.
const TEMP_RE = /^\.(?:(?:nocloud|configdrive)-[0-9a-f]{16}\.iso|seed-gate-opened)\.tmp-[0-9a-z-]+$/;
// Every read of a file under the root: never through a symlink, never
// blocking on a FIFO or a device (the fstat that follows refuses them).
const READ_FLAGS = fsConstants.O_RDONLY | fsConstants.O_NOFOLLOW | fsConstants.O_NONBLOCK;
// No seed image comes near this (ISO_TOO_LARGE is far lower); a file that
// does is not read, whatever its name.
export const MAX_IMAGE_READ_BYTES = 64 * 1024 * 1024;
// Kubernetes names: namespace is a DNS label, name a DNS subdomain, uid a
// UUID. Anything else (slashes, '..', NUL) could leave the root.
const NAMESPACE_RE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const NAME_RE = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const UID_RE = /^[A-Za-z0-9][-A-Za-z0-9]{0,63}$/;

// 64 bits of sha256: a VMI holds a handful of seeds over its life, so a
// collision between two of them is out of reach, and a path stays short.
export const SHA_PREFIX_HEX = 16;
const SHA_RE = /^[0-9a-f]{16,64}$/;
// `<datasource>-<sha16>.iso`
const IMAGE_RE = /^(nocloud|configdrive)-([0-9a-f]{16})\.iso$/;

function parseImageName(file: string): { datasource: Datasource; sha16: string } | undefined {
  const m = IMAGE_RE.exec(file);
  return m ? { datasource: m[1] as Datasource, sha16: m[2] } : undefined;
}

const MAX_REMEMBERED = 16384;
const MAX_KNOWN_DIRS = 16384;
const ZERO_PREFIX = new Uint8Array(32 * 1024);

// Bytes at the start of `bytes` that are zero: 32 KiB (a whole ISO 9660
// system area) or nothing. One memcmp.
function zeroPrefix(bytes: Uint8Array): number {
  if (bytes.length <= ZERO_PREFIX.length) return 0;
  return Buffer.from(bytes.buffer, bytes.byteOffset, ZERO_PREFIX.length).equals(ZERO_PREFIX) ? ZERO_PREFIX.length : 0;
}

// Like Promise.all, but waits for every call before failing, so the file
// handle is never closed while one of them still uses it.
async function settled<T extends readonly unknown[]>(ps: { [K in keyof T]: Promise<T[K]> }): Promise<T> {
  const rs = await Promise.allSettled(ps);
  for (const r of rs) if (r.status === 'rejected') throw r.reason;
  return rs.map((r) => (r as PromiseFulfilledResult<unknown>).value) as unknown as T;
}

// The calls one atomic write makes (ImageStore's atomicWrite), in one
// flavour: each gives its result, or a promise of it. close and unlink
// never fail (what they leave, cleanupTemporaries() removes).
interface TempFileCalls<F> {
  // The temporary, created exclusively; its directory made if missing.
  open(tmp: string): F | Promise<F>;
  // The bytes written and the store's mode set.
  fill(file: F): void | Promise<unknown>;
  sync(file: F): void | Promise<void>;
  // The temporary's stat, and the temporary renamed over the image.
  commit(file: F, tmp: string): StoreStat | Promise<StoreStat>;
  close(file: F): void | Promise<void>;
  unlink(tmp: string): void | Promise<void>;
  syncDir(): void | Promise<void>;
}

// Runs a step list, handing each yielded value back, a promise once it
// settled. Steps that give no promise run on at once: a list of
// synchronous calls is over before this returns (undefined then).
function runSteps(steps: Generator<unknown, void, unknown>): void | Promise<void> {
  return resume(steps, () => steps.next());
}

function resume(
  steps: Generator<unknown, void, unknown>,
  step: () => IteratorResult<unknown, void>,
): void | Promise<void> {
  for (let r = step(); !r.done; r = steps.next(r.value)) {
    const value = r.value;
    if (value instanceof Promise) {
      return value.then(
        (v: unknown) => resume(steps, () => steps.next(v)),
        (e: unknown) => resume(steps, () => steps.throw(e)),
      );
    }
  }
}

function code(e: unknown): string | undefined {
  return (e as { code?: string } | null)?.code;
}

/**
 * The seed images and per-VMI records under the state directory, one directory
 * per VMI, content-addressed and written atomically. Unsafe keys or paths throw
 * terminal STORE_KEY_INVALID / STORE_UNSAFE_PATH.
 */
export class ImageStore {
  readonly root: string;
  readonly fileMode: number;
  readonly #fs: StoreFs;
  readonly #syncFs: StoreSyncFs | undefined;
  readonly #syncMax: number;
  // Directories this store created or found (synchronous path): a new VMI's
  // write then needs no stat of a file that cannot exist and no failing
  // open (a thrown ENOENT).
  readonly #dirs = new Set<string>();
  // Temporary names: a random prefix per store, a counter per write ('wx'
  // refuses a clash; a leftover from a crash is removed at start).
  readonly #tmpPrefix = randomBytes(6).toString('hex');
  #tmpCount = 0;
  // What this store last wrote to each path (its sha256, not its bytes: a
  // node holds a thousand images) and the file's identity then: while the
  // file is still that inode, size and mtime, an identical image is
  // recognised without reading the file back.
  readonly #last = new Map<string, { sha256: string; ino: number; size: number; mtimeMs: number }>();

  constructor(options: ImageStoreOptions) {
    this.root = options.root;
    this.fileMode = options.fileMode ?? 0o640;
    this.#fs = options.fs ?? nodeFs;
    this.#syncFs = options.syncFs ?? (options.fs ? undefined : nodeFsSync);
    this.#syncMax = options.syncMaxBytes ?? DEFAULT_SYNC_MAX_BYTES;
  }

  dirFor(key: ImageKey): string {
    const check = (field: keyof ImageKey, re: RegExp) => {
      const v = key[field];
      if (typeof v !== 'string' || !re.test(v) || v.includes('..')) {
        throw new VmseedError(
          'STORE_KEY_INVALID',
          `${field}: not a valid Kubernetes ${field} (it could name a path outside the image root); the VMI is skipped`,
          { field },
        );
      }
    };
    check('namespace', NAMESPACE_RE);
    check('name', NAME_RE);
    check('uid', UID_RE);
    return join(this.root, key.namespace, `${key.name}_${key.uid}`);
  }

  // Where the image with this sha256 (hex, at least its first 16 digits) lives.
  pathFor(key: ImageKey, datasource: Datasource, sha256: string): string {
    if (!DATASOURCES.includes(datasource)) {
      throw new VmseedError('STORE_KEY_INVALID', `datasource: '${String(datasource)}' is not nocloud or configdrive`, {
        field: 'datasource',
      });
    }
    if (typeof sha256 !== 'string' || !SHA_RE.test(sha256)) {
      throw new VmseedError(
        'STORE_KEY_INVALID',
        "sha256: not a lower-case hex digest of at least 16 digits; pass the image's sha256",
        { field: 'sha256' },
      );
    }
    return join(this.dirFor(key), `${datasource}-${sha256.slice(0, SHA_PREFIX_HEX)}.iso`);
  }

  // Writes the image under its content-addressed name unless that file
  // already holds these bytes. Older images of the VMI stay until prune().
  // The store keeps a reference to `bytes` to recognise them next time:
  // do not mutate them afterwards.
  // `sha256` (hex, of `bytes`) saves hashing when the caller already has it.
  // `signal` (the reconcile's) aborted while the bytes are on their way:
  // the temporary is removed before it takes the image's name, so a VMI
  // that went, or a seed already replaced, never gets this image.
  async write(
    key: ImageKey,
    datasource: Datasource,
    bytes: Uint8Array,
    options: { fsync?: boolean; sha256?: string; signal?: AbortSignal } = {},
  ): Promise<{ path: string; written: boolean }> {
    const digest = new Digest(bytes, options.sha256);
    const fsync = options.fsync ?? true;
    const signal = options.signal;
    const path = this.pathFor(key, datasource, digest.hex);
    const dir = dirname(path);
    const sfs = this.#syncFs;
    if (sfs && bytes.length <= this.#syncMax) {
      try {
        return await this.#writeSync(sfs, dir, path, bytes, fsync, digest, signal);
      } catch (e) {
        throw this.#wrap(`write ${path}`, e);
      }
    }
    return this.#io(`write ${path}`, async () => {
      await this.#verifyDirs(dir);
      let written = false;
      if (!(await this.#same(path, bytes, digest))) {
        await runSteps(this.#atomicWrite(this.#poolCalls(dir, path, bytes), path, digest, fsync, signal));
        written = true;
      }
      return { path, written };
    });
  }

  // write()'s steps (atomicWrite) in synchronous calls. Without fsync it
  // runs to completion synchronously (no await is reached).
  async #writeSync(
    fs: StoreSyncFs,
    dir: string,
    path: string,
    bytes: Uint8Array,
    fsync: boolean,
    digest: Digest,
    signal: AbortSignal | undefined,
  ): Promise<{ path: string; written: boolean }> {
    let written = false;
    let freshDir = false;
    this.#verifyDirsSync(fs, dir);
    if (!this.#dirs.has(dir)) {
      // mkdirSync returns the first directory it created, undefined if none.
      freshDir = fs.mkdirSync(dir, { recursive: true, mode: 0o750 }) !== undefined;
      if (this.#dirs.size >= MAX_KNOWN_DIRS) this.#dirs.clear();
      this.#dirs.add(dir);
    }
    if (freshDir || !this.#sameSync(fs, path, bytes, digest)) {
      const pending = runSteps(this.#atomicWrite(this.#syncCalls(fs, dir, path, bytes), path, digest, fsync, signal));
      if (pending) await pending;
      written = true;
    }
    return { path, written };
  }

  // Removes the VMI's images other than `keepPath` (older seeds, the other
  // datasource). Call it once
  // nothing refers to them any more: after the injector put `keepPath` into
  // the domain, or right after write() when no domain is involved.
  // Temporaries are left to cleanupTemporaries(). Returns the removed paths.
  async prune(key: ImageKey, keepPath: string): Promise<string[]> {
    const dir = this.dirFor(key);
    const fs = this.#fs;
    const removed: string[] = [];
    await this.#io(`prune ${dir}`, async () => {
      await this.#verifyDirs(dir);
      for (const f of await this.#entries(dir)) {
        const p = join(dir, f);
        if (p === keepPath || !parseImageName(f)) continue;
        try {
          await fs.unlink(p);
          removed.push(p);
        } catch (e) {
          if (code(e) !== 'ENOENT') throw e;
        }
        this.#last.delete(p);
      }
    });
    return removed;
  }

  async list(): Promise<StoredImage[]> {
    const out: StoredImage[] = [];
    const ls = (p: string) => this.#entries(p);
    // Only real directories are descended and only regular files listed: a
    // symlink or a FIFO under the root is not an image of ours, and garbage
    // collection never reaches what it points to.
    const kind = async (p: string) => {
      try {
        const st = await this.#fs.lstat(p);
        return st.isSymbolicLink() ? 'other' : st.isDirectory() ? 'dir' : st.isFile() ? 'file' : 'other';
      } catch (e) {
        if (code(e) === 'ENOENT') return 'gone';
        throw e;
      }
    };
    await this.#io(`list ${this.root}`, async () => {
      for (const namespace of await ls(this.root)) {
        if ((await kind(join(this.root, namespace))) !== 'dir') continue;
        for (const vmiDir of await ls(join(this.root, namespace))) {
          const sep = vmiDir.indexOf('_');
          if (sep <= 0) continue;
          if ((await kind(join(this.root, namespace, vmiDir))) !== 'dir') continue;
          const name = vmiDir.slice(0, sep);
          const uid = vmiDir.slice(sep + 1);
          for (const file of await ls(join(this.root, namespace, vmiDir))) {
            const parsed = parseImageName(file);
            if (!parsed) continue;
            const path = join(this.root, namespace, vmiDir, file);
            let st: StoreStat;
            try {
              st = await this.#fs.lstat(path);
            } catch (e) {
              if (code(e) === 'ENOENT') continue; // pruned meanwhile
              throw e;
            }
            if (!st.isFile()) continue;
            out.push({ namespace, name, uid, ...parsed, path, size: st.size });
          }
        }
      }
    });
    return out;
  }

  // Writes one of the VMI's records (VMI_RECORDS) the way write() writes an
  // image: a temporary in the VMI's directory, fsync, rename, fsync of the
  // directory. A directory in its place is refused like one in an image's.
  async writeRecord(key: ImageKey, record: VmiRecord, text: string, options: { fsync?: boolean } = {}): Promise<void> {
    const path = this.#recordPath(key, record);
    const bytes = Buffer.from(text, 'utf8');
    if (bytes.length > MAX_RECORD_BYTES) {
      throw new VmseedError(
        'INTERNAL',
        `image store: record ${record} is ${bytes.length} bytes, over ${MAX_RECORD_BYTES}; this is a vmseed bug, report it`,
        { kind: 'terminal', field: record },
      );
    }
    const dir = dirname(path);
    const fs = this.#fs;
    const fsync = options.fsync ?? true;
    await this.#io(`write ${path}`, async () => {
      await this.#verifyDirs(dir);
      await fs.mkdir(dir, { recursive: true, mode: 0o750 });
      try {
        if ((await fs.lstat(path)).isDirectory()) throw this.#unsafe(path, 'is a directory where a record goes');
      } catch (e) {
        if (code(e) !== 'ENOENT') throw e;
      }
      const tmp = this.#tmpFor(path);
      const fh = await fs.open(tmp, 'wx', this.fileMode);
      let renamed = false;
      try {
        await settled([fh.writeFile(bytes), fh.chmod(this.fileMode)]);
        if (fsync) await fh.sync();
        await fs.rename(tmp, path);
        renamed = true;
      } finally {
        await fh.close().catch(() => {});
        if (!renamed) await fs.unlink(tmp).catch(() => {});
      }
      if (fsync) await this.#syncDir(dir);
    });
  }

  // The record's text; undefined when there is none, or when what is there
  // is not a regular file of at most MAX_RECORD_BYTES (never followed).
  async readRecord(key: ImageKey, record: VmiRecord): Promise<string | undefined> {
    const path = this.#recordPath(key, record);
    return this.#io(`read ${path}`, async () => {
      await this.#verifyDirs(dirname(path));
      const bytes = await this.#readRegular(path, MAX_RECORD_BYTES);
      return bytes === undefined ? undefined : Buffer.from(bytes).toString('utf8');
    });
  }

  #recordPath(key: ImageKey, record: VmiRecord): string {
    if (!VMI_RECORDS.includes(record))
      throw new VmseedError(
        'STORE_KEY_INVALID',
        `record: '${String(record)}' is not one of ${VMI_RECORDS.join(', ')}`,
        { field: 'record' },
      );
    return join(this.dirFor(key), record);
  }

  // Removes all of the VMI's images and records and its now-empty directories.
  async remove(key: ImageKey): Promise<void> {
    const dir = this.dirFor(key);
    const fs = this.#fs;
    this.#dirs.delete(dir);
    await this.#io(`remove ${dir}`, async () => {
      await this.#verifyDirs(dir);
      // Only vmseed's own names: whatever else someone put there stays, and
      // so does the directory (rmdir below then finds it not empty).
      for (const f of await this.#entries(dir)) {
        if (!parseImageName(f) && !TEMP_RE.test(f) && !(VMI_RECORDS as readonly string[]).includes(f)) continue;
        this.#last.delete(join(dir, f));
        try {
          await fs.unlink(join(dir, f));
        } catch (e) {
          // A directory named like an image is not ours either.
          if (code(e) !== 'ENOENT' && code(e) !== 'EISDIR' && code(e) !== 'EPERM') throw e;
        }
      }
      for (const d of [dir, join(this.root, key.namespace)]) {
        try {
          await fs.rmdir(d);
        } catch (e) {
          if (code(e) === 'ENOTEMPTY' || code(e) === 'EEXIST' || code(e) === 'ENOENT') break;
          throw e;
        }
      }
    });
  }

  // A directory's entries, sorted; none when it (or a parent) is not there.
  async #entries(dir: string): Promise<string[]> {
    try {
      return (await this.#fs.readdir(dir)).sort();
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ENOTDIR') return [];
      throw e;
    }
  }

  // Deletes temporaries a crash left mid-write; run at start, before writes.
  async cleanupTemporaries(): Promise<string[]> {
    const removed: string[] = [];
    const fs = this.#fs;
    const visit = async (dir: string, depth: number): Promise<void> => {
      for (const n of await this.#entries(dir)) {
        const p = join(dir, n);
        if (depth === 2) {
          if (TEMP_RE.test(n)) {
            try {
              await fs.unlink(p);
              removed.push(p);
            } catch (e) {
              if (code(e) !== 'ENOENT' && code(e) !== 'EISDIR' && code(e) !== 'EPERM') throw e;
            }
          }
        } else {
          // Never descend through a symlink or into a non-directory.
          let st: StoreStat;
          try {
            st = await fs.lstat(p);
          } catch (e) {
            if (code(e) === 'ENOENT') continue;
            throw e;
          }
          if (st.isDirectory() && !st.isSymbolicLink()) await visit(p, depth + 1);
        }
      }
    };
    await this.#io(`clean ${this.root}`, () => visit(this.root, 0));
    return removed;
  }

  // One atomic write: the bytes go to a temporary in the image's directory,
  // renamed over `path` once complete (and, with fsync, on disk), so a
  // reader sees the old image or the new one, never part of one. Each
  // `yield` is one call of `calls`, its result handed back (runSteps).
  *#atomicWrite<F>(
    calls: TempFileCalls<F>,
    path: string,
    digest: Digest,
    fsync: boolean,
    signal: AbortSignal | undefined,
  ): Generator<unknown, void, unknown> {
    const tmp = this.#tmpFor(path);
    const file = (yield calls.open(tmp)) as F;
    let renamed = false;
    try {
      yield calls.fill(file);
      if (fsync) yield calls.sync(file);
      throwIfAborted(signal, path);
      const st = (yield calls.commit(file, tmp)) as StoreStat;
      renamed = true;
      this.#remember(path, digest, st);
    } catch (e) {
      this.#last.delete(path);
      throw e;
    } finally {
      yield calls.close(file);
      if (!renamed) yield calls.unlink(tmp);
    }
    if (fsync) yield calls.syncDir();
  }

  // The atomic write's calls through fs/promises (the thread pool).
  #poolCalls(dir: string, path: string, bytes: Uint8Array): TempFileCalls<StoreFileHandle> {
    const fs = this.#fs;
    return {
      // The directory usually exists: create it only when open says so.
      open: (tmp) =>
        fs.open(tmp, 'wx', this.fileMode).catch(async (e) => {
          if (code(e) !== 'ENOENT') throw e;
          await fs.mkdir(dir, { recursive: true, mode: 0o750 });
          return fs.open(tmp, 'wx', this.fileMode);
        }),
      // open()'s mode is filtered by the umask; the configured mode is a
      // promise. Independent calls go to the thread pool together.
      fill: (fh) => settled([fh.writeFile(bytes), fh.chmod(this.fileMode)]),
      sync: (fh) => fh.sync(),
      commit: async (fh, tmp) => (await settled([fh.stat(), fs.rename(tmp, path)] as const))[0],
      close: (fh) => fh.close().catch(() => {}),
      unlink: (tmp) => fs.unlink(tmp).catch(() => {}),
      syncDir: () => this.#syncDir(dir),
    };
  }

  // The atomic write's calls made synchronously; fsync alone goes to the
  // thread pool.
  #syncCalls(fs: StoreSyncFs, dir: string, path: string, bytes: Uint8Array): TempFileCalls<number> {
    const fsyncFd = (fd: number) =>
      new Promise<void>((resolve, reject) => fs.fsync(fd, (err) => (err ? reject(err) : resolve())));
    const open = (tmp: string) => fs.openSync(tmp, 'wx', this.fileMode);
    return {
      open: (tmp) => {
        try {
          return open(tmp);
        } catch (e) {
          // The directory went away behind the store's back.
          if (code(e) !== 'ENOENT') throw e;
          fs.mkdirSync(dir, { recursive: true, mode: 0o750 });
          return open(tmp);
        }
      },
      fill: (fd) => {
        // A leading run of zero pages (an ISO's 32 KiB system area) is left
        // as a hole: it reads back as zeros, and neither the page cache
        // copy nor ext4's block allocation is paid for it.
        let off = zeroPrefix(bytes);
        while (off < bytes.length) off += fs.writeSync(fd, bytes, off, bytes.length - off, off);
        fs.fchmodSync(fd, this.fileMode);
      },
      sync: fsyncFd,
      commit: (fd, tmp) => {
        const st = fs.fstatSync(fd);
        fs.renameSync(tmp, path);
        return st;
      },
      close: (fd) => {
        try {
          fs.closeSync(fd);
        } catch {
          // the data is already renamed into place or about to be unlinked
        }
      },
      unlink: (tmp) => {
        try {
          fs.unlinkSync(tmp);
        } catch {
          // cleanupTemporaries() removes it at the next start
        }
      },
      syncDir: () => {
        const dfd = fs.openSync(dir, 'r');
        return fsyncFd(dfd).finally(() => fs.closeSync(dfd));
      },
    };
  }

  #tmpFor(path: string): string {
    return join(dirname(path), `.${basename(path)}${TMP_MARK}${this.#tmpPrefix}-${(this.#tmpCount++).toString(36)}`);
  }

  #remember(path: string, digest: Digest, st: StoreStat): void {
    this.#last.delete(path);
    this.#last.set(path, { sha256: digest.hex, ino: st.ino, size: st.size, mtimeMs: st.mtimeMs });
    if (this.#last.size > MAX_REMEMBERED) this.#last.delete(this.#last.keys().next().value!);
  }

  // Is the file at `path` these bytes? Anything but a regular file (a
  // symlink, a FIFO named like the image) is "no": rename() then replaces
  // the entry itself. A directory there is refused.
  #sameSync(fs: StoreSyncFs, path: string, bytes: Uint8Array, digest: Digest): boolean {
    const st = fs.lstatSync(path, { throwIfNoEntry: false });
    if (st === undefined) return false;
    if (st.isDirectory()) throw this.#unsafe(path, 'is a directory where the image goes');
    if (!st.isFile() || st.size !== bytes.length) return false;
    const last = this.#last.get(path);
    if (last && last.ino === st.ino && last.size === st.size && last.mtimeMs === st.mtimeMs)
      return last.sha256 === digest.hex;
    const read = this.#readRegularSync(fs, path, bytes.length);
    return read !== undefined && Buffer.from(read).equals(bytes);
  }

  async #same(path: string, bytes: Uint8Array, digest: Digest): Promise<boolean> {
    let st: StoreStat;
    try {
      st = await this.#fs.lstat(path);
    } catch (e) {
      if (code(e) === 'ENOENT') return false;
      throw e;
    }
    if (st.isDirectory()) throw this.#unsafe(path, 'is a directory where the image goes');
    if (!st.isFile() || st.size !== bytes.length) return false;
    const last = this.#last.get(path);
    if (last && last.ino === st.ino && last.size === st.size && last.mtimeMs === st.mtimeMs)
      return last.sha256 === digest.hex;
    const read = await this.#readRegular(path, bytes.length);
    return read !== undefined && Buffer.from(read).equals(bytes);
  }

  // The file's bytes if it is a regular file (not through a symlink) of at
  // most `max` bytes; undefined otherwise. Never blocks on a FIFO.
  #readRegularSync(fs: StoreSyncFs, path: string, max: number): Uint8Array | undefined {
    let fd: number;
    try {
      fd = fs.openSync(path, READ_FLAGS);
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ELOOP' || code(e) === 'ENXIO') return undefined;
      throw e;
    }
    try {
      const st = fs.fstatSync(fd);
      if (!st.isFile() || st.size > max) return undefined;
      const buf = new Uint8Array(st.size);
      let off = 0;
      while (off < buf.length) {
        const n = fs.readSync(fd, buf, off, buf.length - off, off);
        if (n === 0) break;
        off += n;
      }
      return off === buf.length ? buf : undefined;
    } finally {
      fs.closeSync(fd);
    }
  }

  async #readRegular(
    path: string,
    max: number,
    onChunk?: (chunk: Uint8Array) => void,
  ): Promise<Uint8Array | undefined> {
    let fh: StoreFileHandle;
    try {
      fh = await this.#fs.open(path, READ_FLAGS);
    } catch (e) {
      if (code(e) === 'ENOENT' || code(e) === 'ELOOP' || code(e) === 'ENXIO') return undefined;
      throw e;
    }
    try {
      const st = await fh.stat();
      if (!st.isFile() || st.size > max) return undefined;
      const size = st.size;
      // Hashing streams through one chunk; a comparison needs the whole.
      const buf = new Uint8Array(onChunk ? Math.min(size, 1024 * 1024) : size);
      let pos = 0;
      while (pos < size) {
        const off = onChunk ? 0 : pos;
        const { bytesRead } = await fh.read(buf, off, Math.min(buf.length - off, size - pos), pos);
        if (bytesRead === 0) break;
        onChunk?.(buf.subarray(off, off + bytesRead));
        pos += bytesRead;
      }
      return pos === size ? buf : undefined;
    } finally {
      await fh.close().catch(() => {});
    }
  }

  // sha256 (hex) of an image under the root: a regular file reached without
  // following a symlink, at most MAX_IMAGE_READ_BYTES; undefined for
  // anything else (garbage collection then treats it as not ours to keep).
  async hashImage(path: string): Promise<string | undefined> {
    if (!this.#under(path)) return undefined;
    const hash = createHash('sha256');
    const read = await this.#io(`read ${path}`, () =>
      this.#readRegular(path, MAX_IMAGE_READ_BYTES, (c) => hash.update(c)),
    );
    return read === undefined ? undefined : hash.digest('hex');
  }

  // Size and mtime of a regular file under the root, by lstat.
  async imageStat(path: string): Promise<{ size: number; mtimeMs: number } | undefined> {
    if (!this.#under(path)) return undefined;
    try {
      const st = await this.#fs.lstat(path);
      return st.isFile() ? { size: st.size, mtimeMs: st.mtimeMs } : undefined;
    } catch {
      return undefined;
    }
  }

  #under(path: string): boolean {
    const rel = relative(this.root, path);
    return rel !== '' && !rel.startsWith('..') && !rel.startsWith('/');
  }

  // The VMI's directory and its namespace's must be real directories, or
  // not exist yet.
  async #verifyDirs(dir: string): Promise<void> {
    for (const d of [dirname(dir), dir]) {
      let st: StoreStat;
      try {
        st = await this.#fs.lstat(d);
      } catch (e) {
        if (code(e) === 'ENOENT') return;
        throw e;
      }
      if (st.isSymbolicLink() || !st.isDirectory())
        throw this.#unsafe(d, st.isSymbolicLink() ? 'is a symbolic link' : 'is not a directory');
    }
  }

  #verifyDirsSync(fs: StoreSyncFs, dir: string): void {
    for (const d of [dirname(dir), dir]) {
      const st = fs.lstatSync(d, { throwIfNoEntry: false });
      if (st === undefined) return;
      if (st.isSymbolicLink() || !st.isDirectory())
        throw this.#unsafe(d, st.isSymbolicLink() ? 'is a symbolic link' : 'is not a directory');
    }
  }

  #unsafe(path: string, what: string): VmseedError {
    const rel = relative(this.root, path);
    return new VmseedError(
      'STORE_UNSAFE_PATH',
      `image store: ${rel} ${what}; vmseed did not make it and leaves it alone. Remove it from the state directory to let the VMI be seeded`,
      { kind: 'terminal', field: rel },
    );
  }

  async #syncDir(dir: string): Promise<void> {
    const fh = await this.#fs.open(dir, 'r');
    try {
      await fh.sync();
    } finally {
      await fh.close();
    }
  }

  async #io<T>(what: string, fn: () => Promise<T>): Promise<T> {
    try {
      return await fn();
    } catch (e) {
      throw this.#wrap(what, e);
    }
  }

  #wrap(what: string, e: unknown): VmseedError {
    if (e instanceof VmseedError) return e;
    return new VmseedError(
      'STORE_IO_FAILED',
      `image store: ${what} failed (${code(e) ?? 'error'}); check the directory's permissions and free space`,
      {
        kind: 'retryable',
        cause: e,
      },
    );
  }
}

// The sha256 of an image, computed only when a comparison needs it.
class Digest {
  readonly #bytes: Uint8Array;
  #hex: string | undefined;

  constructor(bytes: Uint8Array, hex?: string) {
    this.#bytes = bytes;
    this.#hex = hex;
  }

  get hex(): string {
    this.#hex ??= createHash('sha256').update(this.#bytes).digest('hex');
    return this.#hex;
  }
}

function throwIfAborted(signal: AbortSignal | undefined, path: string): void {
  if (signal?.aborted) throw cancelledBy(signal, `writing ${basename(path)}`);
}
