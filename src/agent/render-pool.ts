// Runs a render's heavy steps (src/cloudinit/pure-ops.ts) on worker threads
// when the document is large, so no reconcile holds the event loop for more
// than a few tens of milliseconds: the probes, the status page, the
// datasource listener and every other VMI's reconcile keep running while a
// 1 MiB user-data is parsed, merged and serialised.
//
// Bounded on every side: a few workers (each its own V8 isolate, with its
// own heap cap through resourceLimits), a bounded queue (RENDER_QUEUE_FULL),
// a deadline per step after which the worker is terminated and the step
// fails with RENDER_TIMEOUT (both retryable: the reconcile backs off and
// tries again), and an AbortSignal that drops a queued step or terminates a
// running one (CANCELLED) when the agent stops. Workers start on the first
// large document and end after a while idle.
import { Worker } from 'node:worker_threads';
import { runPure, type Offload, type PureArgs, type PureOpName, type PureResult } from '../cloudinit/pure-ops.ts';
import { VmseedError, cancelledError } from '../errors.ts';
import { READY, type JobMessage, type ReplyMessage } from './render-worker.ts';

/** A render pool's size, queue bound, per-step deadline and idle time; the defaults suit the agent. */
export interface RenderPoolOptions {
  // Worker threads (default 1: the agent's reconciles are mostly I/O, and
  // each worker adds an isolate's memory).
  size?: number;
  // Steps waiting for a worker beyond the running ones (default 64).
  maxQueue?: number;
  // A step's time on a worker before the worker is terminated (default 10 s:
  // far more than the largest document the limits allow takes; `npm run
  // bench:hostile`, row dense-userdata-merge-1mib).
  deadlineMs?: number;
  // How long a new worker may take to load its modules (default 30 s: a
  // cold start strips and compiles the TypeScript sources, slow on a busy
  // node). Not counted in a step's deadline.
  startMs?: number;
  // Documents below this many bytes run inline (default 64 KiB: below it a
  // step holds the loop a few tens of milliseconds at worst, and on a small
  // document the round trip to a worker costs more than the step itself;
  // docs/threat-model.md, "Measured").
  minBytes?: number;
  // Each worker's old-generation heap, MiB (default 48: merging 1 MiB of
  // one-line keys needs most of it; docs/threat-model.md, "Measured"). Past
  // it the worker dies (RENDER_WORKER_FAILED), not the agent. The young
  // generation is kept small as bin/vmseed keeps the main thread's
  // (--max-semi-space-size=1): RSS, not speed, is short.
  maxOldGenerationSizeMb?: number;
  // A worker idle this long is ended (default 30 s).
  idleMs?: number;
  // Tests: another worker script speaking the same messages.
  workerUrl?: URL;
}

/** Documents at least this large run on a worker; smaller ones cost less inline than a round trip. */
export const DEFAULT_OFFLOAD_MIN_BYTES = 64 * 1024;

interface Job {
  id: number;
  op: PureOpName;
  args: unknown[];
  resolve(value: unknown): void;
  reject(error: Error): void;
  signal: AbortSignal | undefined;
  onAbort: (() => void) | undefined;
}

interface Slot {
  worker: Worker;
  // The worker has loaded its modules (its first message): a step's
  // deadline runs from when the worker can work on it.
  ready: boolean;
  job: Job | undefined;
  timer: NodeJS.Timeout | undefined;
  idle: NodeJS.Timeout | undefined;
}

/**
 * The render's Offload: run() does a pure step inline below `minBytes`, else on
 * a worker thread. Rejects with retryable RENDER_QUEUE_FULL or RENDER_TIMEOUT,
 * or CANCELLED on abort or close().
 */
export class RenderPool implements Offload {
  readonly #size: number;
  readonly #maxQueue: number;
  readonly #deadlineMs: number;
  readonly #startMs: number;
  readonly #minBytes: number;
  readonly #maxOld: number;
  readonly #idleMs: number;
  readonly #url: URL;
  readonly #slots = new Set<Slot>();
  readonly #queue: Job[] = [];
  #nextId = 1;
  #closed = false;
  // Steps run on a worker and workers started (tests, the bench).
  offloaded = 0;
  started = 0;

  constructor(options: RenderPoolOptions = {}) {
    this.#size = Math.max(1, options.size ?? 1);
    this.#maxQueue = options.maxQueue ?? 64;
    this.#deadlineMs = options.deadlineMs ?? 10_000;
    this.#startMs = options.startMs ?? 30_000;
    this.#minBytes = options.minBytes ?? DEFAULT_OFFLOAD_MIN_BYTES;
    this.#maxOld = options.maxOldGenerationSizeMb ?? 48;
    this.#idleMs = options.idleMs ?? 30_000;
    this.#url = options.workerUrl ?? new URL('./render-worker.ts', import.meta.url);
  }

  get queued(): number {
    return this.#queue.length;
  }

  get workers(): number {
    return this.#slots.size;
  }

