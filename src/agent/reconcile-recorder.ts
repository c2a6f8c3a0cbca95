// The handler around one reconcile (controller-runtime's reconcileHandler):
// the reconcile says what it found, or throws, and everything shown about it
// is recorded here: the status (written once), the reconcile and error
// counts, the generation histogram, the Events and the log lines.
import type { Logger } from 'pino';
import type { VmiObject, Datasource } from '../api/objects.ts';
import { asVmseedError, VmseedError } from '../errors.ts';
import { formatSeconds } from '../core/format.ts';
import type { Metrics } from '../metrics/metrics.ts';
import type { EventRecorder } from './events.ts';
import type { StatusStore } from './status-store.ts';
import { resetObjectFacts, type VmiRecords } from './vmi-records.ts';
import { splitKey, type Problem, type StatusReport } from './vmi-status.ts';
import type { WorkResult } from './work-queue.ts';
import { firstBootStatus, type Attach, type FirstBootFacts, type SeedReadWatch } from './domain/seed-read.ts';
import { lateSeedWarning, withLateSeed } from './provisioning/late-seed.ts';
import { isWaiting } from './waiting.ts';

// An INTERNAL error is a bug or an input nothing else caught: retried this
// many times in all (the backoff spaces them), then reported terminal, so a
// poisoned object cannot keep the agent busy for ever. A change to the
// object tries again.
export const MAX_INTERNAL_ATTEMPTS = 5;

// A render step that ran out of the render worker's deadline cost the worker
// all of it, and a restart. The same version of a VMI gets that this many
// times, then is reported terminal and parked until the VMI changes or the
// park ends (RENDER_TIMEOUT_PARK_MS, doubled at each further timeout, at most
// a day): a tenant's document cannot keep the worker busy, and a legitimate
// one that timed out because the node starved the agent of CPU (a busy VM
// node gives it its 50m request) is seeded once the node has CPU again,
// without anyone editing the VMI. The count is per version, so failures of
// other kinds before it (a launcher not up yet) do not shorten it.
// (RENDER_WORKER_FAILED stays retryable: a worker that did not start is the
// node's state, not the VMI's.)
export const MAX_RENDER_TIMEOUTS = 3;
export const RENDER_TIMEOUT_PARK_MS = 60 * 60_000;
const MAX_RENDER_TIMEOUT_PARK_MS = 24 * 60 * 60_000;

// What a reconcile found, for the handler around it: the status to show, the
// Events, the metrics and the log line follow from it.
export type Outcome =
  // Not here any more: the reconciler ended it, nothing about it is shown.
  | { kind: 'gone' }
  // Local mode: labelled for another node, shown as skipped.
  | { kind: 'other-node'; node: string; warning: Problem }
  | { kind: 'skipped'; warning: Problem | undefined; event: boolean }
  | { kind: 'served'; datasource: Datasource; warnings: Problem[] }
  | {
      kind: 'ready';
      status: Extract<StatusReport, { kind: 'ready' }>;
      written: boolean;
      injected: boolean;
      // Placement: attached to the domain, or only staged in these launcher pods.
      attached: boolean;
      staged: string[];
      seconds: number;
      // This reconcile attached our disk: where and when.
      attach?: Attach;
    };

// What happened to the seed so far: a failure after the image was written
// (injection) is not a failed generation.
export interface Progress {
  generated: boolean;
  written?: { datasource: Datasource; seconds: number };
  steps: StepFacts;
}

// What the steps of a reconcile (or of the start-up garbage collection)
// measured, one entry per operation: observed by the handler once the
// reconcile is over, also when it failed half way.
export interface StepFacts {
  builds: Array<{ datasource: Datasource; seconds: number }>;
  images: Array<{ datasource: Datasource; bytes: number }>;
  injections: Array<{ operation: 'attach' | 'replace' | 'detach'; result: 'success' | 'error'; seconds: number }>;
  // Directories vmseed did not make (STORE_UNSAFE_PATH), reported and left alone.
  unsafePaths: number;
}

