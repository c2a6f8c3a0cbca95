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
// One directory per VMI, not <name>/<uid>/: each mkdir costs ~70 µs on ext4,
// more than building the image, and a new VMI would pay for two. `_` cannot
// occur in a Kubernetes name or UID, so the directory name splits back
// unambiguously.
// Writes are atomic (temporary file in the same directory, write, fsync,
// rename, fsync of the directory), so QEMU or a reader never sees a partial
// image; temporaries left by a crash are removed by cleanupTemporaries() at
// start. An identical image (same name, same bytes) is not rewritten.
// Seed-sized images take a path of synchronous calls (see
// DEFAULT_SYNC_MAX_BYTES); the steps are the same.
import * as nodeFs from 'node:fs/promises';
import * as nodeFsSync from 'node:fs';
import { createHash, randomBytes } from 'node:crypto';
import { basename, dirname, join } from 'node:path';
import type { Datasource } from '../cloudinit/seed.ts';
import { DATASOURCES } from '../cloudinit/seed.ts';
import { VmseedError } from '../errors.ts';

export interface ImageKey {
  namespace: string;
  name: string;
  uid: string;
}

export interface StoredImage extends ImageKey {
  datasource: Datasource;
  path: string;
  size: number;
  // The first 16 hex digits of the image's sha256, from its name; absent
  // for a `<datasource>.iso` left by a version before content-addressed names.
  sha16?: string;
}

// The few node:fs/promises calls the store makes, so tests can inject faults.
export interface StoreStat {
  size: number;
  ino: number;
  mtimeMs: number;
}

export interface StoreFileHandle {
  writeFile(data: Uint8Array): Promise<void>;
  chmod(mode: number): Promise<void>;
  stat(): Promise<StoreStat>;
  sync(): Promise<void>;
  close(): Promise<void>;
}

export interface StoreFs {
  open(path: string, flags: string, mode?: number): Promise<StoreFileHandle>;
  readFile(path: string): Promise<Uint8Array>;
  stat(path: string): Promise<StoreStat>;
  rename(from: string, to: string): Promise<void>;
  unlink(path: string): Promise<void>;
  mkdir(path: string, options: { recursive: true; mode?: number }): Promise<unknown>;
  readdir(path: string): Promise<string[]>;
  rmdir(path: string): Promise<void>;
  chmod(path: string, mode: number): Promise<void>;
}

