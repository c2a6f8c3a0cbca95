// LibvirtClient over libvirt's RPC protocol: no process per call, one
// socket per URI (ConnectionManager), domain events. At most one mutation
// per domain is in flight; reads are not serialized.
import { VmseedError, cancelledBy } from '../../errors.ts';
import {
  domainId,
  toDomainState,
  versionString,
  type CallOptions,
  type DeviceFlags,
  type DomainInfo,
  type DomainView,
  type LibvirtClient,
  type ViewOptions,
  type LibvirtEvent,
  type BlockStats,
} from '../libvirt-client.ts';
import { now } from './rpc-connection.ts';
import { ConnectionManager, type ConnectionManagerOptions, type ManagerStats } from './manager.ts';
import { AFFECT_CONFIG, AFFECT_LIVE, XML_INACTIVE } from './protocol.ts';
import type { RemoteSession } from './remote.ts';
import { DomainLock, untilAborted } from '../domain-lock.ts';

export interface RpcLibvirtClientOptions extends ConnectionManagerOptions {
  // Per call, including waiting for a (re)connect.
  timeoutMs?: number;
  // The agent's stop deadline: calls in flight or waiting their turn end
  // with CANCELLED at once (a call already sent may still take effect in
  // libvirt; the injection is level-based and re-reads at the next start).
  cancel?: AbortSignal;
  // Serializes the changes per domain; the injector driving this client
  // shares it (LibvirtInjectorOptions.lock), and its changes pass their turn.
  lock?: DomainLock;
}

const WHAT = 'the libvirt call';

// libvirt's own limit on domain names is larger, but nothing vmseed renders
// comes close; a longer one is a template bug.
const DOMAIN_NAME_MAX = 1024;

/**
 * The LibvirtClient the agent runs with `--libvirt rpc`: one connection per
 * URI, with domain events, and changes serialized per domain on the lock it
 * shares with the injector. Calls end at `timeoutMs` (default 30 s).
 */
export class RpcLibvirtClient implements LibvirtClient {
  readonly kind = 'rpc';
  readonly supportsEvents = true;
  readonly #manager: ConnectionManager;
  readonly #timeoutMs: number;
  readonly #lock: DomainLock;
  readonly #cancel: AbortSignal | undefined;

  constructor(o: RpcLibvirtClientOptions = {}) {
    this.#manager = new ConnectionManager(o);
    this.#timeoutMs = o.timeoutMs ?? 30_000;
    this.#cancel = o.cancel;
    this.#lock = o.lock ?? new DomainLock();
  }

