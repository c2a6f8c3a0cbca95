// The agent's side of the VMs-only redirect: this node's launcher pod
// addresses, written for the redirect sidecar (src/redirect/launcher-file.ts).
// They come from the Pod objects of this node (status.podIPs of the pods in
// each VMI's status.activePods), never from the VMI's status.interfaces:
// those also carry what the guest agent reports, and a guest that could
// add an address there could pull another pod's metadata traffic to us.
import type { Logger } from 'pino';
import type { Agent } from '../../agent/controller.ts';
import { LauncherFileWriter } from '../../redirect/launcher-file.ts';
import { LogThrottle } from '../../core/log-throttle.ts';

/** This node's launcher pod addresses, from the node's Pod watch. */
export function launcherAddresses(agent: Agent): () => Iterable<string> {
  return () => agent.seeds?.launcherAddresses() ?? [];
}

/**
 * Writes `launcherAddresses()` to `path` whenever it changes (checked every
 * second); stop it with close().
 */
export function startLauncherFileWriter(
  path: string,
  addresses: () => Iterable<string>,
  logger: Logger,
): LauncherFileWriter {
  const log = logger.child({ component: 'launcher-file' });
  const throttle = new LogThrottle<'write'>();
  return new LauncherFileWriter({
    path,
    launcherAddresses: addresses,
    onError: (e) => {
      const admitted = throttle.admit('write', performance.now());
      if (admitted !== undefined)
        log.error({ path, ...admitted }, `cannot write the launcher address file: ${e.message}`);
    },
  });
}
