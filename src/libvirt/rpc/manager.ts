// One long-lived RPC session per libvirt URI. Opened on the first call,
// closed after `idleMs` without use (a KubeVirt node has a launcher socket
// per VMI), reopened with backoff when the daemon goes away. A watched URI
// stays open and is reconnected on its own, with its domain events
// re-registered; listeners then get a `connection: up` event, since events
// sent while it was down are lost and the state must be re-read. A
// connection vmseed cut because its daemon misbehaved (a flood, a dripped
// frame, the memory budget) is reconnected with a backoff that keeps
// growing until a connection ends on its own, so one hostile launcher
// costs little and the other URIs never wait for it.
import { VmseedError, isVmseedError } from '../../errors.ts';
import {
  LostCallError,
  now,
  unreadableAnswer,
  type ConnectionCounters,
  type CutReason,
  type RpcConnection,
} from './rpc-connection.ts';
import type { LibvirtConnectionStatus, LibvirtStatus } from '../../status/snapshot.ts';
import { MemoryBudget, LIBVIRT_MEMORY_BUDGET_BYTES } from './budget.ts';
import { uuidString, type DomainEventMessage } from './protocol.ts';
import { RemoteSession } from './remote.ts';
import { resolveUri, type SocketTarget } from './uri.ts';

export type ManagerEvent =
  | { type: 'lifecycle'; uri: string; domain: string; uuid: string; event: string; detail: number }
  | { type: 'device-removed'; uri: string; domain: string; uuid: string; alias: string }
  | { type: 'connection'; uri: string; state: 'up' | 'down'; reconnected: boolean };

export interface ConnectionManagerOptions {
  idleMs?: number;
  maxFrameBytes?: number;
  keepaliveIntervalMs?: number;
  keepaliveTimeoutMs?: number;
  backoffInitialMs?: number;
  backoffMaxMs?: number;
  // Limits how many URIs are open at once (one socket each).
  maxConnections?: number;
  resolve?: (uri: string) => SocketTarget;
  // Backoff ceiling after cuts (see the module comment).
  cutBackoffMaxMs?: number;
  // Bytes of partial frames and cached handles across all connections.
  memoryBudgetBytes?: number;
  frameDeadlineMs?: number;
  eventWindowMs?: number;
  eventsPerWindow?: number;
  floodPerWindow?: number;
}

// What the status page shows per URI (status/snapshot.ts), with the cut
// reasons this client knows.
export interface ConnectionStats extends LibvirtConnectionStatus {
  cuts: Partial<Record<CutReason, number>>;
  lastCut: { reason: CutReason; message: string } | undefined;
}

export interface ManagerStats extends LibvirtStatus {
  connections: ConnectionStats[];
}

interface Entry {
  uri: string;
  session: RemoteSession | undefined;
  opening: Promise<RemoteSession> | undefined;
  lastUsed: number;
  inFlight: number;
  watchers: number;
  everUp: boolean;
  reconnectTimer: NodeJS.Timeout | undefined;
  backoffMs: number;
  // Reconnect attempts that failed since the last success.
  failures: number;
  // Connections cut in a row; the backoff is kept while this is above 0.
  cutStreak: number;
  cuts: Partial<Record<CutReason, number>>;
  lastCut: { reason: CutReason; message: string } | undefined;
  // Counters of the connections already closed.
  past: ConnectionCounters;
}

function zeroCounters(): ConnectionCounters {
  return { eventsReceived: 0, eventsDropped: 0, eventsCoalesced: 0, eventNamesTooLong: 0 };
}

function addCounters(to: ConnectionCounters, from: ConnectionCounters): ConnectionCounters {
  to.eventsReceived += from.eventsReceived;
  to.eventsDropped += from.eventsDropped;
  to.eventsCoalesced += from.eventsCoalesced;
  to.eventNamesTooLong += from.eventNamesTooLong;
  return to;
}

// Errors after which the same call may be tried on a fresh connection.
function connectionFailure(e: unknown): boolean {
  return (
    isVmseedError(e) &&
    (e.code === 'LIBVIRT_UNREACHABLE' || e.code === 'LIBVIRT_CONNECTION_LOST' || e.code === 'LIBVIRT_PROTOCOL')
  );
}

export interface SessionCallOptions {
  deadline: number;
  // Reads may be re-sent after the connection broke mid-call; a mutation
  // may have taken effect and is left to the caller (who re-reads first).
  idempotent: boolean;
}

