// What each VMI's guest reported of its provisioning: the cloud-init events
// the datasource listener accepted, kept per VMI in its record (forgotten
// with it), shown on the status page, told as Events and metrics when a
// boot finishes. A VMI whose guest read its seed and reported nothing
// within the bound is shown as "progress not reported", with the reason.
import type { Logger } from 'pino';
import type { VmiObject } from '../../api/objects.ts';
import type { SeedDirectoryEntry } from '../../datasource/types.ts';
import type { ProgressSink } from '../../datasource/reports/receiver.ts';
import type { ReportedEvent } from '../../datasource/reports/event.ts';
import type { Metrics } from '../../metrics/metrics.ts';
import type { ProvisioningStatus, ProvisioningStep } from '../../status/snapshot.ts';
import { formatSeconds } from '../../core/format.ts';
import type { EventRecorder } from '../events.ts';
import type { VmiRecord, VmiRecords } from '../vmi-records.ts';
import { applyEvent, FINAL_STAGE, moduleLabel, type ProvisioningFacts, type StepFacts } from './timeline.ts';

// After the guest read its seed, how long without any event before the page
// says "progress not reported".
export const NOT_REPORTED_AFTER_MS = 10 * 60_000;

// A guest can finish "boots" as fast as its rate limit lets it post a
// start and a finish: at most one provisioning Event per VMI this often
// (the status page and the metrics still see every boot).
export const EVENT_MIN_INTERVAL_MS = 30_000;

export const PROVISIONING_STATES = ['running', 'succeeded', 'bootstrapped', 'failed', 'not-reported'] as const;

export interface ProvisioningTrackerOptions {
  records: VmiRecords;
  // The VMI object now under this key (for Events), if any.
  vmiOf: (key: string) => VmiObject | undefined;
  events: EventRecorder;
  metrics?: Metrics;
  logger: Logger;
  notReportedAfterMs?: number;
  // An event changed the key's provisioning facts.
  onChange?: (key: string) => void;
}

/**
 * The datasource's ProgressSink: keeps each VMI's reported cloud-init boot in
 * its record, for the status page, Events and metrics. report() answers false
 * when the event's VMI (by UID) is not the one held.
 */
export class ProvisioningTracker implements ProgressSink {
  readonly #o: ProvisioningTrackerOptions;
  // When each record's object last got a provisioning Event (gone with the record).
  readonly #evented = new WeakMap<VmiRecord, { uid: string; at: number }>();

  constructor(options: ProvisioningTrackerOptions) {
    this.#o = options;
  }

  report(entry: SeedDirectoryEntry, event: ReportedEvent, at: Date): boolean {
    const key = `${entry.namespace}/${entry.name}`;
    const r = this.#o.records.get(key);
    const vmi = this.#o.vmiOf(key);
    if (!r || r.status?.uid !== entry.uid || !vmi || (vmi.metadata.uid ?? key) !== entry.uid) return false;
    const before = r.provisioning;
    const applied = applyEvent(before, entry.uid, event, at.getTime());
    r.provisioning = applied.facts;
    if (applied.finished) this.#finished(key, vmi, r, applied.facts);
    this.#o.onChange?.(key);
    return true;
  }

  // The guest fetched a file over HTTP (the agent's onFetch): its first
  // meta-data fetch is the HTTP datasource's "seed read".
  fetched(key: string, uid: string, file: string, at: Date): void {
    if (file !== 'meta-data') return;
    const s = this.#o.records.get(key)?.status;
    if (!s || s.uid !== uid || s.firstFetch?.['meta-data'] !== at.toISOString() || s.generatedAt === undefined) return;
    const seconds = Math.max(0, at.getTime() - Date.parse(s.generatedAt)) / 1000;
    if (Number.isFinite(seconds)) this.#o.metrics?.seedReadSeconds.observe({ via: 'http' }, seconds);
  }

