// What a VM's start normally brings, in order: KubeVirt schedules the
// launcher pod, its libvirt comes up, virt-handler defines and starts the
// domain, and (with the seed gate) KubeVirt reports the pause the agent
// lifts. Until each arrives a reconcile cannot finish; that is waiting, not
// failing: the VMI is pending, no error is counted and no Warning is
// recorded. Waiting too long is what the pending alert reports, with the
// code it waits on.
import type { ErrorCode, VmseedError } from '../errors.ts';

const WAITING_CODES: ReadonlySet<ErrorCode> = new Set<ErrorCode>([
  'LAUNCHER_POD_UNKNOWN',
  'LIBVIRT_UNREACHABLE',
  'LIBVIRT_CONNECTION_LOST',
  'DOMAIN_NOT_FOUND',
  'DOMAIN_STATE_UNSUPPORTED',
  'SEED_GATE_WAITING',
  // The cluster component (objects, unpause) not answering: it comes back.
  'OBJECTS_SERVICE_UNAVAILABLE',
]);

/** Whether a reconcile's error means the VMI waits for something that normally comes. */
export function isWaiting(err: VmseedError): boolean {
  return err.kind === 'retryable' && WAITING_CODES.has(err.code);
}

/** The codes isWaiting accepts, for docs and tests. */
export const WAITING: readonly ErrorCode[] = [...WAITING_CODES];
