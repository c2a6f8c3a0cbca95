// The remote program's procedures vmseed calls, typed: each encodes its
// *_args struct, sends it, and decodes its *_ret struct exactly (trailing
// bytes are an error). Layouts: libvirt's src/remote/remote_protocol.x.
import { VmseedError, isVmseedError } from '../../errors.ts';
import { RpcConnection, now, unreadableAnswer, type RpcConnectionOptions } from './rpc-connection.ts';
import { MemoryBudget } from './budget.ts';
import {
  AuthType,
  DOMAIN_STATES,
  DomainEventId,
  RemoteProc,
  STRING_MAX,
  UUID_BYTES,
  readAuthList,
  readDomain,
  readDomainEvent,
  writeDomain,
  type DomainEventMessage,
  type DomainRef,
  type RawDomainState,
} from './protocol.ts';
import { XdrReader, XdrWriter, protocolError } from './xdr.ts';

// Device XML is a few hundred bytes; this only stops a runaway caller.
export const DEVICE_XML_MAX = 256 * 1024;

export interface RemoteSessionOptions extends Omit<RpcConnectionOptions, 'onEvent'> {
  // The URI name sent in CONNECT_OPEN, e.g. `qemu:///system`.
  name: string;
  onDomainEvent?: (e: DomainEventMessage) => void;
}

function empty(): Buffer {
  return Buffer.alloc(0);
}

function domainArgs(dom: DomainRef): XdrWriter {
  return writeDomain(new XdrWriter(), dom);
}

// Domain handles kept per session (see RemoteSession.withDomain), by count
// and by bytes: names come from the daemon's events, and a hostile one
// would otherwise park 4,096 names of 1 MiB each.
export const DOMAIN_CACHE_MAX = 4096;
export const DOMAIN_CACHE_BYTES = 1024 * 1024;
// What a cached handle costs beyond its name: the UUID and the Map entry.
const HANDLE_OVERHEAD_BYTES = UUID_BYTES + 64;
// libvirt keeps every QEMU domain's state in `<dir>/<name>.xml`
// (virDomainConfigFile, src/conf/domain_conf.c), so a name over NAME_MAX
// (255) minus `.xml` cannot be a running domain; the wire would carry up
// to REMOTE_STRING_MAX (4 MiB in remote_protocol.x). KubeVirt's
// `<namespace>_<name>` stays far below. A longer name is never cached and
// its events are dropped.
export const DOMAIN_NAME_MAX_BYTES = 251;
// vmseed waits only for its own disk's alias (ua-vmseed_seed); an event
// naming a longer one is dropped rather than queued.
const DEVICE_ALIAS_MAX_BYTES = 255;
// Distinct events waiting for delivery; beyond that they are dropped.
const EVENT_QUEUE_MAX = 1024;

export class RemoteSession {
  readonly conn: RpcConnection;
  readonly name: string;
  // name → handle, from lookups and lifecycle events. libvirtd finds a
  // domain by the handle's UUID (remote.c get_nonnull_domain, then the
  // driver's FindByUUID), so a known handle saves the lookup round trip.
  readonly #domains = new Map<string, DomainRef>();
  #cacheBytes = 0;
  readonly #budget: MemoryBudget;
  // Events waiting for the next turn; identical ones are delivered once.
  readonly #events = new Map<string, DomainEventMessage>();
  readonly #onEvent: ((e: DomainEventMessage) => void) | undefined;

  private constructor(
    conn: RpcConnection,
    name: string,
    budget: MemoryBudget,
    onEvent: ((e: DomainEventMessage) => void) | undefined,
  ) {
    this.conn = conn;
    this.name = name;
    this.#budget = budget;
    this.#onEvent = onEvent;
  }

