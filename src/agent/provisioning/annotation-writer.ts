// Keeps one annotation on the VMIs of this node at the value the agent
// wants it to have, with a JSON merge patch (VMIs are a custom resource: the
// API server takes no strategic merge patch for them). Level-based: a
// change asks for a write at once, and a sweep brings every VMI whose value
// changed since its last write (or whose write failed) up to date, so the
// last value is always written eventually.
//
// Bounded: at most one write per VMI per minIntervalMs whatever its guest
// does, MAX_IN_FLIGHT writes at once, one value kept per VMI. The patch
// carries the object's UID: a VMI deleted and made again under the same
// name is never given the old one's value (the API server refuses the UID
// change with 422). Failures never block seeding, are counted by kind and
// logged at most once a minute per kind; a 403 (the ClusterRole lacks `patch` on
// virtualmachineinstances) pauses the writes and shows as degraded until a
// write succeeds.
import type { Logger } from 'pino';
import { statusMessage, transportReason, type KubeApi } from '../../kube/api-client.ts';
import type { AnnotationWriteResult, Metrics } from '../../metrics/metrics.ts';
import { LogThrottle } from '../../core/log-throttle.ts';

export const MIN_INTERVAL_MS = 10_000;
export const SWEEP_MS = 5_000;
// After a 403, how long before trying again (RBAC may be granted meanwhile).
export const FORBIDDEN_RETRY_MS = 60_000;
const MAX_IN_FLIGHT = 2;

/** The value one VMI (by namespace/name and UID) should carry, and what it carries. */
export interface WantedAnnotation {
  namespace: string;
  name: string;
  uid: string;
  value: string;
  // The value the object carries now (the informer's copy).
  current: string | undefined;
}

/**
 * The API client, the annotation's name, and how to learn each VMI's wanted value
 * and the keys to sweep; the intervals are in ms (defaults MIN_INTERVAL_MS,
 * SWEEP_MS, FORBIDDEN_RETRY_MS).
 */
export interface VmiAnnotationWriterOptions {
  api: KubeApi;
  annotation: string;
  // What the VMI under the key should carry now; undefined: nothing to write.
  wanted: (key: string, now: number) => WantedAnnotation | undefined;
  keys: () => Iterable<string>;
  logger: Logger;
  metrics?: Pick<Metrics, 'vmiAnnotationWrites'>;
  minIntervalMs?: number;
  sweepMs?: number;
  forbiddenRetryMs?: number;
  now?: () => number;
}

interface KeyState {
  uid: string;
  // Last value the API server took, or the object already carried.
  written?: string;
  // A value the API server refused for good (404, 422): not tried again.
  refused?: string;
  notBefore: number;
  busy: boolean;
}

type FailureKind = Exclude<AnnotationWriteResult, 'success'>;

/**
 * Keeps one annotation on this node's VMIs at the wanted value with bounded,
 * UID-guarded merge patches: touch(key) after a change, the sweep catches the
 * rest. Failures never throw to the caller; a 403 shows in degraded().
 */
export class VmiAnnotationWriter {
  readonly #o: VmiAnnotationWriterOptions;
  readonly #keys = new Map<string, KeyState>();
  // Keys waiting for a free slot.
  readonly #waiting = new Set<string>();
  readonly #inFlight = new Set<Promise<void>>();
  readonly #logThrottle = new LogThrottle<FailureKind>();
  #forbidden: { message: string; until: number } | undefined;
  #timer: NodeJS.Timeout | undefined;
  #stopped = false;
  // Writes the API server took (tests, the status page).
  written = 0;

  constructor(options: VmiAnnotationWriterOptions) {
    this.#o = options;
  }

  start(): void {
    this.#timer = setInterval(() => this.sweep(), this.#o.sweepMs ?? SWEEP_MS);
    this.#timer.unref();
  }

