// Events about a VMI, like client-go's recorder: one core/v1 Event per
// distinct (object, type, reason, message); a repeat bumps `count` and
// `lastTimestamp` on that Event with a PATCH instead of writing a new one.
// Recording never throws and never blocks a reconcile.
import type { Logger } from 'pino';
import type { VmiObject } from '../api/objects.ts';
import type { KubeApi } from '../kube/api-client.ts';
import { keyOf } from '../kube/vmi-source.ts';

/** The `reason` of a VMI Event vmseed records. */
export type EventReason =
  | 'SeedReady'
  | 'SeedFailed'
  | 'SeedWarning'
  | 'SeedWaiting'
  | 'SeedRead'
  | 'ProvisioningSucceeded'
  | 'ProvisioningFailed';
/** The Event's `type`, as core/v1 spells it. */
export type EventType = 'Normal' | 'Warning';

/**
 * Where VMI Events go: the Events API in a cluster, the log in local mode.
 * record() never throws and never blocks a reconcile.
 */
export interface EventRecorder {
  record(vmi: VmiObject, type: EventType, reason: EventReason, message: string): void;
  // Wait for pending API calls (graceful stop, tests).
  flush(): Promise<void>;
  // Recorders that keep state per VMI (Event aggregation) drop it when the
  // VMI under `key` ends, and say whether they hold any.
  forget?(key: string): void;
  holds?(key: string): boolean;
}

/** Local mode: no Events API, the log is where they go. */
export class LogEventRecorder implements EventRecorder {
  readonly #log: Logger;

  constructor(logger: Logger) {
    this.#log = logger;
  }

  record(vmi: VmiObject, type: EventType, reason: EventReason, message: string): void {
    const fields = { namespace: vmi.metadata.namespace ?? '', name: vmi.metadata.name, reason, eventType: type };
    if (type === 'Warning') this.#log.warn(fields, message);
    else this.#log.info(fields, message);
  }

  async flush(): Promise<void> {}
}

interface Seen {
  name: string;
  namespace: string;
  count: number;
  // The VMI's key: its aggregates go when it ends.
  vmi: string;
}

const MAX_CACHED = 4096;
const MAX_BACKLOG = 1000;
const MAX_IN_FLIGHT = 2;

interface Pending {
  aggKey: string;
  vmi: VmiObject;
  ns: string;
  type: EventType;
  reason: EventReason;
  message: string;
  at: Date;
  // Nanoseconds for the Event name, unique within this recorder.
  nanos: bigint;
  // The VMI ended before this was sent: sent, but not kept for aggregation.
  ended?: boolean;
}

/**
 * Writes core/v1 Events like client-go's recorder: a repeat PATCHes the
 * existing Event's count. At most 2 requests in flight and a backlog of 1,000
 * (the oldest dropped past it).
 */
export class KubeEventRecorder implements EventRecorder {
  readonly #api: KubeApi;
  readonly #log: Logger;
  readonly #component: string;
  readonly #host: string;
  readonly #now: () => Date;
  readonly #seen = new Map<string, Seen>();
  readonly #backlog: Pending[] = [];
  readonly #busy = new Set<string>();
  readonly #sending = new Set<Pending>();
  #inFlight = 0;
  #dropped = 0;
  #lastNanos = 0n;
  #flushWaiters: Array<() => void> = [];

  constructor(options: { api: KubeApi; logger: Logger; host: string; now?: () => Date }) {
    this.#api = options.api;
    this.#log = options.logger;
    this.#component = 'vmseed';
    this.#host = options.host;
    this.#now = options.now ?? (() => new Date());
  }

