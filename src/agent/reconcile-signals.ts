// Each reconcile in flight has a signal of its own, given to every side
// effect it has (render, image write, libvirt calls, staging). Besides the
// stop deadline it aborts as soon as the work is moot: the VMI was deleted,
// replaced by a new object under the same name, left this node, or a newer
// generation of it waits. Its calls then end at once with CANCELLED, so a
// hung libvirt call of a deleted VMI holds neither a worker nor the VMI's
// next reconcile (queued behind it, which cleans up).
import type { VmiObject } from '../api/objects.ts';
import { VmseedError } from '../errors.ts';
import type { ShutdownDeadline } from './shutdown.ts';

interface InFlight {
  controller: AbortController;
  // It began with an object in the cache (else it only cleans up).
  present: boolean;
  uid: string | undefined;
  generation: number | undefined;
}

export class ReconcileSignals {
  readonly #inFlight = new Map<string, InFlight>();
  readonly #shutdown: ShutdownDeadline | undefined;

  constructor(shutdown?: ShutdownDeadline) {
    this.#shutdown = shutdown;
  }

  // A reconcile of `key` begins, for `vmi` as the cache has it now.
  begin(key: string, vmi: VmiObject | undefined): AbortSignal {
    const controller = new AbortController();
    this.#inFlight.set(key, {
      controller,
      present: vmi !== undefined,
      uid: vmi?.metadata.uid,
      generation: vmi?.metadata.generation,
    });
    return this.#shutdown ? this.#shutdown.forReconcile(controller.signal) : controller.signal;
  }

  end(key: string): void {
    this.#inFlight.delete(key);
  }

  // The key's object as the cache has it after an event (`here`: it is
  // still this node's): the reconcile in flight is cancelled when it works
  // for an object that is gone or superseded.
  changed(key: string, vmi: VmiObject | undefined, here: boolean): void {
    const running = this.#inFlight.get(key);
    if (!running || running.controller.signal.aborted) return;
    const why = supersededBy(running, vmi, here);
    if (why === undefined) return;
    running.controller.abort(
      new VmseedError('CANCELLED', `VMI ${key} ${why}; its reconcile was cancelled and the next one runs now`, {
        kind: 'retryable',
      }),
    );
  }
}

// A reconcile that began without an object only cleans up: that is wanted
// whatever came since.
function supersededBy(running: InFlight, vmi: VmiObject | undefined, here: boolean): string | undefined {
  if (!running.present) return undefined;
  if (!vmi) return 'was deleted';
  if (vmi.metadata.uid !== running.uid) return 'was replaced by a new object';
  if (!here) return "is not this node's any more (moved, Succeeded or Failed)";
  const g = vmi.metadata.generation;
  if (g !== undefined && running.generation !== undefined && g > running.generation)
    return `has a newer generation (${g})`;
  return undefined;
}