  // Connects, authenticates and opens `name`. The socket is dropped if any
  // step fails, so a half-open session never escapes.
  static async open(o: RemoteSessionOptions & { deadline: number }): Promise<RemoteSession> {
    const budget = o.memoryBudget ?? new MemoryBudget();
    let s: RemoteSession | undefined;
    const conn = await RpcConnection.open({
      ...o,
      memoryBudget: budget,
      onEvent: (p) => {
        if (s) s.#received(p.header.proc, p.payload);
      },
      onClose: (e, c) => {
        if (s) s.#forgetAll();
        o.onClose?.(e, c);
      },
    });
    s = new RemoteSession(conn, o.name, budget, o.onDomainEvent);
    try {
      await s.#authenticate(o.deadline);
      const w = new XdrWriter().optionalString(o.name, STRING_MAX).u32(0);
      await conn.call(RemoteProc.CONNECT_OPEN, w.toBuffer(), o.deadline, 'connect-open');
    } catch (e) {
      if (unreadableAnswer(e, conn)) conn.cut('protocol', e);
      else conn.destroy();
      throw e;
    }
    return s;
  }

  // A unix socket as root (or a session daemon's owner) needs none; polkit
  // answers "complete" for a client polkit allows. SASL is not spoken.
  async #authenticate(deadline: number): Promise<void> {
    const types = readAuthList(await this.conn.call(RemoteProc.AUTH_LIST, empty(), deadline, 'auth-list'));
    if (types.length === 0 || types.includes(AuthType.NONE)) return;
    if (types.includes(AuthType.POLKIT)) {
      const r = new XdrReader(await this.conn.call(RemoteProc.AUTH_POLKIT, empty(), deadline, 'auth-polkit'));
      if (r.i32() === 1) return;
    }
    throw new VmseedError(
      'LIBVIRT_ACCESS_DENIED',
      `libvirt at ${this.conn.socketPath} requires authentication vmseed does not speak (types ${types.join(',')}); set auth_unix_rw = "none" or connect as root/the socket's owner`,
      { kind: 'terminal', field: 'uri' },
    );
  }

  async getVersion(deadline: number): Promise<bigint> {
    const r = new XdrReader(await this.conn.call(RemoteProc.CONNECT_GET_VERSION, empty(), deadline, 'get-version'));
    const v = r.u64();
    r.end('get-version reply');
    return v;
  }

  async getLibVersion(deadline: number): Promise<bigint> {
    const r = new XdrReader(
      await this.conn.call(RemoteProc.CONNECT_GET_LIB_VERSION, empty(), deadline, 'get-lib-version'),
    );
    const v = r.u64();
    r.end('get-lib-version reply');
    return v;
  }

  async lookupByName(name: string, deadline: number): Promise<DomainRef> {
    const w = new XdrWriter().string(name, STRING_MAX);
    const r = new XdrReader(
      await this.conn.call(RemoteProc.DOMAIN_LOOKUP_BY_NAME, w.toBuffer(), deadline, `lookup domain '${name}'`),
    );
    const d = readDomain(r);
    r.end('lookup reply');
    if (d.name === name) this.#remember(d);
    return d;
  }

  // Runs `fn` on the domain called `name`: with the handle this session
  // already knows, else after a lookup. A known handle that libvirt no
  // longer finds (the name was undefined and defined again with a new UUID,
  // and the event has not arrived yet) is forgotten and `fn` runs once more
  // after a lookup; that is safe for mutations too, since libvirtd looks the
  // domain up before it does anything.
  async withDomain<T>(name: string, deadline: number, fn: (dom: DomainRef) => Promise<T>): Promise<T> {
    const known = this.#domains.get(name);
    if (known) {
      try {
        return await fn(known);
      } catch (e) {
        if (!(isVmseedError(e) && e.code === 'DOMAIN_NOT_FOUND')) throw e;
        if (this.#domains.get(name) === known) this.#forget(name);
      }
    }
    return fn(await this.lookupByName(name, deadline));
  }

  // A renamed domain keeps its UUID: the old name's handle must go before
  // anything is sent under it (libvirt only renames a shut-off domain and
  // says so with undefined/defined events, handled here as they arrive).
  #learn(dom: DomainRef, event: string): void {
    if (event === 'undefined' || event === 'stopped') {
      // stopped: a transient domain is gone; a new one of the same name
      // may get a new UUID.
      this.#forget(dom.name);
    } else {
      this.#remember(dom);
    }
  }

  #remember(dom: DomainRef): void {
    this.#forget(dom.name);
    const cost = handleCost(dom.name);
    if (cost === undefined) return;
    while (
      this.#domains.size > 0 &&
      (this.#domains.size >= DOMAIN_CACHE_MAX || this.#cacheBytes + cost > DOMAIN_CACHE_BYTES)
    )
      this.#forget(this.#domains.keys().next().value!);
    // Over the manager's budget the handle is simply not kept: the next
    // call looks the domain up.
    if (!this.#budget.take(cost)) return;
    this.#cacheBytes += cost;
    this.#domains.set(dom.name, dom);
  }

  #forget(name: string): void {
    if (!this.#domains.delete(name)) return;
    const cost = handleCost(name)!;
    this.#cacheBytes -= cost;
    this.#budget.give(cost);
  }

  #forgetAll(): void {
    this.#budget.give(this.#cacheBytes);
    this.#cacheBytes = 0;
    this.#domains.clear();
  }

  get knownDomains(): number {
    return this.#domains.size;
  }

  // Bytes the handle cache holds (names, UUIDs, entries).
  get cacheBytes(): number {
    return this.#cacheBytes;
  }

  // A MESSAGE of the remote program. The name's length is read from its
  // XDR length word before the string is decoded.
  #received(proc: number, payload: Buffer): void {
    const counters = this.conn.counters;
    const named =
      proc === RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE || proc === RemoteProc.DOMAIN_EVENT_CALLBACK_DEVICE_REMOVED;
    if (named && payload.length >= 8 && payload.readUInt32BE(4) > DOMAIN_NAME_MAX_BYTES) {
      counters.eventsDropped++;
      counters.eventNamesTooLong++;
      return;
    }
    const ev = readDomainEvent(proc, payload);
    if (!ev) return;
    if (ev.kind === 'lifecycle') this.#learn(ev.domain, ev.event);
    else if (Buffer.byteLength(ev.alias) > DEVICE_ALIAS_MAX_BYTES) {
      counters.eventsDropped++;
      return;
    }
    if (!this.#onEvent) return;
    const key = eventKey(ev);
    if (this.#events.has(key)) {
      counters.eventsCoalesced++;
      return;
    }
    if (this.#events.size >= EVENT_QUEUE_MAX) {
      counters.eventsDropped++;
      return;
    }
    if (this.#events.size === 0) setImmediate(() => this.#deliver());
    this.#events.set(key, ev);
  }

  #deliver(): void {
    const batch = [...this.#events.values()];
    this.#events.clear();
    for (const ev of batch) {
      try {
        this.#onEvent?.(ev);
      } catch {
        // A listener's bug must not take the connection down.
      }
    }
  }

  async getState(dom: DomainRef, deadline: number): Promise<{ state: RawDomainState; reason: number }> {
    const w = domainArgs(dom).u32(0);
    const r = new XdrReader(
      await this.conn.call(RemoteProc.DOMAIN_GET_STATE, w.toBuffer(), deadline, `get-state '${dom.name}'`),
    );
    const state = r.i32();
    const reason = r.i32();
    r.end('get-state reply');
    return { state: DOMAIN_STATES[state] ?? 'unknown', reason };
  }

  async isPersistent(dom: DomainRef, deadline: number): Promise<boolean> {
    const r = new XdrReader(
      await this.conn.call(
        RemoteProc.DOMAIN_IS_PERSISTENT,
        domainArgs(dom).toBuffer(),
        deadline,
        `is-persistent '${dom.name}'`,
      ),
    );
    const v = r.i32();
    r.end('is-persistent reply');
    return v === 1;
  }

  async getXmlDesc(dom: DomainRef, flags: number, deadline: number): Promise<string> {
    const w = domainArgs(dom).u32(flags);
    const payload = await this.conn.call(
      RemoteProc.DOMAIN_GET_XML_DESC,
      w.toBuffer(),
      deadline,
      `dumpxml '${dom.name}'`,
    );
    // The daemon's answer, well-formed and too long: asking again, on this
    // connection or another, gets the same. Refused from its length word.
    const bytes = payload.length >= 4 ? payload.readUInt32BE(0) : 0;
    if (bytes > STRING_MAX) {
      throw new VmseedError(
        'DOMAIN_XML_REFUSED',
        `libvirt returned ${bytes} bytes of XML for domain '${dom.name}', more than the ${STRING_MAX} vmseed reads; will retry`,
        { kind: 'retryable' },
      );
    }
    const r = new XdrReader(payload);
    const xml = r.string(STRING_MAX);
    r.end('get-xml-desc reply');
    return xml;
  }

  async attachDevice(dom: DomainRef, xml: string, flags: number, deadline: number): Promise<void> {
    const w = domainArgs(dom).string(xml, DEVICE_XML_MAX).u32(flags);
    new XdrReader(
      await this.conn.call(
        RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS,
        w.toBuffer(),
        deadline,
        `attach-device '${dom.name}'`,
      ),
    ).end('attach reply');
  }

  async detachDevice(dom: DomainRef, xml: string, flags: number, deadline: number): Promise<void> {
    const w = domainArgs(dom).string(xml, DEVICE_XML_MAX).u32(flags);
    new XdrReader(
      await this.conn.call(
        RemoteProc.DOMAIN_DETACH_DEVICE_FLAGS,
        w.toBuffer(),
        deadline,
        `detach-device '${dom.name}'`,
      ),
    ).end('detach reply');
  }

  async resume(dom: DomainRef, deadline: number): Promise<void> {
    new XdrReader(
      await this.conn.call(RemoteProc.DOMAIN_RESUME, domainArgs(dom).toBuffer(), deadline, `resume '${dom.name}'`),
    ).end('resume reply');
  }

  // For every domain on the connection (dom = NULL).
  async registerEvent(eventId: number, deadline: number): Promise<number> {
    const w = new XdrWriter().i32(eventId).bool(false);
    const r = new XdrReader(
      await this.conn.call(
        RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY,
        w.toBuffer(),
        deadline,
        'event-register',
      ),
    );
    const id = r.i32();
    r.end('event-register reply');
    return id;
  }

  async registerDomainEvents(deadline: number): Promise<void> {
    await this.registerEvent(DomainEventId.LIFECYCLE, deadline);
    await this.registerEvent(DomainEventId.DEVICE_REMOVED, deadline);
  }

  // CONNECT_CLOSE lets libvirtd drop its state for us at once; the socket
  // goes either way.
  async close(timeoutMs = 1_000): Promise<void> {
    if (this.conn.closed) return;
    try {
      await this.conn.call(RemoteProc.CONNECT_CLOSE, empty(), now() + timeoutMs, 'connect-close');
    } catch {
      // closing anyway
    } finally {
      this.conn.destroy();
    }
  }

  // remote_domain_block_stats_ret is fixed-size: five hypers (40 bytes),
  // trailing bytes refused. Each counter is a count or -1 (not kept);
  // anything else is a daemon that lies, refused as a protocol error.
  async blockStats(dom: DomainRef, target: string, deadline: number): Promise<BlockStatsReply> {
    const w = domainArgs(dom).string(target, DISK_TARGET_MAX);
    const r = new XdrReader(
      await this.conn.call(RemoteProc.DOMAIN_BLOCK_STATS, w.toBuffer(), deadline, `block-stats '${dom.name}'`),
    );
    const [rdReq, rdBytes, wrReq, wrBytes, errs] = [0, 0, 0, 0, 0].map(() => counter(r.u64()));
    r.end('block-stats reply');
    return { rdReq, rdBytes, wrReq, wrBytes, errs };
  }
}

// undefined: a name no real domain has, never cached.
function handleCost(name: string): number | undefined {
  const bytes = Buffer.byteLength(name);
  return bytes > DOMAIN_NAME_MAX_BYTES ? undefined : bytes + HANDLE_OVERHEAD_BYTES;
}

function eventKey(ev: DomainEventMessage): string {
  const what = ev.kind === 'lifecycle' ? `${ev.event}\0${ev.detail}` : ev.alias;
  return `${ev.kind}\0${ev.domain.name}\0${ev.domain.uuid.toString('hex')}\0${ev.domain.id}\0${what}`;
}

// A disk's target dev (`sdzz`) or source path, as libvirt takes either.
export const DISK_TARGET_MAX = 4096;

export interface BlockStatsReply {
  rdReq: number;
  rdBytes: number;
  wrReq: number;
  wrBytes: number;
  errs: number;
}

function counter(raw: bigint): number {
  const v = BigInt.asIntN(64, raw);
  if (v < -1n || v > BigInt(Number.MAX_SAFE_INTEGER)) throw protocolError(`block-stats counter ${v} out of range`);
  return Number(v);
}
