// The agent's view of itself and of every VMI, for /status, /status.json
// and /readyz. Holds names, sizes, hashes, codes and our own messages only.
import { access, constants, stat } from 'node:fs/promises';
import type { AgentStatusSnapshot, StatusProblem, StatusSource, VmiState, VmiStatusRecord, WatchStatus } from './status-types.ts';
import type { Metrics } from '../metrics/metrics.ts';

const STATES: VmiState[] = ['pending', 'ready', 'warning', 'error', 'skipped'];
const RECENT = 120;

export interface StatusStoreOptions {
  version: string;
  nodeName: string;
  stateDir: string;
  config: Record<string, string | number | boolean>;
  metrics?: Metrics;
  watch: () => WatchStatus;
  queue: () => { depth: number; inFlight: number };
  // NoCloud HTTP datasource on: NoCloud seeds on disk are marked as served.
  servedOverHttp?: boolean;
  now?: () => Date;
}

export class StatusStore implements StatusSource {
  readonly #opts: StatusStoreOptions;
  readonly #vmis = new Map<string, VmiStatusRecord>();
  readonly #recent: Array<{ at: string; seconds: number }> = [];
  readonly #startedAt: string;
  #config: Record<string, string | number | boolean>;

  constructor(options: StatusStoreOptions) {
    this.#opts = options;
    this.#config = { ...options.config };
    this.#startedAt = this.#now().toISOString();
    this.#gauge();
  }

  #now(): Date {
    return this.#opts.now ? this.#opts.now() : new Date();
  }

  // Values known only once the agent runs, e.g. the address `--listen
  // 127.0.0.1:0` was bound to: the page shows where it actually is.
  setConfig(values: Record<string, string | number | boolean>): void {
    this.#config = { ...this.#config, ...values };
  }

  get(key: string): VmiStatusRecord | undefined {
    return this.#vmis.get(key);
  }

  // Merge `patch` into the VMI's record (created as pending when new).
  update(key: string, uid: string, patch: Partial<VmiStatusRecord>): VmiStatusRecord {
    const [namespace, name] = splitKey(key);
    const prev = this.#vmis.get(key);
    const base: VmiStatusRecord =
      prev && prev.uid === uid ? prev : { namespace, name, uid, state: 'pending', warnings: [], retries: 0 };
    const next: VmiStatusRecord = { ...base, ...patch };
    for (const [k, v] of Object.entries(patch)) if (v === undefined) delete (next as unknown as Record<string, unknown>)[k];
    this.#vmis.set(key, next);
    this.#gauge();
    return next;
  }

  remove(key: string): void {
    if (this.#vmis.delete(key)) this.#gauge();
  }

  // The guest fetched a file from the NoCloud HTTP datasource. Ignored
  // when the record is gone or belongs to another object of the same name.
  recordFetch(key: string, uid: string, file: string, at: Date): void {
    const prev = this.#vmis.get(key);
    if (!prev || prev.uid !== uid) return;
    this.#vmis.set(key, { ...prev, lastFetch: { ...prev.lastFetch, [file]: at.toISOString() } });
  }

  problem(code: StatusProblem['code'], message: string, extra: { kind?: StatusProblem['kind']; field?: string } = {}): StatusProblem {
    return { code, message, ...extra, at: this.#now().toISOString() };
  }

  recordGeneration(seconds: number): void {
    this.#recent.push({ at: this.#now().toISOString(), seconds });
    if (this.#recent.length > RECENT) this.#recent.splice(0, this.#recent.length - RECENT);
  }

  snapshot(): AgentStatusSnapshot {
    return {
      version: this.#opts.version,
      nodeName: this.#opts.nodeName,
      startedAt: this.#startedAt,
      config: { ...this.#config },
      watch: this.#opts.watch(),
      queue: this.#opts.queue(),
      vmis: [...this.#vmis.values()]
        .sort((a, b) => a.namespace.localeCompare(b.namespace) || a.name.localeCompare(b.name))
        .map((r) => this.#withHttp(structuredClone(r))),
      recentGenerations: this.#recent.slice(),
    };
  }

  #withHttp(r: VmiStatusRecord): VmiStatusRecord {
    // Only for VMIs the datasource can serve (a NoCloud image on disk).
    if (this.#opts.servedOverHttp && r.datasource === 'nocloud' && (r.state === 'ready' || r.state === 'warning')) r.servedOverHttp = true;
    return r;
  }

  async readiness(): Promise<{ ready: boolean; reasons: string[] }> {
    const reasons: string[] = [];
    const w = this.#opts.watch();
    if (!w.synced) reasons.push('VMI watch has not completed its first list');
    if (!w.connected) reasons.push('VMI watch is not connected');
    if (w.stale) reasons.push('VMI watch is stale (no event or bookmark for too long)');
    // W_OK alone passes a regular file that took the directory's place.
    try {
      if (!(await stat(this.#opts.stateDir)).isDirectory()) reasons.push(`state directory ${this.#opts.stateDir} is not a directory`);
      else await access(this.#opts.stateDir, constants.W_OK | constants.X_OK);
    } catch (e) {
      const missing = (e as NodeJS.ErrnoException).code === 'ENOENT';
      reasons.push(`state directory ${this.#opts.stateDir} ${missing ? 'does not exist' : 'is not writable'}`);
    }
    return { ready: reasons.length === 0, reasons };
  }

  #gauge(): void {
    const m = this.#opts.metrics;
    if (!m) return;
    const counts = Object.fromEntries(STATES.map((s) => [s, 0])) as Record<VmiState, number>;
    for (const r of this.#vmis.values()) counts[r.state]++;
    for (const s of STATES) m.vmis.set({ state: s }, counts[s]);
  }
}

export function splitKey(key: string): [string, string] {
  const i = key.indexOf('/');
  return i < 0 ? ['', key] : [key.slice(0, i), key.slice(i + 1)];
}