export function newProgress(): Progress {
  return { generated: false, steps: { builds: [], images: [], injections: [], unsafePaths: 0 } };
}

export interface ReconcileRecorderOptions {
  nodeName: string;
  status: StatusStore;
  records: VmiRecords;
  events: EventRecorder;
  metrics?: Metrics;
  logger: Logger;
  // Libvirt on: SeedReady says which domain got the disk.
  injecting: boolean;
  // Failed attempts so far for a key (the queue's count).
  failures?: (key: string) => number;
  renderTimeoutParkMs?: number;
  now: () => number;
  seedReads?: SeedReadWatch;
}

export class ReconcileRecorder {
  readonly #o: ReconcileRecorderOptions;
  readonly #log: Logger;

  constructor(options: ReconcileRecorderOptions) {
    this.#o = options;
    this.#log = options.logger;
  }

  // The single operations' timings and sizes, whatever the outcome.
  observeSteps(steps: StepFacts): void {
    const m = this.#o.metrics;
    if (!m) return;
    for (const b of steps.builds) m.imageBuildDuration.observe({ datasource: b.datasource }, b.seconds);
    for (const i of steps.images) m.imageBytes.observe({ datasource: i.datasource }, i.bytes);
    for (const i of steps.injections)
      m.injectionDuration.observe({ operation: i.operation, result: i.result }, i.seconds);
    if (steps.unsafePaths > 0) m.reconcileErrors.inc({ code: 'STORE_UNSAFE_PATH' }, steps.unsafePaths);
  }

