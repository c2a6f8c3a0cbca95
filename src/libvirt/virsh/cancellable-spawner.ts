// Every virsh the agent starts listens to the agent's cancel signal: at the
// stop deadline (--shutdown-timeout) a hung virsh is killed with its process
// group and its reconcile fails with CANCELLED, instead of holding the event
// loop until main() has to end the process around it. A call's own signal
// (its reconcile's) still counts beside it.
import { cancelledBy } from '../../errors.ts';
import type { ProcessSpawner, SpawnOptions, SpawnResult } from './runner.ts';

/**
 * `inner`, with every run() also ended by `signal` (the agent's stop): the
 * process group is killed and run() throws CANCELLED.
 */
export function cancellableSpawner(inner: ProcessSpawner, signal: AbortSignal): ProcessSpawner {
  return {
    holdSocket: (socketPath) => inner.holdSocket(socketPath),
    async run(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnResult> {
      const either = options.signal ? AbortSignal.any([signal, options.signal]) : signal;
      if (either.aborted) throw cancelledBy(either);
      const result = await inner.run(file, args, { ...options, signal: either });
      if (either.aborted) throw cancelledBy(either);
      return result;
    },
  };
}
