// Local mode: VMIs, Secrets and ConfigMaps from a directory of YAML files,
// watched with chokidar. Adding, editing or deleting a file is an add,
// update or delete of the objects in it. Also the RefResolver for them.
//
// What a file holds is whatever a read finds once the file has settled
// (settle.ts), never what an event said: the last content on disk wins
// whatever the editor did (write in place, rename over, delete and create,
// a ConfigMap volume's `..data` swap, many edits in a burst).
import { createHash } from 'node:crypto';
import type { Dirent } from 'node:fs';
import { readdir, stat } from 'node:fs/promises';
import { basename, isAbsolute, join, relative, resolve, sep } from 'node:path';
import { watch, type ChokidarOptions, type FSWatcher } from 'chokidar';
import type { Logger } from 'pino';
import type { ConfigMapObject, RefResolver, SecretObject, VmiObject } from '../../api/objects.ts';
import { parseManifests, type ManifestObjects } from './manifests.ts';
import { asVmseedError, VmseedError } from '../../errors.ts';
import { readManifest } from './manifest-read.ts';
import { PathSettler, type SettleResult } from './settle.ts';
import type { SourceError, WatchStatus } from '../../status/snapshot.ts';
import { keyOf, type KeyHandler, type VmiSource } from '../../kube/vmi-source.ts';

const MANIFEST = /\.(ya?ml|json)$/i;

/**
 * How long (ms) a manifest must be quiet before it is read; a removal (the file
 * gone, or objects gone from it) waits for a second read this much later.
 */
export const SETTLE_MS = 250;
// A file rewritten without pause is still read this often.
const MAX_WAIT_SETTLES = 10;
// Listings of a new directory after the first (see #relist).
const NEW_DIR_LISTINGS = 3;
const INITIAL_READS = 16;

/** What a LocalDirSource watches (`dir`) and whom it tells (`onKey`). */
export interface LocalSourceOptions {
  dir: string;
  logger: Logger;
  onKey: KeyHandler;
  // chokidar polling, for file systems without inotify.
  usePolling?: boolean;
  // Default SETTLE_MS; tests shorten it.
  settleMs?: number;
  // Default chokidar's; tests hand in one that misses events.
  watch?: (dir: string, options: ChokidarOptions) => FSWatcher;
}

interface Applied {
  objects: ManifestObjects;
  hash: string;
}

interface FileProblem {
  code: VmseedError['code'];
  message: string;
  at: number;
}

type FileRead = { kind: 'missing' } | { kind: 'text'; text: string } | { kind: 'error'; error: VmseedError };

// A removal waiting for its confirming read: the content's hash, or this.
const MISSING = 'missing';

/**
 * Local mode's VMI source and RefResolver: the VMIs, Secrets and ConfigMaps in
 * the YAML/JSON files under a directory, re-read once each file has settled.
 */
export class LocalDirSource implements VmiSource, RefResolver {
  readonly #opts: LocalSourceOptions;
  readonly #root: string;
  readonly #log: Logger;
  readonly #settler: PathSettler;
  // file -> what it held the last time it parsed
  readonly #files = new Map<string, Applied>();
  readonly #pendingRemoval = new Map<string, string>();
  readonly #fileErrors = new Map<string, FileProblem>();
  // Directories seen in the tree: an event naming one lists it again, once
  // it has settled too.
  readonly #dirs = new Set<string>();
  readonly #dirSettler: PathSettler;
  // A new directory's extra listings left (see #relist).
  readonly #newDirs = new Map<string, number>();
  #vmis = new Map<string, VmiObject>();
  #secrets = new Map<string, SecretObject>();
  #configMaps = new Map<string, ConfigMapObject>();
  #watcher: FSWatcher | undefined;
  #synced = false;
  #syncedWaiters: Array<() => void> = [];
  #lastEventAt: number | undefined;
  #watchError: string | undefined;