// The synchronous calls of the small-image path (see ImageStore.write).
export interface StoreSyncFs {
  openSync(path: string, flags: string, mode?: number): number;
  writeSync(fd: number, data: Uint8Array, offset: number, length: number, position: number): number;
  fchmodSync(fd: number, mode: number): void;
  // fsync stays off the event loop: it takes milliseconds, not microseconds.
  fsync(fd: number, callback: (err: Error | null) => void): void;
  fstatSync(fd: number): StoreStat;
  closeSync(fd: number): void;
  renameSync(from: string, to: string): void;
  unlinkSync(path: string): void;
  mkdirSync(path: string, options: { recursive: true; mode?: number }): unknown;
  statSync(path: string, options: { throwIfNoEntry: false }): StoreStat | undefined;
  readFileSync(path: string): Uint8Array;
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
// is ~8 syscalls of a few µs each plus a memcpy of the image into the page
// cache (~10 µs for 64 KiB); through fs/promises each of the 5 round trips
// costs a thread-pool hop (~20 µs, more on a loaded node), so blocking the
// event loop for ~30-60 µs is cheaper than the hops and blocks nothing the
// agent would otherwise do sooner. Larger images (a 1 MiB user-data is
// ~100 µs of copying, fsync is milliseconds) go through the thread pool.
// fsync (file and directory), when asked for, still goes to the thread
// pool: it takes a millisecond or more, which the event loop must not wait.
export const DEFAULT_SYNC_MAX_BYTES = 256 * 1024;

const TMP_MARK = '.tmp-';
// Kubernetes names: namespace is a DNS label, name a DNS subdomain, uid a
// UUID. Anything else (slashes, '..', NUL) could leave the root.
const NAMESPACE_RE = /^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$/;
const NAME_RE = /^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$/;
const UID_RE = /^[A-Za-z0-9][-A-Za-z0-9]{0,63}$/;

// 64 bits of sha256: a VMI holds a handful of seeds over its life, so a
// collision between two of them is out of reach, and a path stays short.
export const SHA_PREFIX_HEX = 16;
const SHA_RE = /^[0-9a-f]{16,64}$/;
// `<datasource>-<sha16>.iso`, or the stable name of earlier versions.
const IMAGE_RE = /^(nocloud|configdrive)(?:-([0-9a-f]{16}))?\.iso$/;

function parseImageName(file: string): { datasource: Datasource; sha16?: string } | undefined {
  const m = IMAGE_RE.exec(file);
  if (!m) return undefined;
  return m[2] ? { datasource: m[1] as Datasource, sha16: m[2] } : { datasource: m[1] as Datasource };
}

const MAX_REMEMBERED = 16384;
const MAX_KNOWN_DIRS = 16384;
const ZERO_PREFIX = new Uint8Array(32 * 1024);

// Bytes at the start of `bytes` that are zero: 32 KiB (a whole ISO 9660
// system area) or nothing. One memcmp, ~1 µs.
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

function code(e: unknown): string | undefined {
  return (e as { code?: string } | null)?.code;
}

export class ImageStore {
  readonly root: string;
  readonly fileMode: number;
  readonly #fs: StoreFs;
  readonly #syncFs: StoreSyncFs | undefined;
  readonly #syncMax: number;
  // Directories this store created or found (synchronous path): a new VMI's
  // write then needs no stat of a file that cannot exist and no failing
  // open (a thrown ENOENT costs ~10 µs).
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
    this.#fs = options.fs ?? (nodeFs as unknown as StoreFs);
    this.#syncFs = options.syncFs ?? (options.fs ? undefined : (nodeFsSync as unknown as StoreSyncFs));
    this.#syncMax = options.syncMaxBytes ?? DEFAULT_SYNC_MAX_BYTES;
  }

  dirFor(key: ImageKey): string {
    const check = (field: keyof ImageKey, re: RegExp) => {
      const v = key[field];
      if (typeof v !== 'string' || !re.test(v) || v.includes('..')) {
        throw new VmseedError('STORE_KEY_INVALID', `${field}: not a valid Kubernetes ${field} (it could name a path outside the image root); the VMI is skipped`, { field });
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
      throw new VmseedError('STORE_KEY_INVALID', `datasource: '${String(datasource)}' is not nocloud or configdrive`, { field: 'datasource' });
    }
    if (typeof sha256 !== 'string' || !SHA_RE.test(sha256)) {
      throw new VmseedError('STORE_KEY_INVALID', 'sha256: not a lower-case hex digest of at least 16 digits; pass the image\'s sha256', { field: 'sha256' });
    }
    return join(this.dirFor(key), `${datasource}-${sha256.slice(0, SHA_PREFIX_HEX)}.iso`);
  }

  // Writes the image under its content-addressed name unless that file
  // already holds these bytes. Older images of the VMI stay until prune().
  // The store keeps a reference to `bytes` to recognise them next time:
  // do not mutate them afterwards.
  // `sha256` (hex, of `bytes`) saves hashing when the caller already has it.
  async write(key: ImageKey, datasource: Datasource, bytes: Uint8Array, options: { fsync?: boolean; sha256?: string } = {}): Promise<{ path: string; written: boolean }> {
    const digest = new Digest(bytes, options.sha256);
    const fsync = options.fsync ?? true;
    const path = this.pathFor(key, datasource, digest.hex);
    const dir = dirname(path);
    const sfs = this.#syncFs;
    if (sfs && bytes.length <= this.#syncMax) {
      try {
        return await this.#writeSync(sfs, dir, path, bytes, fsync, digest);
      } catch (e) {
        throw this.#wrap(`write ${path}`, e);
      }
    }
    const fs = this.#fs;
    return this.#io(`write ${path}`, async () => {
      let written = false;
      if (!(await this.#same(path, bytes, digest))) {
        const tmp = this.#tmpFor(path);
        // The directory usually exists: create it only when open says so.
        const fh = await fs.open(tmp, 'wx', this.fileMode).catch(async (e) => {
          if (code(e) !== 'ENOENT') throw e;
          await fs.mkdir(dir, { recursive: true, mode: 0o750 });
          return fs.open(tmp, 'wx', this.fileMode);
        });
        let renamed = false;
        try {
          // open()'s mode is filtered by the umask; the configured mode is a
          // promise. Independent calls go to the thread pool together.
          await settled([fh.writeFile(bytes), fh.chmod(this.fileMode)]);
          if (fsync) await fh.sync();
          const [st] = await settled([fh.stat(), fs.rename(tmp, path)] as const);
          renamed = true;
          this.#remember(path, digest, st);
        } catch (e) {
          this.#last.delete(path);
          throw e;
        } finally {
          await fh.close().catch(() => {});
          if (!renamed) await fs.unlink(tmp).catch(() => {});
        }
        if (fsync) await this.#syncDir(dir);
        written = true;
      }
      return { path, written };
    });
  }

