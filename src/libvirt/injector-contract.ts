// The contract between the agent's reconciler and the libvirt injector.
import type { Datasource, DomainState } from '../api/objects.ts';
import type { DomainFacts } from './domain-devices.ts';

/** The VMI an injection is for, as the agent read it. */
export interface InjectionTarget {
  namespace: string;
  name: string;
  uid: string;
  datasource: Datasource;
  // The VMI's annotations, as the agent read them (the injector acts on
  // what it is told in InjectOptions, not on these).
  annotations: Record<string, string>;
  // UIDs of the VMI's active launcher pods on this node (status.activePods
  // filtered by node name, sorted): what {podUID} renders from. Exactly one
  // is needed when a template uses {podUID} (see launcher-pod.ts).
  launcherPods?: string[];
  // What KubeVirt reports of the VMI, for the seed gate's unpause.
  vmi?: {
    phase?: string;
    // spec.startStrategy: Paused (the pause KubeVirt made at start).
    startPaused: boolean;
    // The condition Paused=True.
    pausedCondition: boolean;
  };
}

/** What inject() did to the domain, for the status page, metrics and the seed gate. */
export interface InjectionResult {
  // none: our disk was already there with this source.
  action: 'none' | 'attached' | 'replaced';
  domain: string;
  // libvirt target dev, e.g. `vdb` or `sdb`.
  targetDev: string;
  bus: 'virtio' | 'scsi';
  // virsh flags used for the last change, e.g. ['--live', '--config'].
  flags: string[];
  domainState: DomainState;
  persistent: boolean;
  // The domain was running (not paused, not shut off) when the seed arrived:
  // cloud-init may already have looked for it.
  seededAfterBoot: boolean;
  // The seed gate resumed a paused domain.
  resumed: boolean;
  // Where the domain lives, and when (epoch ms) libvirt confirmed this
  // attach (set only when this call attached or replaced the disk).
  uri?: string;
  attachedAt?: number;
}

export interface EjectionResult {
  action: 'none' | 'detached';
  domain: string;
}

// What every call of an injector may be given.
export interface InjectorCallOptions {
  // The reconcile's: once it aborts (the VMI was deleted or changed, or the
  // agent is stopping) the call's libvirt work ends with CANCELLED and
  // nothing further starts, so no other VMI waits behind it.
  signal?: AbortSignal;
}

/** Options of one inject() call. */
export interface InjectOptions extends InjectorCallOptions {
  // Once the seed is in place, resume the domain if it is paused, through
  // the resume hook (the agent's seed gate decides when: seed-gate.ts).
  resume?: boolean;
}

/**
 * Puts a VMI's seed image into its libvirt domain and takes it out again.
 * Errors are VmseedErrors: DOMAIN_NOT_FOUND is retryable (the launcher may
 * not have defined the domain yet), VIRSH_TIMEOUT retryable, etc.
 */
export interface Injector {
  inject(target: InjectionTarget, imagePath: string, options?: InjectOptions): Promise<InjectionResult>;
  eject(target: InjectionTarget, options?: InjectorCallOptions): Promise<EjectionResult>;
  // Per-launcher-pod injectors (KubeVirt) also place the image in a
  // migration target's pod without attaching it (returns the path the
  // domain sees), remove it from a pod that no longer runs the VM, and tell
  // which pods' libvirt has the domain running or paused.
  readonly perPod?: boolean;
  stage?(target: InjectionTarget, imagePath: string, options?: InjectorCallOptions): Promise<string>;
  unstage?(target: InjectionTarget, options?: InjectorCallOptions): Promise<void>;
  activeDomainPods?(
    target: InjectionTarget,
    pods: string[],
    options?: InjectorCallOptions,
  ): Promise<string[] | undefined>;
  // The domain's interfaces and host devices with their guest addresses, and
  // its vCPU pinning (its live XML, the defined one when shut off), for the
  // ConfigDrive `devices` metadata of tagged devices the spec does not pin.
  // DOMAIN_NOT_FOUND (retryable) until the domain exists. Per-pod
  // injectors: the target names one launcher pod.
  domainDevices?(target: InjectionTarget, options?: InjectorCallOptions): Promise<DomainFacts>;
  // The seed's attach sent from `domain`'s start event, until libvirt has
  // answered it (never rejects); undefined when none is in flight.
  attachingAtStart?(uri: string, domain: string): Promise<void> | undefined;
  // Injectors that keep state per VMI (attaches prepared for a domain's
  // start) drop it when the VMI under `key` ends, and say whether they hold
  // any: the agent registers them with its per-VMI tables.
  forget?(key: string): void;
  holds?(key: string): boolean;
}
