// Local mode: VMIs, Secrets and ConfigMaps from a directory of YAML files,
// watched with chokidar. Adding, editing or deleting a file is an add,
// update or delete of the objects in it. Also the RefResolver for them.
import { createHash } from 'node:crypto';
import { readdir } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { watch, type FSWatcher } from 'chokidar';
import type { Logger } from 'pino';
import type { ConfigMapObject, RefResolver, SecretObject, VmiObject } from '../../api/types.ts';
import { parseManifests, type ManifestObjects } from './manifests.ts';
import { asVmseedError, VmseedError } from '../../errors.ts';
import { readManifest } from './manifest-read.ts';
import type { WatchStatus } from '../../status/types.ts';
import { keyOf, type KeyHandler, type VmiSource } from '../../kube/vmi-source.ts';

const MANIFEST = /\.(ya?ml|json)$/i;

export interface LocalSourceOptions {
  dir: string;
  logger: Logger;
  onKey: KeyHandler;
  // chokidar polling, for file systems without inotify.
  usePolling?: boolean;
}

export class LocalDirSource implements VmiSource, RefResolver {
  readonly #opts: LocalSourceOptions;
  readonly #log: Logger;
  // file -> what it held last time it parsed
  readonly #files = new Map<string, ManifestObjects>();
  #vmis = new Map<string, VmiObject>();
  #secrets = new Map<string, SecretObject>();
  #configMaps = new Map<string, ConfigMapObject>();
  #watcher: FSWatcher | undefined;
  #synced = false;
  #syncedWaiters: Array<() => void> = [];
  #lastEventAt: number | undefined;
  #lastError: string | undefined;
  readonly #fileErrors = new Map<string, string>();

  constructor(options: LocalSourceOptions) {
    this.#opts = options;
    this.#log = options.logger;
  }

  async start(): Promise<void> {
    const w = watch(this.#opts.dir, {
      ignored: (path, stats) => (stats?.isFile() ?? false) && !MANIFEST.test(path),
      ignoreInitial: false,
      usePolling: this.#opts.usePolling ?? false,
      interval: 100,
    });
    this.#watcher = w;
    // Changes are applied in order, one file at a time.
    let chain = Promise.resolve();
    // What the watcher reported, parsed or not (see the listing below).
    const reported = new Set<string>();
    const onFile = (path: string, removed: boolean) => {
      if (!MANIFEST.test(path)) return;
      reported.add(path);
      chain = chain
        .then(() => this.#apply(path, removed))
        .catch((e: unknown) => this.#log.error({ err: { message: (e as Error).message } }, 'local source failed'));
      return chain;
    };
    w.on('add', (p) => void onFile(p, false));
    w.on('change', (p) => void onFile(p, false));
    w.on('unlink', (p) => void onFile(p, true));
    w.on('error', (e) => {
      this.#lastError = (e as Error).message;
      this.#log.warn({ err: { message: this.#lastError } }, 'watching the manifest directory failed');
    });
    await new Promise<void>((resolve) => w.once('ready', () => resolve()));
    await chain;
    // chokidar can miss a file renamed into the directory while its initial
    // scan runs (4 of 40 starts with a rename 0-1 ms after start): one
    // listing after 'ready' applies what the scan missed, added or removed.
    // From here on the watcher's events carry every change.
    const onDisk = new Set(
      (await readdir(this.#opts.dir, { recursive: true }))
        .filter((f) => MANIFEST.test(f))
        .map((f) => join(this.#opts.dir, f)),
    );
    for (const p of onDisk) if (!reported.has(p)) void onFile(p, false);
    for (const p of this.#files.keys()) if (!onDisk.has(p)) void onFile(p, true);
    await chain;
    this.#synced = true;
    this.#lastEventAt = Date.now();
    const waiters = this.#syncedWaiters;
    this.#syncedWaiters = [];
    for (const f of waiters) f();
    this.#log.info({ dir: this.#opts.dir, files: this.#files.size, vmis: this.#vmis.size }, 'local manifests loaded');
  }

  // Per file: one file that parses must not clear another's error (the
  // initial scan reads them concurrently). The status shows the latest.
  #fileError(path: string, error: string | undefined): void {
    this.#fileErrors.delete(path);
    if (error !== undefined) this.#fileErrors.set(path, error);
    this.#lastError = [...this.#fileErrors.values()].at(-1);
  }

  async #apply(path: string, removed: boolean): Promise<void> {
    const name = relative(this.#opts.dir, path) || path;
    this.#lastEventAt = Date.now();
    if (removed) {
      this.#files.delete(path);
      this.#fileError(path, undefined);
    } else {
      let text: string;
      try {
        text = await readManifest(path, name);
      } catch (e) {
        // Deleted between the event and the read: the unlink event follows.
        if (!(e instanceof VmseedError)) return;
        // Not a regular file, or over the budget: shown like a parse error.
        this.#fileError(path, `${e.code}: ${e.message}`);
        this.#log.warn({ file: name, code: e.code }, e.message);
        return;
      }
      try {
        this.#files.set(path, parseManifests(text, name));
        this.#fileError(path, undefined);
      } catch (e) {
        // Keep what the file held before: a typo while editing must not
        // take seeds away. The error is shown until the file parses.
        const err = asVmseedError(e);
        this.#fileError(path, `${err.code}: ${err.message}`);
        this.#log.warn({ file: name, code: err.code }, err.message);
        return;
      }
    }
    this.#rebuild();
  }

  // Recompute the merged view and enqueue every VMI that changed, and every
  // VMI of a namespace whose Secrets/ConfigMaps changed.
  #rebuild(): void {
    const vmis = new Map<string, VmiObject>();
    const secrets = new Map<string, SecretObject>();
    const configMaps = new Map<string, ConfigMapObject>();
    for (const objs of [...this.#files.entries()].sort(([a], [b]) => a.localeCompare(b)).map(([, o]) => o)) {
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
    return {
      mode: 'local',
      synced: this.#synced,
      connected: this.#watcher !== undefined,
      stale: false,
      restarts: 0,
      ...(this.#lastEventAt !== undefined ? { lastEventAt: new Date(this.#lastEventAt).toISOString() } : {}),
      ...(this.#lastError !== undefined ? { lastError: this.#lastError } : {}),
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
