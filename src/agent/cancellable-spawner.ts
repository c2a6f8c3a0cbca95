// Every virsh the agent starts listens to the agent's cancel signal: at the
// stop deadline (--shutdown-timeout) a hung virsh is killed with its process
// group and its reconcile fails with CANCELLED, instead of holding the event
// loop until main() has to end the process around it.
import { cancelledError } from '../errors.ts';
import type { ProcessSpawner, SpawnOptions, SpawnResult } from '../libvirt/virsh.ts';

export function cancellableSpawner(inner: ProcessSpawner, signal: AbortSignal): ProcessSpawner {
  return {
    holdSocket: (socketPath) => inner.holdSocket(socketPath),
    async run(file: string, args: readonly string[], options: SpawnOptions): Promise<SpawnResult> {
      if (signal.aborted) throw cancelledError();
      const result = await inner.run(file, args, { ...options, signal });
      if (signal.aborted) throw cancelledError();
      return result;
    },
  };
}
