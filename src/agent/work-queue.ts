// A work queue of `namespace/name` keys, like client-go's rate-limited queue:
// a key waits at most once, never runs twice at the same time (a key added
// while it runs is run again afterwards), at most `concurrency` keys run at
// once, failures back off per key (capped, reset on success) and a terminal
// failure is not retried until the object's version changes. Keys that
// failed last time (a VMI whose launcher's libvirt hangs until the call's
// deadline, or answers garbage) share at most all workers but one, so a
// key's first run never waits for retries: one hostile launcher per worker
// cannot hold every new VMI back.
import { backoffDelay, type BackoffPolicy } from '../core/backoff.ts';
import { QUEUE_NAME, type Metrics } from '../metrics/metrics.ts';
import { aborted } from './shutdown.ts';

// 'terminal' parks the key until its object's version changes. A park with
// `retryAfterMs` also ends after that long, and the key runs again then.
export type WorkResult = 'success' | 'retry' | 'terminal' | { terminal: true; retryAfterMs: number };

export interface WorkQueueOptions {
  concurrency: number;
  backoff: BackoffPolicy;
  handler: (key: string) => Promise<WorkResult>;
  // The object's resourceVersion, so a terminal failure is parked until it changes.
  versionOf: (key: string) => string | undefined;
  metrics?: Metrics;
  // A failed key was given `delayMs` of backoff before its `attempt`-th
  // retry: what the status page shows as "retry N at T".
  onBackoff?: (key: string, attempt: number, delayMs: number) => void;
}

const Q = { name: QUEUE_NAME };

export class WorkQueue {
  readonly #opts: WorkQueueOptions;
  // Waiting keys, split by whether they failed last time; each in arrival
  // order, and the older head goes first when both may run.
  readonly #fresh: string[] = [];
  readonly #retrying: string[] = [];
  // key -> its arrival number and when it was added (performance.now())
  readonly #queued = new Map<string, { n: number; at: number }>();
  #arrivals = 0;
  readonly #running = new Map<string, number>();
  readonly #runningRetries = new Set<string>();
  readonly #dirty = new Set<string>();
  readonly #failures = new Map<string, number>();
  readonly #timers = new Map<string, NodeJS.Timeout>();
  // key -> version at which it failed terminally
  readonly #parked = new Map<string, string | undefined>();
  // A timed park's end: the timer unparks the key and adds it.
  readonly #parkTimers = new Map<string, NodeJS.Timeout>();
  #stopped = false;
  #idleWaiters: Array<() => void> = [];

  constructor(options: WorkQueueOptions) {
    this.#opts = options;
  }

  get depth(): number {
    return this.#queued.size;
  }

  get inFlight(): number {
    return this.#running.size;
  }

  failures(key: string): number {
    return this.#failures.get(key) ?? 0;
  }

