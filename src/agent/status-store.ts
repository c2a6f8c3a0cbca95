// The agent's view of itself and of every VMI, for /status, /status.json
// and /readyz. Holds names, sizes, hashes, codes and our own messages only.
import { constants } from 'node:fs';
import { open, stat, unlink } from 'node:fs/promises';
import { join } from 'node:path';
import { isDeepStrictEqual } from 'node:util';
import type {
  AgentStatusSnapshot,
  DependencyRecord,
  LibvirtStatus,
  ProvisioningStatus,
  ReadinessStatus,
  RedirectStatus,
  SourceError,
  StatusSource,
  VmiState,
  VmiStatusRecord,
  WatchStatus,
} from '../status/snapshot.ts';
import type { Metrics } from '../metrics/metrics.ts';
import { VmiRecords, type PerVmiState, type VmiRecord } from './vmi-records.ts';
import { mergeStatus, nextStatus, type StatusReport } from './vmi-status.ts';

export const STATES: VmiState[] = ['pending', 'ready', 'warning', 'error', 'skipped'];
// Created and removed by each readiness check: writing is the only honest
// test of "writable" (access(2) says yes to root on a read-only mount's
// directory, and no to nothing a full disk refuses).
const PROBE = '.vmseed-readyz';
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
  // Where each VMI's status is kept (default: records of its own).
  records?: VmiRecords;
}

export class StatusStore implements StatusSource, PerVmiState {
  readonly records: VmiRecords;
  readonly #opts: StatusStoreOptions;
  // VMIs per state, kept with every change: the gauge is set from it
  // without walking every record at each update (a cold start of 1,000
  // VMIs makes several thousand updates).
  readonly #counts = Object.fromEntries(STATES.map((s) => [s, 0])) as Record<VmiState, number>;
  readonly #recent: Array<{ at: string; seconds: number }> = [];
  readonly #startedAt: string;
  readonly #checks: Array<() => Promise<string | undefined>> = [];
  readonly #degradedChecks: Array<() => string | undefined> = [];
  #config: Record<string, string | number | boolean>;
  #readiness: ReadinessStatus | undefined;
  #redirect: (() => RedirectStatus | undefined) | undefined;
  #libvirt: (() => LibvirtStatus) | undefined;
  #cloudInitSchemas: string | undefined;
  // Schema problems in the shown seeds by "module severity" (the gauge
  // vmseed_seed_schema_problems), kept with every change as #counts is.
  readonly #schemaProblems: Record<string, number> = Object.create(null) as Record<string, number>;
  #dependencies: ((key: string) => DependencyRecord[]) | undefined;
  #provisioning: ((record: VmiRecord, now: number) => ProvisioningStatus | undefined) | undefined;
  // VMIs whose last reconcile ended at the seed gate (SEED_GATE_WAITING).
  #atGate = 0;

  constructor(options: StatusStoreOptions) {
    this.#opts = options;
    this.#config = { ...options.config };
    this.#startedAt = this.#now().toISOString();
    this.records = options.records ?? new VmiRecords();
    // The gauges count records' statuses: an ended record leaves them.
    this.records.register('status', this);
    for (const state of STATES) this.#gauge(state);
  }