  record(vmi: VmiObject, type: EventType, reason: EventReason, message: string): void {
    const ns = vmi.metadata.namespace ?? 'default';
    const aggKey = [vmi.metadata.uid ?? '', ns, vmi.metadata.name, type, reason, message].join('\u0000');
    const at = this.#now();
    // client-go names an Event "<object>.<t.UnixNano() in hex>"; its clock has
    // nanoseconds, ours milliseconds, so two Events in one millisecond (SeedReady
    // then SeedWarning in one reconcile) would share a name and the second POST
    // would meet 409 AlreadyExists. Taken here, in record order, and kept
    // strictly increasing.
    let nanos = BigInt(at.getTime()) * 1_000_000n;
    if (nanos <= this.#lastNanos) nanos = this.#lastNanos + 1n;
    this.#lastNanos = nanos;
    if (this.#backlog.length >= MAX_BACKLOG) {
      // Like client-go's broadcaster: a full buffer drops Events rather than
      // holding reconciles up or growing without bound.
      this.#backlog.shift();
      this.#dropped++;
      if (this.#dropped % 100 === 1)
        this.#log.warn({ dropped: this.#dropped }, 'Event backlog full; dropping the oldest Events');
    }
    this.#backlog.push({ aggKey, vmi, ns, type, reason, message, at, nanos });
    this.#pump();
  }

  // Few requests at a time (client-go sends them one by one): a burst of
  // 1,000 reconciles must not open 1,000 connections to the API server.
  #pump(): void {
    while (this.#inFlight < MAX_IN_FLIGHT && this.#backlog.length > 0) {
      // Calls for one aggregate stay in order, so counts go up one by one.
      const i = this.#backlog.findIndex((e) => !this.#busy.has(e.aggKey));
      if (i < 0) return;
      const e = this.#backlog.splice(i, 1)[0];
      this.#busy.add(e.aggKey);
      this.#sending.add(e);
      this.#inFlight++;
      void this.#send(e)
        .catch((err: unknown) => {
          this.#log.warn(
            { err: { message: (err as Error).message }, namespace: e.ns, name: e.vmi.metadata.name, reason: e.reason },
            'could not record Event',
          );
        })
        .finally(() => {
          this.#busy.delete(e.aggKey);
          this.#sending.delete(e);
          this.#inFlight--;
          this.#pump();
          if (this.#inFlight === 0 && this.#backlog.length === 0) {
            const w = this.#flushWaiters;
            this.#flushWaiters = [];
            for (const f of w) f();
          }
        });
    }
  }

  flush(): Promise<void> {
    if (this.#inFlight === 0 && this.#backlog.length === 0) return Promise.resolve();
    return new Promise((r) => this.#flushWaiters.push(r));
  }

  /**
   * The VMI under `key` ended: its aggregates go, and its Events still
   * waiting or in flight are sent without being kept.
   */
  forget(key: string): void {
    for (const [aggKey, seen] of this.#seen) if (seen.vmi === key) this.#seen.delete(aggKey);
    for (const e of [...this.#backlog, ...this.#sending]) if (vmiKey(e) === key) e.ended = true;
  }

  /** Whether an aggregate of the VMI under `key` is kept. */
  holds(key: string): boolean {
    for (const seen of this.#seen.values()) if (seen.vmi === key) return true;
    return false;
  }

  async #send(e: Pending): Promise<void> {
    const { aggKey, vmi, ns, type, reason, message, at } = e;
    const ts = at.toISOString().replace(/\.\d+Z$/, 'Z');
    const seen = this.#seen.get(aggKey);
    if (seen) {
      const path = `/api/v1/namespaces/${encodeURIComponent(seen.namespace)}/events/${encodeURIComponent(seen.name)}`;
      const res = await this.#api.request(
        'PATCH',
        path,
        { count: seen.count + 1, lastTimestamp: ts },
        'application/strategic-merge-patch+json',
      );
      if (res.status === 200) {
        seen.count++;
        return;
      }
      if (res.status !== 404) throw new Error(`PATCH Event answered ${res.status}`);
      this.#seen.delete(aggKey);
    }
    const name = `${vmi.metadata.name}.${e.nanos.toString(16)}`;
    const event = {
      apiVersion: 'v1',
      kind: 'Event',
      metadata: { name, namespace: ns },
      involvedObject: {
        apiVersion: 'kubevirt.io/v1',
        kind: 'VirtualMachineInstance',
        namespace: ns,
        name: vmi.metadata.name,
        uid: vmi.metadata.uid,
        resourceVersion: vmi.metadata.resourceVersion,
      },
      reason,
      message,
      type,
      count: 1,
      firstTimestamp: ts,
      lastTimestamp: ts,
      source: { component: this.#component, host: this.#host },
      reportingComponent: this.#component,
      reportingInstance: this.#host,
    };
    const path = `/api/v1/namespaces/${encodeURIComponent(ns)}/events`;
    const res = await this.#api.request('POST', path, event);
    // 409 AlreadyExists: a retried POST whose first try was stored before its 5xx answer.
    if (res.status !== 201 && res.status !== 200 && res.status !== 409)
      throw new Error(`POST Event answered ${res.status}`);
    if (e.ended) return;
    if (this.#seen.size >= MAX_CACHED) this.#seen.delete(this.#seen.keys().next().value!);
    this.#seen.set(aggKey, { name, namespace: ns, count: 1, vmi: vmiKey(e) });
  }
}

function vmiKey(e: Pending): string {
  return keyOf(e.vmi);
}
