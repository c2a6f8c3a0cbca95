// The remote program's procedures vmseed calls, typed: each encodes its
// *_args struct, sends it, and decodes its *_ret struct exactly (trailing
// bytes are an error). Layouts: libvirt's src/remote/remote_protocol.x.
import { VmseedError, isVmseedError } from '../../errors.ts';
import { RpcConnection, now, type RpcConnectionOptions } from './connection.ts';
import {
  AuthType,
  DOMAIN_STATES,
  DomainEventId,
  RemoteProc,
  STRING_MAX,
  readAuthList,
  readDomain,
  readDomainEvent,
  writeDomain,
  type DomainEventMessage,
  type DomainRef,
  type RawDomainState,
} from './protocol.ts';
import { XdrReader, XdrWriter } from './xdr.ts';

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

// Domain handles kept per session (see RemoteSession.domain).
export const DOMAIN_CACHE_MAX = 4096;

export class RemoteSession {
  readonly conn: RpcConnection;
  readonly name: string;
  // name → handle, from lookups and lifecycle events. libvirtd finds a
  // domain by the handle's UUID (remote.c get_nonnull_domain, then the
  // driver's FindByUUID), so a known handle saves the lookup round trip.
  readonly #domains = new Map<string, DomainRef>();

  private constructor(conn: RpcConnection, name: string) {
    this.conn = conn;
    this.name = name;
  }

  // Connects, authenticates and opens `name`. The socket is dropped if any
  // step fails, so a half-open session never escapes.
  static async open(o: RemoteSessionOptions & { deadline: number }): Promise<RemoteSession> {
    const onEvent = o.onDomainEvent;
    let s: RemoteSession | undefined;
    const conn = await RpcConnection.open({
      ...o,
      onEvent: (p) => {
        const ev = readDomainEvent(p.header.proc, p.payload);
        if (!ev) return;
        if (ev.kind === 'lifecycle' && s) s.#learn(ev.domain, ev.event);
        onEvent?.(ev);
      },
    });
    s = new RemoteSession(conn, o.name);
    try {
      await s.#authenticate(o.deadline);
      const w = new XdrWriter().optionalString(o.name, STRING_MAX).u32(0);
      await conn.call(RemoteProc.CONNECT_OPEN, w.toBuffer(), o.deadline, 'connect-open');
    } catch (e) {
      conn.destroy();
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
        if (this.#domains.get(name) === known) this.#domains.delete(name);
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
      this.#domains.delete(dom.name);
    } else {
      this.#remember(dom);
    }
  }

  #remember(dom: DomainRef): void {
    this.#domains.delete(dom.name);
    if (this.#domains.size >= DOMAIN_CACHE_MAX) this.#domains.delete(this.#domains.keys().next().value!);
    this.#domains.set(dom.name, dom);
  }

  get knownDomains(): number {
    return this.#domains.size;
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
    const r = new XdrReader(
      await this.conn.call(RemoteProc.DOMAIN_GET_XML_DESC, w.toBuffer(), deadline, `dumpxml '${dom.name}'`),
    );
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
}