  // A generation that wrote an image counts as one, whatever came after it.
  #generation(progress: Progress): void {
    this.observeSteps(progress.steps);
    if (!progress.written) return;
    const { datasource, seconds } = progress.written;
    this.#o.metrics?.seedGenerationDuration.observe({ datasource, result: 'success' }, seconds);
    this.#o.status.recordGeneration(seconds);
  }

  succeeded(key: string, vmi: VmiObject | undefined, outcome: Outcome, progress: Progress): WorkResult {
    this.#generation(progress);
    this.#show(key, vmi, outcome);
    this.#o.metrics?.reconcileTotal.inc({ result: 'success' });
    return 'success';
  }

  #show(key: string, vmi: VmiObject | undefined, outcome: Outcome): void {
    if (outcome.kind === 'gone') return;
    const r = this.#o.records.of(key);
    delete r.renderTimeouts;
    const uid = vmi?.metadata.uid ?? key;
    if (outcome.kind === 'other-node') {
      resetObjectFacts(r);
      this.#o.status.write(key, uid, { kind: 'skipped', warnings: [outcome.warning] });
      if (r.otherNode !== outcome.node) {
        r.otherNode = outcome.node;
        const [namespace, name] = splitKey(key);
        this.#log.warn(
          { namespace, name, node: outcome.node, agentNode: this.#o.nodeName },
          `skipped: ${outcome.warning.message}`,
        );
      }
    } else if (outcome.kind === 'skipped') {
      const w = outcome.warning;
      this.#o.status.write(key, uid, { kind: 'skipped', warnings: w ? [w] : [] });
      if (w && outcome.event) this.#o.events.record(vmi!, 'Warning', 'SeedWarning', `${w.code}: ${w.message}`);
    } else if (outcome.kind === 'served') {
      const prev = this.#o.status.get(key);
      const warnings = withLateSeed(outcome.warnings, r.lateSeed, uid);
      this.#o.status.write(key, uid, { ...outcome, warnings });
      if (prev?.state !== 'ready' && prev?.state !== 'warning')
        this.#o.events.record(vmi!, 'Normal', 'SeedReady', 'seed served over HTTP only (KubeVirt IMDS annotations)');
      this.#newWarnings(vmi!, prev?.uid === uid ? prev.warnings : [], warnings);
    } else {
      this.#ready(key, vmi!, outcome);
    }
  }

  #ready(key: string, vmi: VmiObject, outcome: Extract<Outcome, { kind: 'ready' }>): void {
    const uid = vmi.metadata.uid ?? key;
    const status = { ...outcome.status };
    status.warnings = withLateSeed(status.warnings, this.#o.records.get(key)?.lateSeed, uid);
    const prev = this.#o.status.get(key);
    const changed =
      outcome.written ||
      outcome.injected ||
      !prev ||
      prev.state === 'pending' ||
      prev.state === 'error' ||
      prev.contentHash !== status.contentHash;
    this.#o.status.write(key, vmi.metadata.uid ?? key, status);
    if (outcome.attach) this.#attached(key, vmi.metadata.uid ?? key, outcome.attach, status);
    const first = this.#o.records.of(key).firstSeen!;
    if (!first.reported) {
      first.reported = true;
      const created = Date.parse(vmi.metadata.creationTimestamp ?? '');
      const from = Number.isFinite(created) ? Math.max(created, first.at) : first.at;
      this.#o.metrics?.seedReadyLatency.observe(Math.max(0, this.#o.now() - from) / 1000);
    }
    if (!changed) {
      this.#newWarnings(vmi, prev?.uid === uid ? prev.warnings : [], status.warnings);
      return;
    }
    const what = !this.#o.injecting
      ? `seed image ${status.datasource} ready at ${status.imagePath}`
      : outcome.attached
        ? `seed image ${status.datasource} ready and attached to ${status.injection?.domain ?? 'the domain'}`
        : `seed image ${status.datasource} staged for the incoming migration in launcher pod ${outcome.staged.join(', ')}`;
    this.#o.events.record(vmi, 'Normal', 'SeedReady', `${what} (sha256 ${status.contentHash.slice(0, 12)})`);
    for (const w of status.warnings) this.#o.events.record(vmi, 'Warning', 'SeedWarning', `${w.code}: ${w.message}`);
    const [namespace, name] = splitKey(key);
    this.#log.info(
      {
        namespace,
        name,
        datasource: status.datasource,
        written: outcome.written,
        injected: outcome.injected,
        seconds: outcome.seconds,
      },
      'seed ready',
    );
  }

  // A warning that appeared on an unchanged seed (its schema check, deferred
  // while the agent started, ran on a later reconcile): one Event each.
  #newWarnings(vmi: VmiObject, before: readonly Problem[], after: readonly Problem[]): void {
    const seen = new Set(before.map((w) => `${w.code}\0${w.message}`));
    for (const w of after)
      if (!seen.has(`${w.code}\0${w.message}`))
        this.#o.events.record(vmi, 'Warning', 'SeedWarning', `${w.code}: ${w.message}`);
  }

  // Our disk went into the domain: how long after the domain started (when
  // this agent saw the start), and the polls for the guest's first read.
  #attached(key: string, uid: string, attach: Attach, status: Extract<StatusReport, { kind: 'ready' }>): void {
    if (status.injection?.seededAfterBoot) this.#o.metrics?.seededAfterBoot.inc({ datasource: 'disk' });
    const facts = this.#o.seedReads?.attached(key, uid, attach);
    if (!facts) return;
    this.#o.status.update(key, uid, { firstBoot: firstBootStatus(facts) });
    if (facts.startedAt !== undefined)
      this.#o.metrics?.seedAttachAfterStart.observe(Math.max(0, facts.attachedAt - facts.startedAt) / 1000);
  }

  // The guest asked the HTTP datasource with its token before the seed was
  // served, and got it at servedAt: seeded after boot, said once per object.
  seededAfterBootOverHttp(key: string, vmi: VmiObject | undefined, uid: string, missedAt: Date, servedAt: Date): void {
    if (!vmi || (vmi.metadata.uid ?? key) !== uid) return;
    const r = this.#o.records.get(key);
    if (!r || r.lateSeed?.uid === uid) return;
    const warning = lateSeedWarning(vmi, missedAt, servedAt);
    if (!warning) return;
    r.lateSeed = { uid, warning };
    this.#o.metrics?.seededAfterBoot.inc({ datasource: 'nocloud-http' });
    const prev = r.status;
    const shown = prev && prev.uid === uid && (prev.state === 'ready' || prev.state === 'warning');
    if (shown && !prev.warnings.some((w) => w.code === warning.code))
      this.#o.status.update(key, uid, {
        state: 'warning',
        warnings: [...prev.warnings, { ...warning, at: servedAt.toISOString() }],
      });
    this.#o.events.record(vmi, 'Warning', 'SeedWarning', `${warning.code}: ${warning.message}`);
    const [namespace, name] = splitKey(key);
    this.#log.warn(
      { namespace, name, missedAt: missedAt.toISOString(), servedAt: servedAt.toISOString() },
      'seeded after boot: the guest asked for its seed over HTTP before it was served',
    );
  }

  // The guest read its seed disk (or the wait for it ended).
  seedRead(key: string, vmi: VmiObject | undefined, facts: FirstBootFacts): void {
    if (!vmi || (vmi.metadata.uid ?? key) !== facts.uid) return;
    this.#o.status.update(key, facts.uid, { firstBoot: firstBootStatus(facts) });
    if (facts.watch !== 'read' || facts.readAt === undefined) return;
    const afterAttach = Math.max(0, facts.readAt - facts.attachedAt) / 1000;
    const afterStart = facts.startedAt === undefined ? undefined : Math.max(0, facts.readAt - facts.startedAt) / 1000;
    if (afterStart !== undefined) this.#o.metrics?.seedReadAfterStart.observe(afterStart);
    this.#o.metrics?.seedReadSeconds.observe({ via: 'disk' }, afterAttach);
    const since =
      afterStart === undefined
        ? `${formatSeconds(afterAttach)} after it was attached (the domain's start was not seen by this agent)`
        : `${formatSeconds(afterStart)} after the domain started, ${formatSeconds(afterAttach)} after it was attached`;
    this.#o.events.record(
      vmi,
      'Normal',
      'SeedRead',
      `seed read by guest: first read of disk ${facts.targetDev} in ${facts.domain} at ${new Date(facts.readAt).toISOString()}, ${since}`,
    );
    const [namespace, name] = splitKey(key);
    this.#log.info(
      { namespace, name, domain: facts.domain, afterStartSeconds: afterStart, afterAttachSeconds: afterAttach },
      'seed read by guest',
    );
  }

  failed(key: string, vmi: VmiObject | undefined, e: unknown, started: number, progress: Progress): WorkResult {
    this.#generation(progress);
    const { err, parkMs } = this.#classify(key, vmi, asVmseedError(e));
    const [namespace, name] = splitKey(key);
    if (err.code === 'CANCELLED') {
      // The agent is stopping, or the VMI was deleted or changed under the
      // reconcile: nothing is wrong with the VMI, so no error on its status
      // and no Event; the next reconcile (or start) takes it from here.
      this.#log.info({ namespace, name, code: err.code }, err.message);
      return 'retry';
    }
    if (isWaiting(err)) {
      // Waiting, not failing: pending with the reason, no error metric,
      // retried with backoff (or at once on the domain's event); a Normal
      // Event when it starts waiting for this, not on every retry.
      this.#o.metrics?.reconcileTotal.inc({ result: 'waiting' });
      this.#log.info({ namespace, name, code: err.code }, err.message);
      if (vmi) {
        const uid = vmi.metadata.uid ?? key;
        const prev = this.#o.status.get(key);
        const already = prev?.uid === uid && prev.state === 'pending' && prev.lastError?.code === err.code;
        this.#o.status.write(key, uid, {
          kind: 'waiting',
          problem: { code: err.code, message: err.message, kind: err.kind, ...(err.field ? { field: err.field } : {}) },
          retries: this.#o.failures?.(key) ?? 0,
        });
        if (!already) this.#o.events.record(vmi, 'Normal', 'SeedWaiting', `${err.code}: ${err.message}`);
      }
      return 'retry';
    }
    const kind = err.kind;
    this.#o.metrics?.reconcileTotal.inc({ result: kind === 'terminal' ? 'terminal' : 'error' });
    this.#o.metrics?.reconcileErrors.inc({ code: err.code });
    if (!progress.generated)
      this.#o.metrics?.seedGenerationDuration.observe(
        { datasource: datasourceHint(vmi), result: 'error' },
        (performance.now() - started) / 1000,
      );
    const fields = { namespace, name, code: err.code, kind, ...(err.field ? { field: err.field } : {}) };
    if (err.code === 'INTERNAL')
      this.#log.error(
        { ...fields, err: { message: String((err.cause as Error)?.message ?? '').slice(0, 200) } },
        err.message,
      );
    else this.#log.warn(fields, err.message);
    if (vmi) {
      this.#o.status.write(key, vmi.metadata.uid ?? key, {
        kind: 'error',
        problem: { code: err.code, message: err.message, kind, ...(err.field ? { field: err.field } : {}) },
        retries: (this.#o.failures?.(key) ?? 0) + (kind === 'retryable' ? 1 : 0),
      });
      this.#o.events.record(vmi, 'Warning', 'SeedFailed', `${err.code}: ${err.message}`);
    }
    if (kind !== 'terminal') return 'retry';
    return parkMs === undefined ? 'terminal' : { terminal: true, retryAfterMs: parkMs };
  }

  // Retrying for ever is not always right: an INTERNAL error and a render
  // that keeps running out of its deadline become terminal (the latter
  // parked for a while).
  #classify(key: string, vmi: VmiObject | undefined, err: VmseedError): { err: VmseedError; parkMs?: number } {
    const attempts = (this.#o.failures?.(key) ?? 0) + 1;
    if (err.code === 'INTERNAL' && err.kind === 'retryable' && attempts >= MAX_INTERNAL_ATTEMPTS) {
      const message = `internal error, ${attempts} attempts in a row; vmseed stops retrying until the VMI changes (see the agent log)`;
      return { err: new VmseedError('INTERNAL', message, { kind: 'terminal', cause: err.cause }) };
    }
    if (err.code !== 'RENDER_TIMEOUT' || err.kind !== 'retryable') return { err };
    const r = this.#o.records.of(key);
    const version = vmi?.metadata.resourceVersion;
    const prev = r.renderTimeouts;
    const count = prev && prev.version === version ? prev.count + 1 : 1;
    r.renderTimeouts = { version, count };
    if (count < MAX_RENDER_TIMEOUTS) return { err };
    const parkMs = Math.min(
      (this.#o.renderTimeoutParkMs ?? RENDER_TIMEOUT_PARK_MS) * 2 ** (count - MAX_RENDER_TIMEOUTS),
      MAX_RENDER_TIMEOUT_PARK_MS,
    );
    const message = `rendering ran past the render worker's deadline ${count} times for this version of the VMI; vmseed tries again in ${formatSeconds(parkMs / 1000)} or when the VMI changes: make its cloud-init user-data and network-data smaller or simpler, or give the agent more CPU`;
    return {
      err: new VmseedError(err.code, message, {
        kind: 'terminal',
        cause: err.cause,
        ...(err.field ? { field: err.field } : {}),
      }),
      parkMs,
    };
  }
}

function datasourceHint(vmi: VmiObject | undefined): string {
  const a = vmi?.metadata.annotations?.['vmseed.io/cloud-init'] ?? '';
  if (/datasource:\s*["']?configdrive/i.test(a)) return 'configdrive';
  if (vmi?.spec.volumes?.some((v) => v.cloudInitConfigDrive)) return 'configdrive';
  return vmi ? 'nocloud' : 'unknown';
}