  add(key: string): void {
    if (this.#stopped) return;
    const timer = this.#timers.get(key);
    if (timer) {
      clearTimeout(timer);
      this.#timers.delete(key);
    }
    if (this.#running.has(key)) {
      this.#dirty.add(key);
      return;
    }
    if (this.#queued.has(key)) return;
    this.#queued.set(key, { n: this.#arrivals++, at: performance.now() });
    this.#opts.metrics?.queueAdds.inc(Q);
    (this.#failures.has(key) ? this.#retrying : this.#fresh).push(key);
    this.#gauge();
    this.#pump();
  }

  /**
   * The key's VMI ended: its failure count, backoff timer and park go. A
   * run in flight or a pending add is work, not state, and stays.
   */
  forget(key: string): void {
    this.#failures.delete(key);
    clearTimeout(this.#timers.get(key));
    this.#timers.delete(key);
    this.#unpark(key);
  }

  /** Whether failures, a backoff timer or a park are held for `key`. */
  holds(key: string): boolean {
    return this.#failures.has(key) || this.#timers.has(key) || this.#parked.has(key) || this.#parkTimers.has(key);
  }

  #unpark(key: string): void {
    this.#parked.delete(key);
    clearTimeout(this.#parkTimers.get(key));
    this.#parkTimers.delete(key);
  }

  // Whether this call set the timer (false: stopped, or one is already set).
  addAfter(key: string, ms: number): boolean {
    if (this.#stopped) return false;
    if (this.#timers.has(key)) return false;
    const t = setTimeout(() => {
      this.#timers.delete(key);
      this.add(key);
    }, ms);
    t.unref();
    this.#timers.set(key, t);
    return true;
  }

  longestRunningSeconds(now = performance.now()): number {
    let longest = 0;
    for (const started of this.#running.values()) longest = Math.max(longest, (now - started) / 1000);
    return longest;
  }

  // Seconds of work in flight not yet observed by the work duration.
  unfinishedSeconds(now = performance.now()): number {
    let sum = 0;
    for (const started of this.#running.values()) sum += (now - started) / 1000;
    return sum;
  }

  // Resolves when nothing is queued or running (tests, benchmarks).
  idle(): Promise<void> {
    if (this.#queued.size === 0 && this.#running.size === 0) return Promise.resolve();
    return new Promise((r) => this.#idleWaiters.push(r));
  }

  // Stop taking work; wait for what is in flight until `deadline` aborts.
  // Returns whether everything in flight finished. Called again after a
  // cancel, it waits for the cancelled work to settle.
  async shutdown(deadline: AbortSignal): Promise<boolean> {
    this.#stopped = true;
    for (const t of [...this.#timers.values(), ...this.#parkTimers.values()]) clearTimeout(t);
    this.#timers.clear();
    this.#parkTimers.clear();
    this.#fresh.length = 0;
    this.#retrying.length = 0;
    this.#queued.clear();
    this.#gauge();
    if (this.#running.size === 0) return true;
    return Promise.race([
      new Promise<boolean>((r) => this.#idleWaiters.push(() => r(true))),
      aborted(deadline).then(() => false),
    ]);
  }

  #pump(): void {
    while (!this.#stopped && this.#running.size < this.#opts.concurrency) {
      const next = this.#next();
      if (next === undefined) break;
      const { key, retry } = next;
      if (this.#parked.has(key)) {
        if (this.#parked.get(key) === this.#opts.versionOf(key)) continue;
        this.#unpark(key);
      }
      this.#running.set(key, performance.now());
      if (retry) this.#runningRetries.add(key);
      void this.#run(key);
    }
    this.#gauge();
    if (this.#queued.size === 0 && this.#running.size === 0) {
      const waiters = this.#idleWaiters;
      this.#idleWaiters = [];
      for (const w of waiters) w();
    }
  }

  // The older of the two heads; a retry only while retries hold fewer than
  // all workers but one (with one worker, that one).
  #next(): { key: string; retry: boolean } | undefined {
    const fresh = this.#fresh[0];
    const retryRoom = this.#runningRetries.size < Math.max(1, this.#opts.concurrency - 1);
    const retry = retryRoom ? this.#retrying[0] : undefined;
    if (fresh === undefined && retry === undefined) return undefined;
    const takeRetry =
      retry !== undefined && (fresh === undefined || this.#queued.get(retry)!.n < this.#queued.get(fresh)!.n);
    const key = takeRetry ? this.#retrying.shift()! : this.#fresh.shift()!;
    this.#opts.metrics?.queueLatency.observe(Q, (performance.now() - this.#queued.get(key)!.at) / 1000);
    this.#queued.delete(key);
    return { key, retry: takeRetry };
  }

  async #run(key: string): Promise<void> {
    const started = this.#running.get(key)!;
    const version = this.#opts.versionOf(key);
    let result: WorkResult;
    try {
      result = await this.#opts.handler(key);
    } catch {
      // The handler reports its own errors; a throw here is a bug, retried.
      result = 'retry';
    }
    this.#opts.metrics?.queueWorkDuration.observe(Q, (performance.now() - started) / 1000);
    this.#running.delete(key);
    this.#runningRetries.delete(key);
    if (result === 'success') {
      this.#failures.delete(key);
    } else if (result === 'terminal' || typeof result === 'object') {
      this.#failures.delete(key);
      const ms = typeof result === 'object' ? result.retryAfterMs : undefined;
      this.#unpark(key); // an earlier park's timer
      this.#parked.set(key, version);
      if (ms !== undefined && !this.#stopped) {
        // Not a backoff timer: add() (a resync, an event) must not cancel it.
        const t = setTimeout(() => {
          this.#unpark(key);
          this.add(key);
        }, ms);
        t.unref();
        this.#parkTimers.set(key, t);
      }
    } else {
      const n = (this.#failures.get(key) ?? 0) + 1;
      this.#failures.set(key, n);
      this.#opts.metrics?.queueRetries.inc(Q);
      if (!this.#dirty.has(key)) {
        const delay = backoffDelay(this.#opts.backoff, n);
        if (this.addAfter(key, delay)) this.#opts.onBackoff?.(key, n, delay);
      }
    }
    if (this.#dirty.delete(key)) this.add(key);
    this.#pump();
  }

  #gauge(): void {
    this.#opts.metrics?.queueDepth.set(Q, this.#queued.size);
    this.#opts.metrics?.queueInFlight.set(this.#running.size);
  }
}