  #now(): Date {
    return this.#opts.now ? this.#opts.now() : new Date();
  }

  // Values known only once the agent runs, e.g. the address `--listen
  // 127.0.0.1:0` was bound to: the page shows where it actually is.
  setConfig(values: Record<string, string | number | boolean>): void {
    this.#config = { ...this.#config, ...values };
  }

  // More /readyz conditions (virsh present, free space): each gives a
  // reason when not ready. Run in order, after the built-in ones.
  addReadinessCheck(check: () => Promise<string | undefined>): void {
    this.#checks.push(check);
  }

  // Conditions that leave the agent ready but doing less than it should:
  // each gives a reason, shown by /readyz (still 200) and the status page.
  addDegradedCheck(check: () => string | undefined): void {
    this.#degradedChecks.push(check);
  }

  // Where the redirect sidecar's state comes from (a RedirectStatusPoller).
  setRedirectSource(source: () => RedirectStatus | undefined): void {
    this.#redirect = source;
  }

  // What each VMI's seed depends on (cluster mode's watched Secrets and ConfigMaps).
  setDependencySource(source: (key: string) => DependencyRecord[]): void {
    this.#dependencies = source;
  }

  // What each VMI's guest reported of its provisioning (a ProvisioningTracker).
  setProvisioningSource(source: (record: VmiRecord, now: number) => ProvisioningStatus | undefined): void {
    this.#provisioning = source;
  }

  // Where the libvirt RPC client's per-connection counters come from.
  setLibvirtSource(source: () => LibvirtStatus): void {
    this.#libvirt = source;
  }

  // cloud-init's schemas as the agent found them at start (schema-status.ts).
  setCloudInitSchemas(line: string): void {
    this.#cloudInitSchemas = line;
  }

  get(key: string): VmiStatusRecord | undefined {
    return this.records.get(key)?.status;
  }

  /** The VMI ended (VmiRecords.end): its status leaves the gauges. */
  forget(_key: string, ended: VmiRecord | undefined): void {
    if (ended?.status) this.#count(ended.status.state, -1);
    if (atGate(ended?.status)) this.#gateWaiting(-1);
    if (ended?.status) this.#series(ended.status, false);
    if (ended?.status) this.#countSchemaProblems(ended.status, -1);
  }

  /** Whether a status is shown for `key`. */
  holds(key: string): boolean {
    return this.get(key) !== undefined;
  }

  // What a reconcile concluded, shown: the status computed from it and the
  // one shown before, written when it differs.
  write(key: string, uid: string, report: StatusReport): void {
    const r = this.records.of(key);
    const next = nextStatus(r.status, key, uid, report, this.#now().toISOString());
    if (!isDeepStrictEqual(r.status, next)) this.#set(r, next);
  }

  // Merge `patch` into the VMI's status (created as pending when new).
  update(key: string, uid: string, patch: Partial<VmiStatusRecord>): VmiStatusRecord {
    const r = this.records.of(key);
    const next = mergeStatus(r.status, key, uid, patch);
    this.#set(r, next);
    return next;
  }

  // The work queue backed a failed or waiting key off: its next run.
  backoff(key: string, attempt: number, delayMs: number): void {
    const prev = this.get(key);
    if (!prev || (prev.state !== 'pending' && prev.state !== 'error')) return;
    const retryAt = new Date(this.#now().getTime() + delayMs).toISOString();
    this.#set(this.records.of(key), { ...prev, retries: attempt, retryAt });
  }

  #set(r: { status?: VmiStatusRecord }, next: VmiStatusRecord): void {
    const prev = r.status;
    const moved = !prev || prev.uid !== next.uid || prev.state !== next.state || codeOf(prev) !== codeOf(next);
    if (moved) next.stateSince = this.#now().toISOString();
    else if (prev.stateSince !== undefined) next.stateSince = prev.stateSince;
    r.status = next;
    if (prev?.state !== next.state) {
      if (prev) this.#count(prev.state, -1);
      this.#count(next.state, 1);
    }
    if (atGate(prev) !== atGate(next)) this.#gateWaiting(atGate(next) ? 1 : -1);
    if (prev?.warnings !== next.warnings) {
      if (prev) this.#countSchemaProblems(prev, -1);
      this.#countSchemaProblems(next, 1);
    }
    if (moved) {
      if (prev) this.#series(prev, false);
      this.#series(next, true);
    }
  }

  // The per-VMI series: present while the VMI is held, one label set at a time.
  #series(status: VmiStatusRecord, present: boolean): void {
    const m = this.#opts.metrics;
    if (!m) return;
    const labels = { namespace: status.namespace, name: status.name, state: status.state, code: codeOf(status) };
    if (!present) {
      m.vmiInfo.remove(labels);
      m.vmiStateSince.remove(labels);
      return;
    }
    m.vmiInfo.set(labels, 1);
    m.vmiStateSince.set(labels, Date.parse(status.stateSince ?? '') / 1000 || this.#now().getTime() / 1000);
  }

  // A status's schema problems into (or out of) the by-module gauge; a
  // label set once seen stays, at 0 when no seed has the problem any more.
  #countSchemaProblems(status: VmiStatusRecord, delta: number): void {
    const m = this.#opts.metrics;
    for (const w of status.warnings ?? []) {
      if (!w.schema) continue;
      const { module, severity } = w.schema;
      const k = `${module} ${severity}`;
      this.#schemaProblems[k] = Math.max(0, (this.#schemaProblems[k] ?? 0) + delta);
      m?.seedSchemaProblems.set({ module, severity }, this.#schemaProblems[k]);
    }
  }

  #gateWaiting(delta: number): void {
    this.#atGate += delta;
    this.#opts.metrics?.seedGateWaiting.set(this.#atGate);
  }

  // The guest fetched a file from the NoCloud HTTP datasource. Ignored
  // when the record is gone or belongs to another object of the same name.
  recordFetch(key: string, uid: string, file: string, at: Date): void {
    const r = this.records.get(key);
    const prev = r?.status;
    if (!r || !prev || prev.uid !== uid) return;
    const iso = at.toISOString();
    const first = prev.firstFetch?.[file] === undefined ? { firstFetch: { ...prev.firstFetch, [file]: iso } } : {};
    r.status = { ...prev, lastFetch: { ...prev.lastFetch, [file]: iso }, ...first };
  }

  recordGeneration(seconds: number): void {
    this.#recent.push({ at: this.#now().toISOString(), seconds });
    if (this.#recent.length > RECENT) this.#recent.splice(0, this.#recent.length - RECENT);
  }

  snapshot(): AgentStatusSnapshot {
    const redirect = this.#redirect?.();
    const libvirt = this.#libvirt?.();
    const watch = this.#opts.watch();
    const stale = staleByKey(watch.sourceErrors ?? []);
    const now = this.#now().getTime();
    return {
      version: this.#opts.version,
      nodeName: this.#opts.nodeName,
      startedAt: this.#startedAt,
      config: { ...this.#config },
      watch,
      queue: this.#opts.queue(),
      vmis: [...this.records.values()]
        .flatMap((r) => (r.status ? [this.#withProvisioning(structuredClone(r.status), r, now)] : []))
        .sort((a, b) => a.namespace.localeCompare(b.namespace) || a.name.localeCompare(b.name))
        .map((r) => withStale(this.#withDependencies(this.#withHttp(r)), stale)),
      recentGenerations: this.#recent.slice(),
      ...(this.#readiness ? { readiness: structuredClone(this.#readiness) } : {}),
      ...(redirect ? { redirect: structuredClone(redirect) } : {}),
      ...(libvirt ? { libvirt: structuredClone(libvirt) } : {}),
      ...(this.#cloudInitSchemas !== undefined ? { cloudInitSchemas: this.#cloudInitSchemas } : {}),
    };
  }

  #withProvisioning(s: VmiStatusRecord, r: VmiRecord, now: number): VmiStatusRecord {
    const p = this.#provisioning?.(r, now);
    if (p) s.provisioning = p;
    return s;
  }

  #withDependencies(r: VmiStatusRecord): VmiStatusRecord {
    const deps = this.#dependencies?.(`${r.namespace}/${r.name}`);
    if (deps && deps.length > 0) r.dependencies = deps;
    return r;
  }

  #withHttp(r: VmiStatusRecord): VmiStatusRecord {
    // Only for VMIs the datasource can serve (a NoCloud image on disk).
    if (this.#opts.servedOverHttp && r.datasource === 'nocloud' && (r.state === 'ready' || r.state === 'warning'))
      r.servedOverHttp = true;
    return r;
  }

  async readiness(): Promise<{ ready: boolean; reasons: string[]; degraded?: string[] }> {
    const reasons: string[] = [];
    const w = this.#opts.watch();
    if (!w.synced) reasons.push('VMI watch has not completed its first list');
    if (!w.connected) reasons.push('VMI watch is not connected');
    if (w.stale) reasons.push('VMI watch is stale (no event or bookmark for too long)');
    const dir = this.#opts.stateDir;
    try {
      if (!(await stat(dir)).isDirectory()) reasons.push(`state directory ${dir} is not a directory`);
      else await probeWrite(join(dir, PROBE));
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      reasons.push(
        `state directory ${dir} ${code === 'ENOENT' ? 'does not exist' : `is not writable (${code ?? 'error'})`}`,
      );
    }
    for (const check of this.#checks) {
      try {
        const why = await check();
        if (why) reasons.push(why);
      } catch (e) {
        reasons.push(`readiness check failed (${(e as NodeJS.ErrnoException).code ?? 'error'})`);
      }
    }
    const degraded = this.#degradedChecks.flatMap((check) => check() ?? []);
    const more = degraded.length > 0 ? { degraded } : {};
    this.#readiness = { ready: reasons.length === 0, reasons, at: this.#now().toISOString(), ...more };
    return {
      ready: reasons.length === 0,
      reasons: reasons.slice(),
      ...(degraded.length > 0 ? { degraded: degraded.slice() } : {}),
    };
  }

  #count(state: VmiState, delta: number): void {
    this.#counts[state] += delta;
    this.#gauge(state);
  }

  #gauge(state: VmiState): void {
    this.#opts.metrics?.vmis.set({ state }, this.#counts[state]);
  }
}

// The first broken manifest (by file name) each VMI depends on.
function staleByKey(errors: readonly SourceError[]): Map<string, SourceError> {
  const byKey = new Map<string, SourceError>();
  for (const e of errors) for (const key of e.vmis) if (!byKey.has(key)) byKey.set(key, e);
  return byKey;
}

// Whatever state the last reconcile left, the seed may lag the file now.
function withStale(r: VmiStatusRecord, stale: Map<string, SourceError>): VmiStatusRecord {
  const e = stale.get(`${r.namespace}/${r.name}`);
  if (!e) return r;
  r.stale = {
    code: 'SOURCE_STALE',
    message: `manifest ${e.file} does not read or parse (${e.code}); the seed is from the last version of it that did`,
    kind: 'terminal',
    field: e.file,
    at: e.at,
  };
  return r;
}

// O_NOFOLLOW: a symlink planted under the probe's name is refused, never
// written through; O_NONBLOCK: a FIFO there cannot hang the probe.
async function probeWrite(path: string): Promise<void> {
  const fh = await open(
    path,
    constants.O_WRONLY | constants.O_CREAT | constants.O_TRUNC | constants.O_NOFOLLOW | constants.O_NONBLOCK,
    0o600,
  );
  try {
    if (!(await fh.stat()).isFile()) throw Object.assign(new Error('not a regular file'), { code: 'ENOTREG' });
    await fh.write('ok\n');
  } finally {
    await fh.close();
  }
  await unlink(path);
}

// What a VMI waits on or failed with, or its first warning: the `code`
// label of its series.
function codeOf(status: VmiStatusRecord): string {
  if (status.state === 'pending' || status.state === 'error') return status.lastError?.code ?? '';
  return status.warnings[0]?.code ?? '';
}

// Seed attached, the VM kept paused until KubeVirt allows the unpause.
function atGate(status: VmiStatusRecord | undefined): boolean {
  return status?.lastError?.code === 'SEED_GATE_WAITING';
}
