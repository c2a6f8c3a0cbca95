// A seed never waits for the schema check's first compile. The first check
// against a release in a thread compiles ajv's code for the modules it
// meets (a few hundred milliseconds of the event loop); while the agent
// starts, that would delay every seed behind it. So a render that finds the
// release cold skips its check (RenderOptions.schemaCheck.deferCold) and the
// VMI is noted here; once the work queue is idle (or after MAX_WAIT_MS at
// the latest, under constant churn) the release is warmed up with one check
// and the noted VMIs are queued again: their seeds are unchanged, and their
// status gains the schema warnings, with their Events.
import type { VmiObject } from '../api/objects.ts';
import type { CiProfile } from '../cloudinit/schema/ci-validator.ts';

/** Longest a deferred check waits for an idle queue. */
export const MAX_WAIT_MS = 10_000;

/** What the warm-up needs of the agent; bound once the agent exists. */
export interface WarmupTarget {
  // Resolves when nothing is queued or running.
  idle(): Promise<void>;
  // Queues a VMI's reconcile again.
  requeue(key: string): void;
}

/** Defers checks against a cold release and warms it when the agent is idle. */
export class SchemaWarmup {
  readonly #warm: (release: CiProfile) => void;
  readonly #onError: (release: CiProfile, e: unknown) => void;
  readonly #pending = new Map<CiProfile, Set<string>>();
  // Releases warmed (or tried: a release whose files fail is not deferred again).
  readonly #tried = new Set<CiProfile>();
  #target: WarmupTarget | undefined;
  #stopped = false;

  constructor(o: { warm: (release: CiProfile) => void; onError: (release: CiProfile, e: unknown) => void }) {
    this.#warm = o.warm;
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
    // Past this reconcile: the queue is not idle while it runs.
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
    if (this.#stopped) return;
    this.#tried.add(release);
    try {
      this.#warm(release);
    } catch (e) {
      this.#onError(release, e);
    }
    const keys = this.#pending.get(release) ?? new Set<string>();
    this.#pending.delete(release);
    for (const key of keys) this.#target?.requeue(key);
  }
}
