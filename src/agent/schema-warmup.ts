// A seed never waits for the schema check's first compile. The first check
// against a release in a thread compiles ajv's code for the modules it
// meets (a few hundred milliseconds of the event loop); while the agent
// starts, that would delay every seed behind it. So a render that finds the
// release cold skips its check (RenderOptions.schemaCheck.deferCold) and the
// VMI is noted here; once the work queue is idle (or after MAX_WAIT_MS at
// the latest, under constant churn) the release is warmed up, one short step
// at a time with the queue idle again between steps, and the noted VMIs are
// queued again, BATCH at a time for the same reason: a VMI that changes
// meanwhile waits for a step or a batch, never for all of it. Their seeds are
// unchanged; their status gains the schema warnings, with their Events.
import type { VmiObject } from '../api/objects.ts';
import type { CiProfile } from '../cloudinit/schema/ci-validator.ts';

/** Longest a deferred check (and each step after) waits for an idle queue. */
export const MAX_WAIT_MS = 10_000;
/** VMIs queued again at once after the warm-up. */
export const BATCH = 8;

/** What the warm-up needs of the agent; bound once the agent exists. */
export interface WarmupTarget {
  // Resolves when nothing is queued or running.
  idle(): Promise<void>;
  // Queues a VMI's reconcile again.
  requeue(key: string): void;
}

/** Defers checks against a cold release and warms it when the agent is idle. */
export class SchemaWarmup {
  readonly #steps: (release: CiProfile) => (() => void)[];
  readonly #onError: (release: CiProfile, e: unknown) => void;
  readonly #pending = new Map<CiProfile, Set<string>>();
  // Releases warmed (or tried: a release whose files fail is not deferred again).
  readonly #tried = new Set<CiProfile>();
  #target: WarmupTarget | undefined;
  #stopped = false;

  constructor(o: { steps: (release: CiProfile) => (() => void)[]; onError: (release: CiProfile, e: unknown) => void }) {
    this.#steps = o.steps;
    this.#onError = o.onError;
  }

  bind(target: WarmupTarget): void {
    this.#target = target;
  }

  stop(): void {
    this.#stopped = true;
  }

  // RenderOptions.schemaCheck.deferCold: defers until the release's warm-up
  // has run, and notes the VMI.
  readonly defer = (vmi: VmiObject, release: CiProfile): boolean => {
    if (this.#tried.has(release) || this.#stopped) return false;
    const key = `${vmi.metadata.namespace ?? 'default'}/${vmi.metadata.name}`;
    let keys = this.#pending.get(release);
    if (!keys) {
      keys = new Set();
      this.#pending.set(release, keys);
      void this.#later(release);
    }
    keys.add(key);
    return true;
  };

  async #later(release: CiProfile): Promise<void> {
    await this.#quiet();
    if (this.#stopped) return;
    this.#tried.add(release);
    for (const step of this.#steps(release)) {
      try {
        step();
      } catch (e) {
        this.#onError(release, e);
        break;
      }
      await this.#quiet();
      if (this.#stopped) return;
    }
    const keys = [...(this.#pending.get(release) ?? [])];
    this.#pending.delete(release);
    for (let i = 0; i < keys.length; i += BATCH) {
      for (const key of keys.slice(i, i + BATCH)) this.#target?.requeue(key);
      await this.#quiet();
      if (this.#stopped) return;
    }
  }

  // Past the current reconcile (the queue is not idle while it runs), then
  // until the queue is idle or MAX_WAIT_MS has passed.
  async #quiet(): Promise<void> {
    await new Promise((r) => setImmediate(r));
    let timer: NodeJS.Timeout | undefined;
    await Promise.race([
      this.#target?.idle() ?? Promise.resolve(),
      new Promise((r) => {
        timer = setTimeout(r, MAX_WAIT_MS);
        timer.unref();
      }),
    ]);
    clearTimeout(timer);
  }
}