  // Writes in flight finish (each bounded by the API client's timeout).
  async stop(): Promise<void> {
    this.#stopped = true;
    if (this.#timer) clearInterval(this.#timer);
    this.#waiting.clear();
    await this.idle();
  }

  // The writes in flight now, and those they let start, have ended.
  async idle(): Promise<void> {
    while (this.#inFlight.size > 0) await Promise.all([...this.#inFlight]);
  }

  // Something about the key changed: write now if its interval allows.
  touch(key: string): void {
    if (this.#stopped) return;
    const wanted = this.#o.wanted(key, this.#now());
    if (wanted) this.#consider(key, wanted);
  }

  sweep(): void {
    for (const key of this.#o.keys()) this.touch(key);
  }

  /** The VMI ended: what was written for it and its wait for a slot go. */
  forget(key: string): void {
    this.#keys.delete(key);
    this.#waiting.delete(key);
  }

  /** Whether a write state or a wait for a slot is held for `key`. */
  holds(key: string): boolean {
    return this.#keys.has(key) || this.#waiting.has(key);
  }

  // Why the annotations are not being written, while the API server refuses them.
  degraded(): string | undefined {
    const f = this.#forbidden;
    if (!f) return undefined;
    return `the VMI annotation ${this.#o.annotation} cannot be written: ${f.message}; grant patch on kubevirt.io virtualmachineinstances in the agent's ClusterRole (manifests/daemonset.yaml), or turn it off with --provisioning-annotation=false`;
  }

  #now(): number {
    return this.#o.now?.() ?? Date.now();
  }

  #consider(key: string, wanted: WantedAnnotation): void {
    let s = this.#keys.get(key);
    if (!s || s.uid !== wanted.uid) this.#keys.set(key, (s = { uid: wanted.uid, notBefore: 0, busy: false }));
    if (wanted.current === wanted.value) s.written = wanted.value;
    if (s.written === wanted.value || s.refused === wanted.value || s.busy) return;
    const now = this.#now();
    if (now < s.notBefore || (this.#forbidden && now < this.#forbidden.until)) return;
    if (this.#inFlight.size >= MAX_IN_FLIGHT) {
      this.#waiting.add(key);
      return;
    }
    s.busy = true;
    s.notBefore = now + (this.#o.minIntervalMs ?? MIN_INTERVAL_MS);
    const done = this.#write(s, wanted).finally(() => {
      s.busy = false;
      this.#inFlight.delete(done);
      this.#next();
    });
    this.#inFlight.add(done);
  }

  #next(): void {
    for (const key of this.#waiting) {
      if (this.#inFlight.size >= MAX_IN_FLIGHT) return;
      this.#waiting.delete(key);
      this.touch(key);
    }
  }

  async #write(s: KeyState, w: WantedAnnotation): Promise<void> {
    const path = `/apis/kubevirt.io/v1/namespaces/${encodeURIComponent(w.namespace)}/virtualmachineinstances/${encodeURIComponent(w.name)}`;
    const patch = { metadata: { uid: w.uid, annotations: { [this.#o.annotation]: w.value } } };
    let status: number;
    let body: unknown;
    try {
      ({ status, body } = await this.#o.api.request('PATCH', path, patch, 'application/merge-patch+json'));
    } catch (e) {
      this.#failed('error', w, `the API server is unreachable (${transportReason(e)}); will retry`);
      return;
    }
    if (status >= 200 && status < 300) {
      s.written = w.value;
      this.written++;
      this.#o.metrics?.vmiAnnotationWrites.inc({ result: 'success' });
      this.#forbidden = undefined;
      return;
    }
    const message = statusMessage(body).slice(0, 300);
    if (status === 403) {
      this.#forbidden = { message: `403 Forbidden (${message})`, until: this.#now() + this.#forbiddenRetryMs() };
      this.#failed('forbidden', w, this.degraded()!);
      return;
    }
    // 404: the VMI is gone (the informer forgets it). 422: another object
    // under the name (its UID differs) or an admission webhook refused.
    if (status === 404 || status === 422) {
      s.refused = w.value;
      this.#failed('refused', w, `the API server answered ${status}${message ? ` (${message})` : ''}; not retried`);
      return;
    }
    // 409, and 429 / 5xx after the client's own retries.
    this.#failed('error', w, `the API server answered ${status}; will retry`);
  }

  #forbiddenRetryMs(): number {
    return this.#o.forbiddenRetryMs ?? FORBIDDEN_RETRY_MS;
  }

  // Counted always, logged at most once a minute per kind.
  #failed(kind: FailureKind, w: WantedAnnotation, why: string): void {
    this.#o.metrics?.vmiAnnotationWrites.inc({ result: kind });
    const admitted = this.#logThrottle.admit(kind, this.#now());
    if (admitted === undefined) return;
    this.#o.logger.warn(
      { namespace: w.namespace, name: w.name, annotation: this.#o.annotation, ...admitted },
      `could not write the VMI annotation (logged at most once a minute per kind): ${why}`,
    );
  }
}
