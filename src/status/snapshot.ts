// What the agent knows about itself and each VMI, as plain data. The agent
// keeps it up to date; src/http renders it (/status, /status.json) and
// /readyz reads it. Nothing here may hold user-data, Secret content or
// passwords: only names, sizes, hashes, codes and messages we wrote.
import type { Datasource, DomainState } from '../api/objects.ts';
import type { ErrorCode, ErrorKind } from '../errors.ts';

/** A VMI's state on the status page (each member says when it applies). */
export type VmiState =
  | 'pending' // seen, not reconciled yet, or waiting for what a start brings (src/agent/waiting.ts)
  | 'ready' // image on disk (and injected, when libvirt is on)
  | 'warning' // ready, with a warning (no #cloud-config header, seeded after boot, ...)
  | 'error' // last reconcile failed on what needs a person (retried in backoff unless terminal)
  | 'skipped'; // not vmseed's (no annotation, or KubeVirt owns its volume)

/** An error or warning as the status page shows it, with when it was found. */
export interface StatusProblem {
  code: ErrorCode;
  message: string;
  kind?: ErrorKind;
  field?: string;
  // A cloud-init schema problem's place and kind (CLOUDCONFIG_SCHEMA, CLOUDCONFIG_DEPRECATED).
  schema?: SchemaWarningInfo;
  at: string; // ISO 8601
}

/**
 * Everything the status page shows about one VMI: names, sizes, hashes, codes
 * and our own messages, never seed content.
 */
export interface VmiStatusRecord {
  namespace: string;
  name: string;
  uid: string;
  state: VmiState;
  datasource?: Datasource;
  // Its KubeVirt cloud-init volume was adopted at admission (the
  // vmseed.io/adopted annotation): vmseed builds that seed, not KubeVirt.
  adopted?: AdoptedInfo;
  imagePath?: string;
  imageBytes?: number;
  contentHash?: string; // sha256 hex of the image
  generatedAt?: string; // ISO 8601, when the current image was written
  generationSeconds?: number;
  files?: Array<{ path: string; size: number }>;
  injection?: {
    domain: string;
    targetDev: string;
    bus: 'virtio' | 'scsi';
    flags: string[];
    domainState: DomainState;
    seededAfterBoot: boolean;
    resumed: boolean;
    at: string;
  };
  lastError?: StatusProblem;
  warnings: StatusProblem[];
  retries: number;
  // Failed or waiting: when the work queue runs it again (ISO 8601).
  retryAt?: string;
  // When the VMI entered its current state and code (ISO 8601).
  stateSince?: string;
  // Libvirt on: the domain's start (libvirt's event, as this agent received
  // it), our disk's attach and the guest's first read of it (libvirt's
  // block statistics). A field this agent did not observe is absent.
  firstBoot?: {
    domainStartedAt?: string; // ISO 8601
    attachedAt: string;
    attachAfterStartSeconds?: number;
    seedReadAt?: string;
    readAfterStartSeconds?: number;
    readAfterAttachSeconds?: number;
    // polling: between attach and read; not-read: polling ended without a
    // read; domain-gone: the domain went first; not-polled: too many polls.
    watch: 'polling' | 'read' | 'not-read' | 'domain-gone' | 'not-polled';
  };
  // NoCloud-over-HTTP: the last time the guest fetched each file.
  lastFetch?: Record<string, string>;
  // NoCloud-over-HTTP: the first time it did (meta-data first: the seed read).
  firstFetch?: Record<string, string>;
  // NoCloud-over-HTTP: the datasource serves this VMI's seed. Never the DMI
  // serial itself: its token is a capability (whoever holds it reads the
  // seed, passwords included) and every page here is readable by more
  // people than the VMI's owner. `vmseed seed-url` prints it, offline.
  servedOverHttp?: boolean;
  // Local mode: the manifest this VMI comes from (or one holding its
  // namespace's Secrets or ConfigMaps) does not read or parse now; the seed
  // is from the last version that did (code SOURCE_STALE, the file named).
  stale?: StatusProblem;
  // The Secrets and ConfigMaps its seed was rendered from (watched: an
  // edit re-renders it) and when the agent last saw each change.
  dependencies?: DependencyRecord[];
  // Why its seed does not ask cloud-init to report its progress here (the
  // operator or the VMI opted out, no datasource or key): "progress not
  // reported", and the reason.
  progressNotReported?: string;
  // What the guest's cloud-init reported (its webhook reporting handler
  // posting to the datasource listener), for the current boot; or why
  // nothing was reported.
  provisioning?: ProvisioningStatus;
}