  #finished(key: string, vmi: VmiObject, r: VmiRecord, f: ProvisioningFacts): void {
    const seen = r.firstSeen?.uid === f.uid ? r.firstSeen.at : undefined;
    const from = f.boot === 1 && seen !== undefined ? seen : f.firstEventAt;
    const seconds = Math.max(0, f.finishedAt! - from) / 1000;
    const since = from === seen ? 'after the VMI was first seen' : 'after its first reported event';
    const [namespace, name] = [key.slice(0, key.indexOf('/')), key.slice(key.indexOf('/') + 1)];
    if (f.boot === 1 && seen !== undefined)
      this.#o.metrics?.provisioningSeconds.observe({ result: (f.result ?? 'SUCCESS').toLowerCase() }, seconds);
    const last = this.#evented.get(r);
    const quiet = last?.uid === f.uid && f.finishedAt! - last.at < EVENT_MIN_INTERVAL_MS;
    if (!quiet) this.#evented.set(r, { uid: f.uid, at: f.finishedAt! });
    const events = quiet ? undefined : this.#o.events;
    if (f.failure) {
      const module = moduleLabel(f.failure.step);
      this.#o.metrics?.provisioningFailures.inc({ module });
      const what = f.failure.description ? `: ${f.failure.description}` : '';
      events?.record(
        vmi,
        'Warning',
        'ProvisioningFailed',
        `cloud-init reported FAIL for ${f.failure.step}${what} (boot ${f.boot}, finished ${formatSeconds(seconds)} ${since})`,
      );
      this.#o.logger.info({ namespace, name, boot: f.boot, step: f.failure.step, seconds }, 'provisioning failed');
      return;
    }
    const sentinel = sentinelOf(r, f);
    const bootstrapped = sentinel === 'written' ? '; bootstrapped (Cluster API sentinel written)' : '';
    events?.record(
      vmi,
      'Normal',
      'ProvisioningSucceeded',
      `cloud-init finished with ${f.result ?? 'SUCCESS'} ${formatSeconds(seconds)} ${since} (boot ${f.boot})${bootstrapped}`,
    );
    this.#o.logger.info(
      { namespace, name, boot: f.boot, seconds, ...(sentinel ? { sentinel } : {}) },
      bootstrapped ? 'provisioning succeeded, bootstrapped' : 'provisioning succeeded',
    );
  }

  // What the status page shows for the record, if anything.
  status(r: VmiRecord, now: number): ProvisioningStatus | undefined {
    const seen = r.firstSeen && r.status && r.firstSeen.uid === r.status.uid ? r.firstSeen.at : undefined;
    const f = r.provisioning;
    if (f && f.uid === r.status?.uid) return factsStatus(f, seen, sentinelOf(r, f));
    const read = seedReadAt(r);
    if (read === undefined) return undefined;
    const notReported = {
      state: 'not-reported',
      boot: 0,
      stages: [],
      ...(seen !== undefined ? { seenAt: iso(seen) } : {}),
    } as const;
    // A seed that does not ask for reports: nothing will come, so say so at
    // once rather than after the bound.
    const off = r.status?.progressNotReported;
    if (off !== undefined)
      return {
        ...notReported,
        stages: [],
        reason: `the guest read its seed at ${iso(read)}; the seed does not ask cloud-init to report its progress: ${off}`,
      };
    const bound = this.#o.notReportedAfterMs ?? NOT_REPORTED_AFTER_MS;
    if (now - read < bound) return undefined;
    return {
      ...notReported,
      stages: [],
      reason: `the guest read its seed at ${iso(read)} and no cloud-init event came within ${formatSeconds(bound / 1000)}: the guest has no route to the datasource listener, its user-data turned the reporting off, or the guest does not run cloud-init`,
    };
  }

  // Counts for the node-wide view and the gauges, and the longest-running.
  summary(now: number): { counts: Record<string, number>; oldestRunningSeconds: number } {
    const counts: Record<string, number> = Object.fromEntries(PROVISIONING_STATES.map((s) => [s, 0]));
    let oldest = 0;
    for (const r of this.#o.records.values()) {
      const s = this.status(r, now);
      if (!s) continue;
      counts[s.state]++;
      if (s.state === 'running' && r.provisioning) {
        const from = r.firstSeen?.uid === r.provisioning.uid ? r.firstSeen.at : r.provisioning.firstEventAt;
        oldest = Math.max(oldest, (now - from) / 1000);
      }
    }
    return { counts, oldestRunningSeconds: oldest };
  }
}