export class ConnectionManager {
  readonly #entries = new Map<string, Entry>();
  readonly #listeners = new Set<(e: ManagerEvent) => void>();
  readonly #idleMs: number;
  readonly #maxFrameBytes: number | undefined;
  readonly #keepaliveIntervalMs: number | undefined;
  readonly #keepaliveTimeoutMs: number | undefined;
  readonly #backoffInitialMs: number;
  readonly #backoffMaxMs: number;
  readonly #maxConnections: number;
  readonly #resolve: (uri: string) => SocketTarget;
  readonly #cutBackoffMaxMs: number;
  readonly #budget: MemoryBudget;
  readonly #limits: Pick<
    ConnectionManagerOptions,
    'frameDeadlineMs' | 'eventWindowMs' | 'eventsPerWindow' | 'floodPerWindow'
  >;
  readonly #idleTimer: NodeJS.Timeout;
  #closed = false;
  // Calls backing off until libvirtd is back; close() wakes them to fail.
  readonly #sleepers = new Set<() => void>();

  constructor(o: ConnectionManagerOptions = {}) {
    this.#idleMs = o.idleMs ?? 60_000;
    this.#maxFrameBytes = o.maxFrameBytes;
    this.#keepaliveIntervalMs = o.keepaliveIntervalMs;
    this.#keepaliveTimeoutMs = o.keepaliveTimeoutMs;
    this.#backoffInitialMs = o.backoffInitialMs ?? 50;
    this.#backoffMaxMs = o.backoffMaxMs ?? 5_000;
    this.#maxConnections = o.maxConnections ?? 512;
    this.#resolve = o.resolve ?? ((uri) => resolveUri(uri));
    this.#cutBackoffMaxMs = o.cutBackoffMaxMs ?? 60_000;
    this.#budget = new MemoryBudget(o.memoryBudgetBytes ?? LIBVIRT_MEMORY_BUDGET_BYTES);
    this.#limits = {
      frameDeadlineMs: o.frameDeadlineMs,
      eventWindowMs: o.eventWindowMs,
      eventsPerWindow: o.eventsPerWindow,
      floodPerWindow: o.floodPerWindow,
    };
    this.#idleTimer = setInterval(() => this.#closeIdle(), Math.max(10, Math.min(this.#idleMs / 2, 10_000)));
    this.#idleTimer.unref();
  }

  onEvent(listener: (e: ManagerEvent) => void): () => void {
    this.#listeners.add(listener);
    return () => this.#listeners.delete(listener);
  }

  #emit(e: ManagerEvent): void {
    for (const l of [...this.#listeners]) {
      try {
        l(e);
      } catch {
        // one listener's bug must not starve the others
      }
    }
  }

  #entry(uri: string): Entry {
    let e = this.#entries.get(uri);
    if (!e) {
      if (this.#entries.size >= this.#maxConnections) {
        throw new VmseedError(
          'LIBVIRT_UNREACHABLE',
          `more than ${this.#maxConnections} libvirt URIs open at once; will retry once idle ones are closed`,
          { kind: 'retryable' },
        );
      }
      e = {
        uri,
        session: undefined,
        opening: undefined,
        lastUsed: now(),
        inFlight: 0,
        watchers: 0,
        everUp: false,
        reconnectTimer: undefined,
        backoffMs: this.#backoffInitialMs,
        failures: 0,
        cutStreak: 0,
        cuts: {},
        lastCut: undefined,
        past: zeroCounters(),
      };
      this.#entries.set(uri, e);
    }
    return e;
  }

  // Keeps `uri` connected (events flowing) until the returned function is
  // called.
  watch(uri: string): () => void {
    const e = this.#entry(uri);
    e.watchers++;
    if (!e.session && !e.opening) this.#reconnect(e);
    let done = false;
    return () => {
      if (done) return;
      done = true;
      e.watchers--;
      e.lastUsed = now();
    };
  }

  connected(uri: string): boolean {
    return this.#entries.get(uri)?.session?.conn.closed === false;
  }

  #open(e: Entry, deadline: number): Promise<RemoteSession> {
    if (e.session && !e.session.conn.closed) return Promise.resolve(e.session);
    e.opening ??= (async () => {
      try {
        const target = this.#resolve(e.uri);
        // Unset until the session is up: a socket dying before is the
        // open's failure, not a lost session (its cut still counts).
        let up: RemoteSession | undefined;
        const session = await RemoteSession.open({
          ...target,
          deadline,
          maxFrameBytes: this.#maxFrameBytes,
          keepaliveIntervalMs: this.#keepaliveIntervalMs,
          keepaliveTimeoutMs: this.#keepaliveTimeoutMs,
          ...this.#limits,
          memoryBudget: this.#budget,
          onDomainEvent: (m) => this.#emit(toEvent(e.uri, m)),
          onClose: (err, conn) => this.#closedConnection(e, up, conn, err),
        });
        try {
          await session.registerDomainEvents(deadline);
        } catch (err) {
          if (unreadableAnswer(err, session.conn)) session.conn.cut('protocol', err);
          else session.conn.destroy();
          throw err;
        }
        if (this.#closed) {
          await session.close();
          throw closedError();
        }
        const reconnected = e.everUp;
        up = session;
        e.session = session;
        e.everUp = true;
        e.failures = 0;
        if (e.cutStreak === 0) e.backoffMs = this.#backoffInitialMs;
        this.#emit({ type: 'connection', uri: e.uri, state: 'up', reconnected });
        return session;
      } finally {
        e.opening = undefined;
      }
    })();
    return e.opening;
  }

  // `session` is undefined when the socket died during the handshake: the
  // open fails with it, but what the daemon sent and a cut still count.
  #closedConnection(
    e: Entry,
    session: RemoteSession | undefined,
    conn: RpcConnection,
    error: VmseedError | undefined,
  ): void {
    if (session !== undefined && e.session !== session) return;
    addCounters(e.past, conn.counters);
    const reason = conn.cutReason;
    if (reason) {
      e.cuts[reason] = (e.cuts[reason] ?? 0) + 1;
      e.lastCut = { reason, message: error?.message ?? reason };
    }
    if (hostile(reason)) {
      e.cutStreak++;
      e.backoffMs = Math.min(this.#cutBackoffMaxMs, e.backoffMs * 2);
    } else if (session !== undefined) {
      e.cutStreak = 0;
    }
    if (session === undefined) return;
    e.session = undefined;
    this.#emit({ type: 'connection', uri: e.uri, state: 'down', reconnected: false });
    if (e.watchers > 0 && !this.#closed) this.#reconnect(e);
  }

  #reconnect(e: Entry): void {
    if (e.reconnectTimer || this.#closed) return;
    // The first attempt after a watch starts at once; after a loss or a
    // failure, back off.
    const delay = e.everUp || e.failures > 0 ? e.backoffMs : 0;
    e.reconnectTimer = setTimeout(
      () => {
        e.reconnectTimer = undefined;
        if (e.watchers <= 0 || this.#closed || e.session) return;
        const streak = e.cutStreak;
        this.#open(e, now() + 10_000).catch(() => {
          e.failures++;
          // A cut during the handshake has grown the backoff already, and
          // a plain failure never shortens what cuts made it.
          if (e.cutStreak === streak)
            e.backoffMs = Math.max(e.backoffMs, Math.min(this.#backoffMaxMs, e.backoffMs * 2));
          this.#reconnect(e);
        });
      },
      delay * (0.75 + Math.random() * 0.5),
    );
    e.reconnectTimer.unref();
  }

  // Runs `fn` on the URI's session. Until the deadline, a connection that
  // cannot be opened is retried with backoff (libvirtd restarting), and an
  // idempotent call whose connection broke is sent again on a new one.
  async withSession<T>(uri: string, o: SessionCallOptions, fn: (s: RemoteSession) => Promise<T>): Promise<T> {
    if (this.#closed) throw closedError();
    const e = this.#entry(uri);
    e.inFlight++;
    e.lastUsed = now();
    const started = now();
    let backoff = this.#backoffInitialMs;
    // A call whose connection broke under it: if the retry runs out of
    // time, that call is what did not answer, not the retry's handshake.
    let lost: LostCallError | undefined;
    try {
      for (;;) {
        // Closed while this call waited or retried: no more attempts (a
        // retry loop would otherwise hold the process until its deadline).
        if (this.#closed) throw closedError();
        let session: RemoteSession;
        const streak = e.cutStreak;
        try {
          session = await this.#open(e, o.deadline);
        } catch (err) {
          // Cut during the handshake: not asked again within this call either.
          if (!connectionFailure(err) || e.cutStreak !== streak || now() + backoff >= o.deadline)
            throw unanswered(lost, err, o.deadline - started);
          await this.#sleep(backoff);
          backoff = Math.min(this.#backoffMaxMs, backoff * 2);
          continue;
        }
        try {
          return await fn(session);
        } catch (err) {
          // A daemon that answers what vmseed cannot read is cut, not asked
          // again on a new connection until the deadline.
          if (unreadableAnswer(err, session.conn)) {
            session.conn.cut('protocol', err);
            throw err;
          }
          if (this.#closed || !o.idempotent || !connectionFailure(err) || now() >= o.deadline)
            throw unanswered(lost, err, o.deadline - started);
          // A daemon we cut is not asked again within this call: the
          // reconnect waits for its backoff.
          if (hostile(session.conn.cutReason)) throw err;
          if (err instanceof LostCallError) lost ??= err;
          if (!session.conn.closed) session.conn.destroy(err as VmseedError);
        }
      }
    } finally {
      e.inFlight--;
      e.lastUsed = now();
    }
  }

  #sleep(ms: number): Promise<void> {
    return new Promise<void>((resolve) => {
      const wake = () => {
        clearTimeout(timer);
        this.#sleepers.delete(wake);
        resolve();
      };
      const timer = setTimeout(wake, ms);
      this.#sleepers.add(wake);
    });
  }

  #closeIdle(): void {
    const t = now();
    for (const e of this.#entries.values()) {
      if (e.watchers > 0 || e.inFlight > 0 || e.opening || t - e.lastUsed < this.#idleMs) continue;
      this.#entries.delete(e.uri);
      if (e.reconnectTimer) clearTimeout(e.reconnectTimer);
      const s = e.session;
      e.session = undefined;
      if (s) void s.close();
    }
  }

  // Counters per URI and the shared memory budget, for the status page.
  stats(): ManagerStats {
    const connections: ConnectionStats[] = [];
    for (const e of this.#entries.values()) {
      const s = e.session && !e.session.conn.closed ? e.session : undefined;
      const counters = addCounters({ ...e.past }, s?.conn.counters ?? zeroCounters());
      connections.push({
        uri: e.uri,
        connected: s !== undefined,
        watched: e.watchers > 0,
        ...counters,
        cachedDomains: s?.knownDomains ?? 0,
        cacheBytes: s?.cacheBytes ?? 0,
        bufferedBytes: s?.conn.bufferedBytes ?? 0,
        cuts: { ...e.cuts },
        lastCut: e.lastCut,
        backoffMs: e.backoffMs,
      });
    }
    return { memoryBudget: { limit: this.#budget.limit, used: this.#budget.used }, connections };
  }

  get openCount(): number {
    let n = 0;
    for (const e of this.#entries.values()) if (e.session && !e.session.conn.closed) n++;
    return n;
  }

  async close(): Promise<void> {
    this.#closed = true;
    clearInterval(this.#idleTimer);
    for (const wake of [...this.#sleepers]) wake();
    const closing: Promise<void>[] = [];
    for (const e of this.#entries.values()) {
      if (e.reconnectTimer) clearTimeout(e.reconnectTimer);
      const s = e.session;
      e.session = undefined;
      if (s) closing.push(s.close());
    }
    this.#entries.clear();
    await Promise.all(closing);
  }
}

// The call that lost its connection, when the retry on a new one timed out.
function unanswered(lost: LostCallError | undefined, err: unknown, timeoutMs: number): unknown {
  if (!lost || !isVmseedError(err) || !(err.code === 'LIBVIRT_TIMEOUT' || connectionFailure(err))) return err;
  const why = lost.reason.message.split(';')[0];
  return new VmseedError(
    'LIBVIRT_TIMEOUT',
    `libvirt ${lost.operation} got no answer within ${Math.round(timeoutMs)} ms: ${why}, and reconnecting got none in time either (${err.message.split(';')[0]}); libvirtd may be stuck; will retry`,
    { kind: 'retryable', cause: err },
  );
}

// Cuts that say the daemon misbehaved (a hung one is only slow).
function hostile(reason: CutReason | undefined): boolean {
  return reason !== undefined && reason !== 'keepalive';
}

function closedError(): VmseedError {
  return new VmseedError('LIBVIRT_CONNECTION_LOST', 'the libvirt connection manager was closed', { kind: 'retryable' });
}

function toEvent(uri: string, m: DomainEventMessage): ManagerEvent {
  const domain = m.domain.name;
  const uuid = uuidString(m.domain.uuid);
  return m.kind === 'lifecycle'
    ? { type: 'lifecycle', uri, domain, uuid, event: m.event, detail: m.detail }
    : { type: 'device-removed', uri, domain, uuid, alias: m.alias };
}