/** A VMI's adopted KubeVirt cloud-init volume: its name, its kind, and who asked (the VMI or its namespace). */
export interface AdoptedInfo {
  volume: string;
  kind: 'cloudInitNoCloud' | 'cloudInitConfigDrive';
  by: 'annotation' | 'namespace';
}

export type ProvisioningResult = 'SUCCESS' | 'WARN' | 'FAIL';

/**
 * One stage of a boot (init-local, init-network, modules-config, modules-final)
 * or one module within it (config-runcmd, ...). Times are when this agent
 * received the event; seconds are cloud-init's own (finish timestamp - start
 * timestamp, the guest's clock).
 */
export interface ProvisioningStep {
  name: string;
  startedAt?: string; // ISO 8601
  finishedAt?: string; // ISO 8601
  seconds?: number;
  result?: ProvisioningResult;
  // cloud-init's description of the finish (or start), bounded and redacted.
  description?: string;
}

/** A stage of a boot with the modules reported under it. */
export interface ProvisioningStage extends ProvisioningStep {
  modules: ProvisioningStep[];
}

/**
 * A VMI's current boot as its guest's cloud-init reported it, or why nothing was
 * reported.
 */
export interface ProvisioningStatus {
  // running: events came, modules-final has not finished; succeeded /
  // failed: modules-final finished (failed when any step reported FAIL);
  // bootstrapped: succeeded, and that proves the Cluster API sentinel was
  // written (docs/provisioning.md, "The contract (v1)"); not-reported: the
  // seed was read and no event came within the bound.
  state: 'running' | 'succeeded' | 'bootstrapped' | 'failed' | 'not-reported';
  // Boots reported for this VMI by this agent; the stages are the last one's.
  boot: number;
  // When this agent first saw the VMI (the timeline's start).
  seenAt?: string; // ISO 8601
  firstEventAt?: string; // ISO 8601
  lastEventAt?: string; // ISO 8601
  finishedAt?: string; // ISO 8601
  // VMI first seen by this agent -> modules-final finished.
  seconds?: number;
  result?: ProvisioningResult;
  stages: ProvisioningStage[];
  // The first step that reported FAIL: its full name and description.
  failure?: { step: string; description?: string };
  // Steps beyond the per-boot bound, not kept.
  droppedSteps?: number;
  // not-reported: why the agent shows nothing more.
  reason?: string;
  // The user-data writes the Cluster API sentinel: bootstrapped says
  // `written`; a succeeded boot that cannot prove it says `unverified`.
  sentinel?: 'written' | 'unverified';
}

/** A Secret or ConfigMap a VMI's seed was rendered from, as last seen. */
export interface DependencyRecord {
  kind: 'Secret' | 'ConfigMap';
  namespace: string;
  name: string;
  state: 'exists' | 'absent' | 'unknown';
  immutable: boolean;
  changedAt?: string;
}

/** The VMI source's state: the informer's (cluster) or the directory watch's (local). */
export interface WatchStatus {
  mode: 'kubernetes' | 'local';
  synced: boolean;
  connected: boolean;
  stale: boolean;
  restarts: number;
  lastEventAt?: string;
  lastError?: string;
  // Local mode: each manifest that does not read or parse now.
  sourceErrors?: SourceError[];
}

/** Local mode: a manifest that does not read or parse now, and the VMIs it may hold back. */
export interface SourceError {
  file: string; // relative to the --local directory
  code: ErrorCode;
  message: string;
  at: string; // ISO 8601, when it was found
  // namespace/name of the VMIs whose seed may lag the file
  vmis: string[];
}

