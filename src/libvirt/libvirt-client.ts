// What the injector needs from libvirt, behind one interface with two
// implementations: RpcLibvirtClient (libvirt's RPC protocol over one
// long-lived socket per URI, with domain events) and VirshLibvirtClient
// (one `virsh` process per call, works wherever virsh does). Errors are
// VmseedErrors with the same codes on both paths.
import type { DomainState } from '../api/objects.ts';
import type { LibvirtStatus } from '../status/snapshot.ts';
import type { DomainTurn } from './domain-lock.ts';

/** A domain's state, mapped to vmseed's four (toDomainState), and whether it is persistent. */
export interface DomainInfo {
  state: DomainState;
  // libvirt's own state name, e.g. `blocked`, `crashed` (for messages).
  rawState: string;
  persistent: boolean;
}

/**
 * Everything an injection reads, in one go: state, persistence, and the
 * live and next-boot XML (the same document for a shut-off domain; the
 * inactive one is meaningless for a transient domain, and absent when not
 * asked for or, with virsh, for a transient domain).
 */
export interface DomainView {
  info: DomainInfo;
  liveXml: string;
  inactiveXml?: string;
}

/** Options of domainView(). */
export interface ViewOptions extends CallOptions {
  // Read the next-boot XML too (default true).
  inactive?: boolean;
}

/** What every LibvirtClient call may be given; `timeoutMs` in milliseconds. */
export interface CallOptions {
  timeoutMs?: number;
  // The reconcile's: when it aborts the call ends with CANCELLED at once
  // (one already sent may still take effect in libvirt).
  signal?: AbortSignal;
  // The caller's turn on the domain (domain-lock.ts), when it holds one: a
  // client that serializes its changes on the same lock runs the call in
  // that turn rather than queueing behind it.
  turn?: DomainTurn;
}

/** Which definitions a device change applies to: the running domain (`live`), the persistent one (`config`). */
export interface DeviceFlags extends CallOptions {
  live: boolean;
  config: boolean;
}

/**
 * What onEvent() delivers: a domain's lifecycle change or device removal,
 * or a connection going up or down (RPC only; virsh has no events).
 */
export type LibvirtEvent =
  | { type: 'lifecycle'; uri: string; domain: string; uuid: string; event: string; detail: number }
  | { type: 'device-removed'; uri: string; domain: string; uuid: string; alias: string }
  // up with reconnected: events may have been missed; re-read the domains.
  | { type: 'connection'; uri: string; state: 'up' | 'down'; reconnected: boolean };

/**
 * One disk's I/O counters since the domain started (virDomainBlockStats);
 * -1 where the driver keeps none.
 */
export interface BlockStats {
  rdReq: number;
  rdBytes: number;
  wrReq: number;
  wrBytes: number;
  errs: number;
}

/**
 * One domain of one libvirt connection: the key every per-domain map and
 * lock of the agent uses (a name is unique only within its daemon).
 */
export function domainId(uri: string, domain: string): string {
  return `${uri}\0${domain}`;
}

/**
 * libvirt as the injector and the agent use it, over RPC or virsh; failures
 * are VmseedErrors with the same codes on both (DOMAIN_NOT_FOUND, CANCELLED...).
 */
export interface LibvirtClient {
  readonly kind: 'rpc' | 'virsh';
  // false: onEvent never fires, poll instead.
  readonly supportsEvents: boolean;
  // libvirt's library version on the daemon side, e.g. `9.0.0`.
  version(uri: string, o?: CallOptions): Promise<string>;
  domainInfo(uri: string, domain: string, o?: CallOptions): Promise<DomainInfo>;
  domainXml(uri: string, domain: string, o?: CallOptions & { inactive?: boolean }): Promise<string>;
  // RPC: the four reads pipelined (one round trip; a lookup first only
  // when the connection does not know the domain's handle yet).
  domainView(uri: string, domain: string, o?: ViewOptions): Promise<DomainView>;
  attachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void>;
  detachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void>;
  resume(uri: string, domain: string, o?: CallOptions): Promise<void>;
  // `target`: the disk's target dev, e.g. `sdzz`.
  blockStats(uri: string, domain: string, target: string, o?: CallOptions): Promise<BlockStats>;
  onEvent(listener: (e: LibvirtEvent) => void): () => void;
  // Keep a connection to `uri` (and its events) until the returned
  // function is called.
  watch(uri: string): () => void;
  // Per-URI connection counters, where the client keeps connections (rpc).
  stats?(): LibvirtStatus;
  close(): Promise<void>;
}

/** libvirt's state name as vmseed's DomainState: `blocked` counts as running, anything unknown as `other`. */
export function toDomainState(raw: string): DomainState {
  return raw === 'running' || raw === 'blocked'
    ? 'running'
    : raw === 'paused'
      ? 'paused'
      : raw === 'shutoff'
        ? 'shutoff'
        : 'other';
}

/** libvirt's packed version number (major * 1,000,000 + minor * 1,000 + release) as `9.0.0`. */
export function versionString(v: bigint): string {
  const n = Number(v);
  return `${Math.floor(n / 1_000_000)}.${Math.floor(n / 1000) % 1000}.${n % 1000}`;
}