  constructor(options: LocalSourceOptions) {
    this.#opts = options;
    this.#root = resolve(options.dir);
    this.#log = options.logger;
    const settleMs = options.settleMs ?? SETTLE_MS;
    this.#settler = new PathSettler({
      settleMs,
      maxWaitMs: settleMs * MAX_WAIT_SETTLES,
      read: (path, current, quiet) => this.#read(path, current, quiet),
      onError: (path, e) =>
        this.#log.error({ file: this.#name(path), err: { message: (e as Error).message } }, 'local source failed'),
    });
    this.#dirSettler = new PathSettler({
      settleMs,
      maxWaitMs: settleMs * MAX_WAIT_SETTLES,
      read: (dir) => this.#relist(dir),
      onError: (dir, e) =>
        this.#log.error({ dir: this.#name(dir), err: { message: (e as Error).message } }, 'listing a directory failed'),
    });
  }

  async start(): Promise<void> {
    const w = (this.#opts.watch ?? watch)(this.#root, {
      // Entries under a `..` name are a ConfigMap or Secret volume's
      // internals (`..data`, `..<timestamp>`): their files are read through
      // the visible symlinks, and a swap shows as an event on the directory.
      ignored: (path, stats) => this.#internal(path) || ((stats?.isFile() ?? false) && !MANIFEST.test(path)),
      // The listing after 'ready' reads every file once.
      ignoreInitial: true,
      usePolling: this.#opts.usePolling ?? false,
      interval: 100,
    });
    this.#watcher = w;
    this.#dirs.add(this.#root);
    w.on('all', (event, path) => this.#onEvent(event, path));
    // Unthrottled: chokidar's own events drop repeats (see settle.ts).
    w.on('raw', (_event, path, details) => this.#onRaw(path, details));
    w.on('error', (e) => {
      this.#watchError = (e as Error).message;
      this.#log.warn({ err: { message: this.#watchError } }, 'watching the manifest directory failed');
    });
    await new Promise<void>((resolve) => w.once('ready', () => resolve()));
    // chokidar can miss a file renamed into the directory while its initial
    // scan runs: the listing after 'ready' finds it, and from here on an
    // event follows every change.
    const { files, dirs } = (await this.#list(this.#root)) ?? { files: [], dirs: [] };
    for (const d of dirs) this.#dirs.add(d);
    // A few at a time: each read holds a file descriptor.
    for (let i = 0; i < files.length; i += INITIAL_READS) {
      await Promise.all(files.slice(i, i + INITIAL_READS).map((p) => this.#settler.readNow(p)));
    }
    this.#synced = true;
    this.#lastEventAt = Date.now();
    const waiters = this.#syncedWaiters;
    this.#syncedWaiters = [];
    for (const f of waiters) f();
    this.#log.info({ dir: this.#opts.dir, files: this.#files.size, vmis: this.#vmis.size }, 'local manifests loaded');
  }

  // Every file read again (the agent's periodic resync): a change no event
  // reported is applied.
  resync(): void {
    if (this.#synced) this.#dirSettler.touch(this.#root);
  }

  #onEvent(event: string, path: string): void {
    const p = resolve(path);
    if (event === 'addDir' && !this.#dirs.has(p)) this.#newDir(p);
    else if (event === 'unlinkDir') this.#dirSettler.touch(p);
    // Late copies of the raw events: a read follows, none is voided.
    else if (MANIFEST.test(p) && !this.#internal(p)) this.#settler.recheck(p);
  }

  // fs.watch reports a name relative to the watched directory, or a file's
  // own name; polling reports the full path.
  #onRaw(path: string | null, details: unknown): void {
    const watched = (details as { watchedPath?: unknown } | undefined)?.watchedPath;
    if (typeof watched !== 'string') {
      if (path) this.#hint(resolve(path));
      return;
    }
    const at = resolve(watched);
    if (!path) this.#hint(at);
    else if (!this.#dirs.has(at) && basename(at) === path) this.#hint(at);
    else this.#hint(join(at, path));
  }

  #hint(path: string): void {
    const rel = relative(this.#root, path);
    if (isAbsolute(rel) || rel.split(sep)[0] === '..') return;
    this.#lastEventAt = Date.now();
    const parts = rel.split(sep);
    const hidden = parts.findIndex((c) => c.startsWith('..'));
    if (hidden >= 0) this.#dirSettler.touch(join(this.#root, ...parts.slice(0, hidden)));
    else if (this.#dirs.has(path)) this.#dirSettler.touch(path);
    else if (MANIFEST.test(path)) this.#settler.touch(path);
    // Maybe a new directory (chokidar's addDir may come late, its own
    // listing being throttled), maybe an editor's temporary file.
    else this.#newDir(path);
  }

  #newDir(path: string): void {
    if (!this.#newDirs.has(path)) this.#newDirs.set(path, NEW_DIR_LISTINGS);
    this.#dirSettler.touch(path);
  }

  #internal(path: string): boolean {
    const rel = relative(this.#root, resolve(path));
    return rel.split(sep).some((c) => c.startsWith('..') && c !== '..');
  }

  // Every manifest under `dir`, on disk or known, is read once it settles.
  // chokidar lists a new directory before it watches it: what is created
  // in between has no event, so a new directory is listed a few times.
  async #relist(dir: string): Promise<SettleResult> {
    const listed = await this.#list(dir);
    if (listed) {
      this.#dirs.add(dir);
      for (const d of listed.dirs) this.#dirs.add(d);
    } else if (dir !== this.#root) this.#dirs.delete(dir);
    const under = (p: string) => p.startsWith(dir + sep);
    const known = [...this.#files.keys(), ...this.#fileErrors.keys()].filter(under);
    for (const p of new Set([...(listed?.files ?? []), ...known])) this.#settler.recheck(p);
    const left = this.#newDirs.get(dir) ?? 0;
    if (left <= 0 || !listed) {
      this.#newDirs.delete(dir);
      return 'done';
    }
    this.#newDirs.set(dir, left - 1);
    return 'confirm';
  }

  // Undefined when `dir` is not a directory (any more).
  async #list(dir: string): Promise<{ files: string[]; dirs: string[] } | undefined> {
    let entries: Dirent[];
    try {
      entries = await readdir(dir, { recursive: true, withFileTypes: true });
    } catch {
      return undefined;
    }
    const files: string[] = [];
    const dirs: string[] = [];
    for (const e of entries) {
      const p = join(e.parentPath, e.name);
      if (this.#internal(p)) continue;
      if (e.isDirectory()) dirs.push(p);
      else if (MANIFEST.test(e.name)) files.push(p);
    }
    return { files, dirs };
  }

  #name(path: string): string {
    return relative(this.#root, path) || path;
  }

  async #readFile(path: string): Promise<FileRead> {
    const name = this.#name(path);
    try {
      // A directory named like a manifest is not one.
      if ((await stat(path)).isDirectory()) return { kind: 'missing' };
      return { kind: 'text', text: await readManifest(path, name) };
    } catch (e) {
      if (e instanceof VmseedError) return { kind: 'error', error: e };
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' || code === 'ENOTDIR') return { kind: 'missing' };
      const error = new VmseedError(
        'MANIFEST_INVALID',
        `${name} cannot be read (${code ?? 'error'}); check that the agent may read it`,
        { kind: 'terminal', field: name },
      );
      return { kind: 'error', error };
    }
  }

  // One settled read of one file: applied, shown as an error, or (a
  // removal) held until a second read agrees.
  async #read(path: string, current: () => boolean, quiet: boolean): Promise<SettleResult> {
    // A removal is confirmed by two reads with no change seen in between:
    // two short absences in a row are not one long one.
    if (!quiet) this.#pendingRemoval.delete(path);
    const got = await this.#readFile(path);
    // Touched while reading: what was read may be older than the file.
    if (!current()) return 'done';
    if (got.kind === 'error') return this.#failed(path, got.error);
    let next: Applied | undefined;
    if (got.kind === 'text') {
      const hash = createHash('sha256').update(got.text).digest('hex');
      if (this.#files.get(path)?.hash === hash) {
        this.#pendingRemoval.delete(path);
        this.#fileError(path, undefined);
        return 'done';
      }
      try {
        next = { objects: parseManifests(got.text, this.#name(path)), hash };
      } catch (e) {
        return this.#failed(path, asVmseedError(e));
      }
    }
    // A file replaced by delete and create, or read half-written in place,
    // must not take its VMIs' seeds (and, with libvirt, their disks) away.
    if (this.#removes(path, next?.objects)) {
      const mark = next?.hash ?? MISSING;
      if (this.#pendingRemoval.get(path) !== mark) {
        this.#pendingRemoval.set(path, mark);
        return 'confirm';
      }
    }
    this.#pendingRemoval.delete(path);
    this.#fileError(path, undefined);
    if (next) this.#files.set(path, next);
    else if (!this.#files.delete(path)) return 'done';
    this.#rebuild();
    return 'done';
  }

  // Keep what the file held before: a typo while editing must not take
  // seeds away. The error is shown until the file parses or goes.
  #failed(path: string, err: VmseedError): SettleResult {
    this.#pendingRemoval.delete(path);
    this.#fileError(path, err);
    this.#log.warn({ file: this.#name(path), code: err.code }, err.message);
    return 'done';
  }

  #fileError(path: string, err: VmseedError | undefined): void {
    if (err === undefined) this.#fileErrors.delete(path);
    else this.#fileErrors.set(path, { code: err.code, message: err.message, at: Date.now() });
  }

  // Whether `next` (undefined: the file is gone) lacks an object the file
  // held when it last parsed.
  #removes(path: string, next: ManifestObjects | undefined): boolean {
    const prev = this.#files.get(path)?.objects;
    if (!prev) return false;
    const keys = (o: ManifestObjects) =>
      new Set([
        ...o.vmis.map((v) => `vmi:${keyOf(v)}`),
        ...o.secrets.map((s) => `secret:${keyOf(s)}`),
        ...o.configMaps.map((c) => `configmap:${keyOf(c)}`),
      ]);
    const after = next ? keys(next) : new Set<string>();
    for (const k of keys(prev)) if (!after.has(k)) return true;
    return false;
  }

  // The files that do not read or parse, and the VMIs whose seed may lag
  // behind them: those the file defined when it last parsed, and those of
  // the namespaces its Secrets and ConfigMaps are in.
  sourceErrors(): SourceError[] {
    return [...this.#fileErrors.entries()]
      .sort(([a], [b]) => a.localeCompare(b))
      .map(([path, p]) => {
        const held = this.#files.get(path)?.objects;
        const namespaces = new Set(
          [...(held?.secrets ?? []), ...(held?.configMaps ?? [])].map((o) => o.metadata.namespace),
        );
        const vmis = new Set((held?.vmis ?? []).map((v) => keyOf(v)));
        for (const [k, v] of this.#vmis) if (namespaces.has(v.metadata.namespace)) vmis.add(k);
        return {
          file: this.#name(path),
          code: p.code,
          message: p.message,
          at: new Date(p.at).toISOString(),
          vmis: [...vmis].filter((k) => this.#vmis.has(k)).sort(),
        };
      });
  }

  // Recompute the merged view and enqueue every VMI that changed, and every
  // VMI of a namespace whose Secrets/ConfigMaps changed.
  #rebuild(): void {
    const vmis = new Map<string, VmiObject>();
    const secrets = new Map<string, SecretObject>();
    const configMaps = new Map<string, ConfigMapObject>();
    for (const objs of [...this.#files.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, o]) => o.objects)) {
      for (const v of objs.vmis) vmis.set(keyOf(v), withIdentity(v));
      for (const s of objs.secrets) secrets.set(keyOf(s), s);
      for (const c of objs.configMaps) configMaps.set(keyOf(c), c);
    }
    const changed = new Set<string>();
    for (const k of new Set([...vmis.keys(), ...this.#vmis.keys()])) {
      if (vmis.get(k)?.metadata.resourceVersion !== this.#vmis.get(k)?.metadata.resourceVersion) changed.add(k);
    }
    const touchedNs = new Set<string>();
    for (const [mine, theirs] of [
      [secrets, this.#secrets],
      [configMaps, this.#configMaps],
    ] as Array<[Map<string, SecretObject | ConfigMapObject>, Map<string, SecretObject | ConfigMapObject>]>) {
      for (const k of new Set([...mine.keys(), ...theirs.keys()])) {
        if (JSON.stringify(mine.get(k)) !== JSON.stringify(theirs.get(k))) touchedNs.add(k.slice(0, k.indexOf('/')));
      }
    }
    for (const k of vmis.keys()) if (touchedNs.has(k.slice(0, k.indexOf('/')))) changed.add(k);
    this.#vmis = vmis;
    this.#secrets = secrets;
    this.#configMaps = configMaps;
    for (const k of changed) {
      try {
        this.#opts.onKey(k);
      } catch (e) {
        this.#log.error({ err: { message: (e as Error).message } }, 'enqueue failed');
      }
    }
  }

  async stop(): Promise<void> {
    await this.#watcher?.close();
    this.#watcher = undefined;
    await this.#dirSettler.close();
    await this.#settler.close();
  }

  get(key: string): VmiObject | undefined {
    return this.#vmis.get(key);
  }

  keys(): string[] {
    return [...this.#vmis.keys()];
  }

  synced(): Promise<void> {
    if (this.#synced) return Promise.resolve();
    return new Promise((r) => this.#syncedWaiters.push(r));
  }

  status(): WatchStatus {
    const sourceErrors = this.sourceErrors();
    const latest = [...sourceErrors].sort((a, b) => a.at.localeCompare(b.at)).at(-1);
    const lastError = latest ? `${latest.code}: ${latest.message}` : this.#watchError;
    return {
      mode: 'local',
      synced: this.#synced,
      connected: this.#watcher !== undefined,
      stale: false,
      restarts: 0,
      ...(this.#lastEventAt !== undefined ? { lastEventAt: new Date(this.#lastEventAt).toISOString() } : {}),
      ...(lastError !== undefined ? { lastError } : {}),
      sourceErrors,
    };
  }

  getSecret(namespace: string, name: string): Promise<SecretObject | undefined> {
    const s = this.#secrets.get(`${namespace}/${name}`);
    if (!s || !s.stringData) return Promise.resolve(s);
    // What the API server does on write: stringData folded into data.
    const data = { ...(s.data ?? {}) };
    for (const [k, v] of Object.entries(s.stringData)) data[k] = Buffer.from(v, 'utf8').toString('base64');
    const { stringData: _, ...rest } = s;
    return Promise.resolve({ ...rest, data });
  }

  getConfigMap(namespace: string, name: string): Promise<ConfigMapObject | undefined> {
    return Promise.resolve(this.#configMaps.get(`${namespace}/${name}`));
  }
}

// Files carry no uid or resourceVersion: derive stable ones, so a restart
// finds its images again and an edit is a new version.
function withIdentity(v: VmiObject): VmiObject {
  const rv = createHash('sha256').update(JSON.stringify(v)).digest('hex').slice(0, 16);
  const uid = v.metadata.uid ?? uuidFrom(`vmseed-local/${v.metadata.namespace}/${v.metadata.name}`);
  return { ...v, metadata: { ...v.metadata, uid, resourceVersion: rv } };
}

function uuidFrom(text: string): string {
  const h = createHash('sha1').update(text).digest('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-5${h.slice(13, 16)}-${((parseInt(h.slice(16, 18), 16) & 0x3f) | 0x80).toString(16)}${h.slice(18, 20)}-${h.slice(20, 32)}`;
}