  // The same steps as write()'s asynchronous path, in synchronous calls.
  // Without fsync it runs to completion synchronously (no await is reached).
  async #writeSync(fs: StoreSyncFs, dir: string, path: string, bytes: Uint8Array, fsync: boolean, digest: Digest): Promise<{ path: string; written: boolean }> {
    const fsyncFd = (fd: number) => new Promise<void>((resolve, reject) => fs.fsync(fd, (err) => (err ? reject(err) : resolve())));
    let written = false;
    let freshDir = false;
    if (!this.#dirs.has(dir)) {
      // mkdirSync returns the first directory it created, undefined if none.
      freshDir = fs.mkdirSync(dir, { recursive: true, mode: 0o750 }) !== undefined;
      if (this.#dirs.size >= MAX_KNOWN_DIRS) this.#dirs.clear();
      this.#dirs.add(dir);
    }
    if (freshDir || !this.#sameSync(fs, path, bytes, digest)) {
      const tmp = this.#tmpFor(path);
      let fd: number;
      try {
        fd = fs.openSync(tmp, 'wx', this.fileMode);
      } catch (e) {
        // The directory went away behind the store's back.
        if (code(e) !== 'ENOENT') throw e;
        fs.mkdirSync(dir, { recursive: true, mode: 0o750 });
        fd = fs.openSync(tmp, 'wx', this.fileMode);
      }
      let renamed = false;
      try {
        // A leading run of zero pages (an ISO's 32 KiB system area) is left
        // as a hole: it reads back as zeros, and neither the page cache
        // copy nor ext4's block allocation is paid for it.
        let off = zeroPrefix(bytes);
        while (off < bytes.length) off += fs.writeSync(fd, bytes, off, bytes.length - off, off);
        fs.fchmodSync(fd, this.fileMode);
        if (fsync) await fsyncFd(fd);
        const st = fs.fstatSync(fd);
        fs.renameSync(tmp, path);
        renamed = true;
        this.#remember(path, digest, st);
      } catch (e) {
        this.#last.delete(path);
        throw e;
      } finally {
        try {
          fs.closeSync(fd);
        } catch {
          // the data is already renamed into place or about to be unlinked
        }
        if (!renamed) {
          try {
            fs.unlinkSync(tmp);
          } catch {
            // cleanupTemporaries() removes it at the next start
          }
        }
      }
      if (fsync) {
        const dfd = fs.openSync(dir, 'r');
        try {
          await fsyncFd(dfd);
        } finally {
          fs.closeSync(dfd);
        }
      }
      written = true;
    }
    return { path, written };
  }