  run<K extends PureOpName>(op: K, args: PureArgs<K>, bytes: number, signal?: AbortSignal): Promise<PureResult<K>> {
    if (signal?.aborted) return Promise.reject(cancelledError());
    if (bytes < this.#minBytes) {
      // Runs now; a throw rejects the promise.
      return new Promise((resolve) => resolve(runPure(op, args)));
    }
    if (this.#closed) return Promise.reject(cancelledError());
    if (this.#queue.length >= this.#maxQueue) {
      return Promise.reject(
        new VmseedError(
          'RENDER_QUEUE_FULL',
          `more than ${this.#maxQueue} large documents wait for the render worker; retried with backoff`,
          { kind: 'retryable' },
        ),
      );
    }
    return new Promise<PureResult<K>>((resolve, reject) => {
      const job: Job = { id: this.#nextId++, op, args, resolve: resolve, reject, signal, onAbort: undefined };
      if (signal) {
        job.onAbort = () => this.#abort(job);
        signal.addEventListener('abort', job.onAbort, { once: true });
      }
      this.#queue.push(job);
      this.#dispatch();
    });
  }

  // Ends every worker; queued and running steps fail with CANCELLED.
  async close(): Promise<void> {
    this.#closed = true;
    for (const job of this.#queue.splice(0)) this.#settle(job, cancelledError());
    await Promise.all([...this.#slots].map((slot) => this.#retire(slot, cancelledError())));
  }

  #dispatch(): void {
    while (this.#queue.length > 0) {
      let slot = [...this.#slots].find((s) => s.job === undefined);
      if (!slot) {
        if (this.#slots.size >= this.#size) return;
        slot = this.#spawn();
      }
      slot.job = this.#queue.shift()!;
      clearTimeout(slot.idle);
      slot.idle = undefined;
      if (slot.ready) this.#send(slot);
    }
  }

  #send(slot: Slot): void {
    const job = slot.job!;
    slot.timer = setTimeout(() => {
      void this.#retire(
        slot,
        new VmseedError(
          'RENDER_TIMEOUT',
          `rendering took more than ${this.#deadlineMs} ms on the render worker (step ${job.op}); the worker was ended and the render is retried with backoff`,
          { kind: 'retryable' },
        ),
      );
    }, this.#deadlineMs);
    this.offloaded++;
    slot.worker.ref();
    slot.worker.postMessage({ id: job.id, op: job.op, args: job.args } satisfies JobMessage);
  }

  #spawn(): Slot {
    const worker = new Worker(this.#url, {
      resourceLimits: { maxOldGenerationSizeMb: this.#maxOld, maxYoungGenerationSizeMb: 4 },
      // The agent's own NODE_OPTIONS heap cap is for the main isolate.
      execArgv: [],
      stdout: false,
      stderr: false,
    });
    // An idle worker does not keep the process alive; one with a step does
    // (a promise alone would not).
    worker.unref();
    this.started++;
    const slot: Slot = { worker, ready: false, job: undefined, timer: undefined, idle: undefined };
    this.#slots.add(slot);
    // Starting is bounded too.
    slot.timer = setTimeout(() => {
      void this.#retire(
        slot,
        new VmseedError(
          'RENDER_WORKER_FAILED',
          `the render worker did not start within ${this.#startMs} ms; the render is retried with backoff`,
          { kind: 'retryable' },
        ),
      );
    }, this.#startMs);
    worker.on('message', (reply: ReplyMessage | typeof READY) => this.#onMessage(slot, reply));
    // A crash (out of memory under resourceLimits, a bug) fails the running
    // step; the next step gets a new worker.
    const died = (why: string) => {
      if (!this.#slots.has(slot)) return;
      void this.#retire(
        slot,
        new VmseedError('RENDER_WORKER_FAILED', `the render worker ${why}; the render is retried with backoff`, {
          kind: 'retryable',
        }),
      );
    };
    worker.on('error', (e: Error & { code?: string }) =>
      died(e.code === 'ERR_WORKER_OUT_OF_MEMORY' ? `ran out of its ${this.#maxOld} MiB heap` : 'failed'),
    );
    worker.on('exit', (code) => died(`exited (code ${code})`));
    return slot;
  }

  #onMessage(slot: Slot, reply: ReplyMessage | typeof READY): void {
    if (reply === READY) {
      clearTimeout(slot.timer);
      slot.ready = true;
      if (slot.job) this.#send(slot);
      else this.#idleLater(slot);
      return;
    }
    const job = slot.job;
    if (!job || job.id !== reply.id) return;
    clearTimeout(slot.timer);
    slot.job = undefined;
    if (reply.ok) this.#settle(job, undefined, reply.value);
    else if (reply.error.vmseed)
      this.#settle(
        job,
        new VmseedError(reply.error.code, reply.error.message, {
          kind: reply.error.kind,
          ...(reply.error.field !== undefined ? { field: reply.error.field } : {}),
        }),
      );
    else this.#settle(job, new Error(`${reply.error.name} in the render worker: ${reply.error.message}`));
    this.#idleLater(slot);
    this.#dispatch();
  }

  #idleLater(slot: Slot): void {
    slot.worker.unref();
    clearTimeout(slot.idle);
    slot.idle = setTimeout(() => {
      if (slot.job === undefined) void this.#retire(slot, cancelledError());
    }, this.#idleMs);
    slot.idle.unref();
  }

  async #retire(slot: Slot, error: Error): Promise<void> {
    if (!this.#slots.delete(slot)) return;
    clearTimeout(slot.timer);
    clearTimeout(slot.idle);
    const job = slot.job;
    slot.job = undefined;
    if (job) this.#settle(job, error);
    await slot.worker.terminate();
    if (!this.#closed) this.#dispatch();
  }

  #abort(job: Job): void {
    const i = this.#queue.indexOf(job);
    if (i >= 0) {
      this.#queue.splice(i, 1);
      this.#settle(job, cancelledError());
      return;
    }
    const slot = [...this.#slots].find((s) => s.job === job);
    if (slot) void this.#retire(slot, cancelledError());
  }

  #settle(job: Job, error: Error | undefined, value?: unknown): void {
    if (job.onAbort) job.signal?.removeEventListener('abort', job.onAbort);
    if (error) job.reject(error);
    else job.resolve(value);
  }
}