  // The stop signal and the call's own (its reconcile's), either of which
  // ends it.
  #signalFor(o: CallOptions | undefined): AbortSignal | undefined {
    const own = o?.signal;
    if (!own) return this.#cancel;
    return this.#cancel ? AbortSignal.any([this.#cancel, own]) : own;
  }

  // Settles with the call or with CANCELLED when `signal` fires, whichever
  // is first; the call's own deadline still ends it in the background.
  #cancellable<T>(signal: AbortSignal | undefined, call: () => Promise<T>): Promise<T> {
    if (!signal) return call();
    if (signal.aborted) return Promise.reject(cancelledBy(signal, WHAT));
    return untilAborted(call(), signal, WHAT);
  }

  get manager(): ConnectionManager {
    return this.#manager;
  }

  // Per-URI event counts, cuts and memory, for the status page.
  stats(): ManagerStats {
    return this.#manager.stats();
  }

  #deadline(o?: CallOptions): number {
    return now() + (o?.timeoutMs ?? this.#timeoutMs);
  }

  #read<T>(
    uri: string,
    o: CallOptions | undefined,
    fn: (s: RemoteSession, deadline: number) => Promise<T>,
  ): Promise<T> {
    return this.#cancellable(this.#signalFor(o), () => {
      const deadline = this.#deadline(o);
      return this.#manager.withSession(uri, { deadline, idempotent: true }, (s) => fn(s, deadline));
    });
  }

  // Serialized per (uri, domain); the deadline starts when it is this
  // call's turn, so a queue does not eat it.
  #mutate<T>(
    uri: string,
    domain: string,
    o: CallOptions | undefined,
    fn: (s: RemoteSession, deadline: number) => Promise<T>,
  ): Promise<T> {
    const signal = this.#signalFor(o);
    const run = () => {
      const deadline = this.#deadline(o);
      return this.#manager.withSession(uri, { deadline, idempotent: false }, (s) => fn(s, deadline));
    };
    // A turn that comes after the stop (or its reconcile's end) is not sent
    // at all. The caller is released at the stop; the domain stays held
    // until libvirt answered (or the deadline passed), so nothing overtakes
    // the call.
    return this.#lock.run(domainId(uri, domain), run, {
      what: WHAT,
      ...(signal ? { signal } : {}),
      ...(o?.turn ? { within: o.turn } : {}),
    });
  }

  async version(uri: string, o?: CallOptions): Promise<string> {
    return versionString(await this.#read(uri, o, (s, d) => s.getLibVersion(d)));
  }

  async domainInfo(uri: string, domain: string, o?: CallOptions): Promise<DomainInfo> {
    checkName(domain);
    return this.#read(uri, o, (s, d) =>
      s.withDomain(domain, d, async (dom) => {
        // Pipelined: one round trip's latency for both.
        const [st, persistent] = await Promise.all([s.getState(dom, d), s.isPersistent(dom, d)]);
        return { state: toDomainState(st.state), rawState: st.state, persistent };
      }),
    );
  }

  async domainXml(uri: string, domain: string, o?: CallOptions & { inactive?: boolean }): Promise<string> {
    checkName(domain);
    return this.#read(uri, o, (s, d) =>
      s.withDomain(domain, d, (dom) => s.getXmlDesc(dom, o?.inactive ? XML_INACTIVE : 0, d)),
    );
  }

  async domainView(uri: string, domain: string, o?: ViewOptions): Promise<DomainView> {
    checkName(domain);
    return this.#read(uri, o, (s, d) =>
      s.withDomain(domain, d, async (dom) => {
        const [st, persistent, liveXml, inactiveXml] = await Promise.all([
          s.getState(dom, d),
          s.isPersistent(dom, d),
          s.getXmlDesc(dom, 0, d),
          o?.inactive === false ? undefined : s.getXmlDesc(dom, XML_INACTIVE, d),
        ]);
        return {
          info: { state: toDomainState(st.state), rawState: st.state, persistent },
          liveXml,
          ...(inactiveXml !== undefined ? { inactiveXml } : {}),
        };
      }),
    );
  }

  async attachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    checkName(domain);
    const flags = deviceFlags(o);
    return this.#mutate(uri, domain, o, (s, d) => s.withDomain(domain, d, (dom) => s.attachDevice(dom, xml, flags, d)));
  }

  async detachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    checkName(domain);
    const flags = deviceFlags(o);
    return this.#mutate(uri, domain, o, (s, d) => s.withDomain(domain, d, (dom) => s.detachDevice(dom, xml, flags, d)));
  }

  async resume(uri: string, domain: string, o?: CallOptions): Promise<void> {
    checkName(domain);
    return this.#mutate(uri, domain, o, (s, d) => s.withDomain(domain, d, (dom) => s.resume(dom, d)));
  }

  async blockStats(uri: string, domain: string, target: string, o?: CallOptions): Promise<BlockStats> {
    checkName(domain);
    return this.#read(uri, o, (s, d) => s.withDomain(domain, d, (dom) => s.blockStats(dom, target, d)));
  }

  onEvent(listener: (e: LibvirtEvent) => void): () => void {
    return this.#manager.onEvent(listener);
  }

  watch(uri: string): () => void {
    return this.#manager.watch(uri);
  }

  close(): Promise<void> {
    return this.#manager.close();
  }
}

function checkName(domain: string): void {
  if (domain === '' || domain.length > DOMAIN_NAME_MAX || domain.includes('\0')) {
    throw new VmseedError(
      'CONFIG_INVALID',
      `domain name of ${domain.length} characters is empty, too long or has a NUL; check the domain name template`,
      { kind: 'terminal', field: 'domainTemplate' },
    );
  }
}

function deviceFlags(o: DeviceFlags): number {
  if (!o.live && !o.config) {
    throw new VmseedError('INTERNAL', 'device change with neither live nor config', { kind: 'terminal' });
  }
  return (o.live ? AFFECT_LIVE : 0) | (o.config ? AFFECT_CONFIG : 0);
}
