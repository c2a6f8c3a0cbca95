// The datasource's contracts: what it needs from the agent (SeedDirectory),
// its budgets and its settings. Types only, imported by every module of
// the datasource and by the agent, so no module of the datasource needs
// another's implementation for a type.
import type { Seed } from '../cloudinit/seed.ts';
import type { DatasourceFile } from './files.ts';
import type { ImdsFacts } from './imds/identity-endpoint.ts';

/** The datasource's settings, as the agent command hands them over. */
export interface DatasourceConfig {
  listen: { host: string; port: number };
  // This node's own keys (UID and report tokens).
  keyFile: string;
  // Create keyFile with a fresh random key when it does not exist at start.
  keyCreate?: boolean;
  // What guests use (the DMI serial's `s=`), not where we listen.
  baseUrl: string;
  // The base URL's path: what the listener serves under (default /v1).
  prefix: string;
  compatSourceAddress: boolean;
  // Token-less requests answered by source address for VMIs with KubeVirt
  // IMDS's annotations only (src/datasource/imds/compat.ts).
  imdsCompat?: boolean;
  // --datasource-imds-session, when not off (imds/session-endpoint.ts).
  imdsSession?: 'optional' | 'required';
  // The kubelet's pods tree, where /v1/token reads launcher pods' tokens.
  podsDir?: string;
}

/** One VMI's current seed and what the datasource needs to answer for it. */
export interface SeedDirectoryEntry {
  namespace: string;
  name: string;
  uid: string;
  seed: Seed;
  // The token of the VMI's own DMI serial (spec.domain.firmware.serial,
  // src/datasource/url.ts serialToken), when it carries one: it opens this
  // VMI, from its launcher address only. A token of its UID (under the
  // node's key) is accepted as well.
  serialToken?: string;
  // For the IMDS endpoints (/v1/identity, /v1/token, OpenStack paths);
  // absent or not enabled: they answer 404 for this VMI.
  imds?: ImdsFacts;
}

/**
 * What the datasource needs from the agent. The agent implements it over
 * its own state; tests implement it over a Map.
 */
export interface SeedDirectory {
  // The current seed of the VMI with this UID, or undefined when the agent
  // has none (unknown VMI, not rendered yet, render failed). Called on
  // every request, so an implementation may hand out one object until what
  // it derives from changes: callers never modify what it returns.
  get(uid: string): SeedDirectoryEntry | undefined;
  // UIDs of every VMI that has a seed now. Read only when `revision` has
  // moved, to rebuild the token -> UID index.
  listUids(): Iterable<string>;
  // Bumped (any change of value) whenever the set of UIDs, or the serial
  // token of one, may have changed.
  // Changing seeds of existing UIDs need not bump it: get() is read on
  // every request.
  readonly revision: number;
  // Compat mode only: the VMI whose reported addresses
  // (status.interfaces[].ipAddress/ipAddresses) contain this address
  // (plain IPv4 or IPv6 text, IPv4-mapped IPv6 already unwrapped).
  // Must return undefined when zero VMIs OR MORE THAN ONE report it.
  // With launcherAt: the VMI launcherAt names, never status.interfaces.
  byAddress(address: string): SeedDirectoryEntry | undefined;
  // Platforms with launcher pods (KubeVirt): the UID of the VMI whose current
  // launcher pod has this address in its status.podIPs (as the kubelet
  // reports it); undefined when none or more than one does. When present,
  // every answer by identity (token paths included) requires the source to
  // be this VMI's. Absent (local mode, --platform libvirt): addresses are
  // not tied to launcher pods. A Map lookup: called on every request.
  launcherAt?(address: string): string | undefined;
  // A guest fetched a file (GET answered 200). For the status page's
  // "the guest fetched user-data at ...". Must not throw.
  recordFetch(namespace: string, name: string, file: DatasourceFile, at: Date): void;
  // The guest asked with this VMI's token at `missedAt` and found no seed
  // (not rendered yet, or the VMI not known yet); at `servedAt` the same
  // token got the seed. Called once per such miss. Must not throw.
  recordSeededAfterBoot?(entry: SeedDirectoryEntry, missedAt: Date, servedAt: Date): void;
}

/** The datasource listener's budgets; each has a default. */
export interface DatasourceLimits {
  // Longest request target accepted (414 beyond). Default 256: the longest
  // real path is /v1/ + 43 + / + "network-config".
  maxUrlLength?: number;
  // Per source address token bucket (429 when empty). Defaults: 20/s, burst
  // 40 (cloud-init fetches at most four files per boot, with retries).
  ratePerSecond?: number;
  burst?: number;
  maxTrackedSources?: number;
  // Header bytes per request (431 beyond), Node's own limit.
  maxHeaderBytes?: number;
  // Socket-level timeouts, so slow or idle clients do not hold sockets.
  // A connection that has not sent its whole head within headersTimeoutMs
  // (counted from the connection's start, silent ones included) is closed
  // at the next check, every connectionsCheckingIntervalMs: Node's default
  // interval is 30 s, during which one client could hold every slot.
  requestTimeoutMs?: number;
  headersTimeoutMs?: number;
  keepAliveTimeoutMs?: number;
  connectionsCheckingIntervalMs?: number;
  maxConnections?: number;
  // Open connections per source address; more are closed on arrival, so
  // one client cannot take the slots every guest shares. Default 32
  // (cloud-init uses one or two at a time). In compat mode behind NAT or
  // QEMU user networking, all guests behind one address share it.
  maxConnectionsPerSource?: number;
}

/** A pod on this node as the API reports it: what a source address and a /v1/token are checked against. */
export interface NodePod {
  uid: string;
  name: string;
  namespace: string;
  // The UIDs of its ownerReferences (a launcher pod's VMI).
  owners: string[];
  // status.podIPs, as the kubelet reports them.
  ips: string[];
}

/**
 * This node's pods by UID (a Pod watch restricted to spec.nodeName);
 * `revision` changes whenever any pod's entry may have.
 */
export interface NodePods {
  readonly revision: number;
  get(uid: string): NodePod | undefined;
}