  // Removes the VMI's images other than `keepPath` (older seeds, the other
  // datasource, a stable-named image of an earlier version). Call it once
  // nothing refers to them any more: after the injector put `keepPath` into
  // the domain, or right after write() when no domain is involved.
  // Temporaries are left to cleanupTemporaries(). Returns the removed paths.
  async prune(key: ImageKey, keepPath: string): Promise<string[]> {
    const dir = this.dirFor(key);
    const fs = this.#fs;
    const removed: string[] = [];
    await this.#io(`prune ${dir}`, async () => {
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
    const fs = this.#fs;
    const ls = (p: string) => this.#entries(p);
    await this.#io(`list ${this.root}`, async () => {
      for (const namespace of await ls(this.root)) {
        for (const vmiDir of await ls(join(this.root, namespace))) {
          const sep = vmiDir.indexOf('_');
          if (sep <= 0) continue;
          const name = vmiDir.slice(0, sep);
          const uid = vmiDir.slice(sep + 1);
          for (const file of await ls(join(this.root, namespace, vmiDir))) {
            const parsed = parseImageName(file);
            if (!parsed) continue;
            const path = join(this.root, namespace, vmiDir, file);
            let size: number;
            try {
              ({ size } = await fs.stat(path));
            } catch (e) {
              if (code(e) === 'ENOENT') continue; // pruned meanwhile
              throw e;
            }
            out.push({ namespace, name, uid, ...parsed, path, size });
          }
        }
      }
    });
    return out;
  }

  // Removes all of the VMI's images and its now-empty directories.
  async remove(key: ImageKey): Promise<void> {
    const dir = this.dirFor(key);
    const fs = this.#fs;
    this.#dirs.delete(dir);
    await this.#io(`remove ${dir}`, async () => {
      for (const f of await this.#entries(dir)) {
        this.#last.delete(join(dir, f));
        await fs.unlink(join(dir, f));
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
          if (n.startsWith('.') && n.includes(TMP_MARK)) {
            await fs.unlink(p);
            removed.push(p);
          }
        } else {
          await visit(p, depth + 1);
        }
      }
    };
    await this.#io(`clean ${this.root}`, () => visit(this.root, 0));
    return removed;
  }

  #tmpFor(path: string): string {
    return join(dirname(path), `.${basename(path)}${TMP_MARK}${this.#tmpPrefix}-${(this.#tmpCount++).toString(36)}`);
  }

  #remember(path: string, digest: Digest, st: StoreStat): void {
    this.#last.delete(path);
    this.#last.set(path, { sha256: digest.hex, ino: st.ino, size: st.size, mtimeMs: st.mtimeMs });
    if (this.#last.size > MAX_REMEMBERED) this.#last.delete(this.#last.keys().next().value!);
  }

  #sameSync(fs: StoreSyncFs, path: string, bytes: Uint8Array, digest: Digest): boolean {
    const st = fs.statSync(path, { throwIfNoEntry: false });
    if (st === undefined || st.size !== bytes.length) return false;
    const last = this.#last.get(path);
    if (last && last.ino === st.ino && last.size === st.size && last.mtimeMs === st.mtimeMs) return last.sha256 === digest.hex;
    return Buffer.from(fs.readFileSync(path)).equals(bytes);
  }

  async #same(path: string, bytes: Uint8Array, digest: Digest): Promise<boolean> {
    try {
      const st = await this.#fs.stat(path);
      if (st.size !== bytes.length) return false;
      const last = this.#last.get(path);
      if (last && last.ino === st.ino && last.size === st.size && last.mtimeMs === st.mtimeMs) return last.sha256 === digest.hex;
      return Buffer.from(await this.#fs.readFile(path)).equals(bytes);
    } catch (e) {
      if (code(e) === 'ENOENT') return false;
      throw e;
    }
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
    return new VmseedError('STORE_IO_FAILED', `image store: ${what} failed (${code(e) ?? 'error'}); check the directory's permissions and free space`, {
      kind: 'retryable',
      cause: e,
    });
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