const iso = (ms: number) => new Date(ms).toISOString();

/**
 * The guest's first read of its seed (epoch ms): the disk's, or the first
 * meta-data fetch; undefined before either.
 */
export function seedReadAt(r: VmiRecord): number | undefined {
  const uid = r.status?.uid;
  if (r.firstBoot?.uid === uid && r.firstBoot?.readAt !== undefined) return r.firstBoot.readAt;
  const fetched = r.status?.firstFetch?.['meta-data'];
  return fetched === undefined ? undefined : Date.parse(fetched);
}

function stepStatus(s: StepFacts): ProvisioningStep {
  const seconds = s.startTs !== undefined && s.finishTs !== undefined ? Math.max(0, s.finishTs - s.startTs) : undefined;
  return {
    name: s.name,
    ...(s.startedAt !== undefined ? { startedAt: iso(s.startedAt) } : {}),
    ...(s.finishedAt !== undefined ? { finishedAt: iso(s.finishedAt) } : {}),
    ...(seconds !== undefined ? { seconds } : {}),
    ...(s.result ? { result: s.result } : {}),
    ...(s.description ? { description: s.description } : {}),
  };
}

/**
 * For a boot that finished without FAIL, whether it proves the Cluster API sentinel was written:
 * `written` when the user-data writes it as runcmd's last command, this is the object's first boot
 * this agent saw (runcmd's script runs once per instance; a reboot reports scripts_user as a
 * skipped success, and /run is emptied) and scripts_user reported SUCCESS; `unverified` when the
 * user-data writes it but one of these does not hold; undefined when it does not write it (or the
 * boot is not over, or failed).
 */
export function sentinelOf(r: VmiRecord, f: ProvisioningFacts): 'written' | 'unverified' | undefined {
  const s = r.bootstrapSentinel;
  if (!s || s.uid !== f.uid || f.finishedAt === undefined || f.failure) return undefined;
  const ranScripts = f.stages.some(
    (stage) =>
      stage.name === FINAL_STAGE &&
      stage.steps.some((m) => moduleLabel(m.name) === 'scripts_user' && m.result === 'SUCCESS'),
  );
  return s.where === 'last' && f.boot === 1 && ranScripts ? 'written' : 'unverified';
}

function factsStatus(
  f: ProvisioningFacts,
  seen: number | undefined,
  sentinel: 'written' | 'unverified' | undefined,
): ProvisioningStatus {
  const done = f.finishedAt !== undefined;
  const from = f.boot === 1 && seen !== undefined ? seen : f.firstEventAt;
  return {
    state: !done ? 'running' : f.failure ? 'failed' : sentinel === 'written' ? 'bootstrapped' : 'succeeded',
    boot: f.boot,
    ...(seen !== undefined ? { seenAt: iso(seen) } : {}),
    firstEventAt: iso(f.firstEventAt),
    lastEventAt: iso(f.lastEventAt),
    ...(done ? { finishedAt: iso(f.finishedAt!), seconds: Math.max(0, f.finishedAt! - from) / 1000 } : {}),
    ...(f.result ? { result: f.result } : {}),
    stages: f.stages.map((s) => ({ ...stepStatus(s), modules: s.steps.map(stepStatus) })),
    ...(f.failure ? { failure: { step: f.failure.step, description: f.failure.description } } : {}),
    ...(f.dropped > 0 ? { droppedSteps: f.dropped } : {}),
    ...(sentinel ? { sentinel } : {}),
  };
}