/** The last readiness check, as /readyz answered it. */
export interface ReadinessStatus {
  ready: boolean;
  reasons: string[];
  at: string; // ISO 8601, when it was checked
  // Ready, but part of what the agent does is refused (e.g. the VMI
  // annotation without RBAC for it): why.
  degraded?: string[];
}

/**
 * What /status and /status.json render: the agent, its configuration, queue and
 * every VMI it shows.
 */
export interface AgentStatusSnapshot {
  version: string;
  nodeName: string;
  startedAt: string;
  // Effective configuration, with anything secret removed.
  config: Record<string, string | number | boolean>;
  watch: WatchStatus;
  queue: { depth: number; inFlight: number };
  vmis: VmiStatusRecord[];
  // Most recent generation latencies, oldest first, for the status chart.
  recentGenerations: Array<{ at: string; seconds: number }>;
  // The last readiness check (what /readyz answered), when there was one.
  readiness?: ReadinessStatus;
  // The 169.254.169.254 redirect sidecar, when --redirect-status-url is set
  // and it has been polled once (src/redirect/status-poller.ts).
  redirect?: RedirectStatus;
  // The RPC client's connections to libvirt (--libvirt rpc): what each
  // daemon sent and whether the agent cut it.
  libvirt?: LibvirtStatus;
  // cloud-init's schemas as read at start: "25.1 ready (25.1.4-1); 22.4
  // off: <why>", and whether seeds are checked (src/agent/schema-status.ts).
  cloudInitSchemas?: string;
}

/**
 * One libvirt URI. Counts include the connections already closed; a cut is the
 * agent closing a daemon that broke a bound (flood, slow frame, memory budget,
 * malformed data), backed off by backoffMs before the next try.
 */
export interface LibvirtConnectionStatus {
  uri: string;
  connected: boolean;
  watched: boolean;
  eventsReceived: number;
  eventsDropped: number;
  eventsCoalesced: number;
  eventNamesTooLong: number;
  cachedDomains: number;
  cacheBytes: number;
  bufferedBytes: number;
  cuts: Partial<Record<string, number>>;
  lastCut: { reason: string; message: string } | undefined;
  backoffMs: number;
}

/** The RPC client's connections to libvirt and their shared memory budget (bytes). */
export interface LibvirtStatus {
  // Bytes of partial frames and cached domain handles across connections.
  memoryBudget: { limit: number; used: number };
  connections: LibvirtConnectionStatus[];
}

/**
 * The redirect sidecar as its poll found it. in-place: its /readyz said 200;
 * missing: it answered that the rule is not in place (reason: its code and
 * message); elsewhere: the rule is there but its target did not answer as this
 * node's datasource (another service gets guests' requests); unreachable: no
 * usable answer.
 */
export interface RedirectStatus {
  state: 'in-place' | 'missing' | 'elsewhere' | 'unreachable';
  reason?: string;
  since: string; // ISO 8601, when this state began
  checkedAt: string; // ISO 8601, the last poll
}

/** What the HTTP server reads the agent's status from (the agent's StatusStore). */
export interface StatusSource {
  snapshot(): AgentStatusSnapshot;
  // /readyz: informer synced and not stale; state directory writable with
  // room; virsh there when libvirt is on.
  readiness(): Promise<{ ready: boolean; reasons: string[]; degraded?: string[] }>;
}

/** A schema problem's place and kind (src/cloudinit/schema/check.ts's LocatedProblem without its message): a seed warning carries it, the status page and the metrics read it. */
export interface SchemaWarningInfo {
  document: 'user-data' | 'vendor-data' | 'network-config';
  // The MIME part ("part 2 (x.yaml)"), when the document is a MIME message.
  part?: string;
  // cloud-init's dotted path ("users.0.sudo"), '' for the document.
  path: string;
  // The cloud-init module (cc_runcmd), "unknown" or "network-config".
  module: string;
  severity: 'error' | 'deprecation';
  release: string;
}
