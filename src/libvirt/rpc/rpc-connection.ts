// One socket to a libvirt daemon: frames, serials, per-call deadlines and
// keepalive. Calls are pipelined (libvirtd runs several per client at once),
// replies are matched by serial. A call past its deadline fails at once; the
// connection is then probed with a keepalive PING and torn down if the daemon
// does not answer, so a hung daemon costs its callers one deadline, never a
// stuck promise.
//
// The daemon is not trusted (a launcher's socket belongs to whoever owns the
// guest's launcher pod): a frame must complete within a deadline from its
// first byte, only whole packets count as signs of life, what a frame holds
// is reserved from a memory budget, and packets nobody asked for (events,
// PINGs, stray replies) are rate-limited, with a flood cutting the
// connection. Each of these closes the connection with a LIBVIRT_PROTOCOL
// error naming why; the manager backs off before it reconnects.
import { MemoryBudget } from './budget.ts';
import { protocolError } from './xdr.ts';
import { createConnection, type Socket } from 'node:net';
import { VmseedError } from '../../errors.ts';
import {
  DEFAULT_MAX_FRAME_BYTES,
  FrameDecoder,
  HEADER_BYTES,
  KEEPALIVE_PROGRAM,
  KEEPALIVE_PROTOCOL_VERSION,
  KeepaliveProc,
  MessageStatus,
  MessageType,
  REMOTE_PROGRAM,
  REMOTE_PROTOCOL_VERSION,
  encodePacket,
  readRemoteError,
  type Header,
  type Packet,
} from './protocol.ts';
import { mapRemoteError } from './remote-error.ts';
import { holdSocket, type HeldSocket } from './socket-hold.ts';

export interface RpcConnectionOptions {
  socketPath: string;
  maxFrameBytes?: number;
  // Nothing received for this long: send a keepalive PING.
  keepaliveIntervalMs?: number;
  // No answer (any packet) this long after a PING: the daemon is hung.
  keepaliveTimeoutMs?: number;
  // MESSAGE packets of the remote program (domain events).
  onEvent?: (packet: Packet) => void;
  // Called once, when the socket is gone (error undefined: closed by us),
  // with the connection (its counters and cut reason), which the caller may
  // not hold yet when the socket dies during a handshake.
  onClose?: (error: VmseedError | undefined, conn: RpcConnection) => void;
  // Calls on the wire at once; more wait here. libvirtd stops reading a
  // client with max_client_requests (default 5) calls outstanding, and a
  // keepalive PING it cannot read would look like a hung daemon, so this
  // stays below that.
  maxInFlight?: number;
  // A frame must be whole this long after its first byte.
  frameDeadlineMs?: number;
  // Shared by all connections of a manager; a connection alone gets its own.
  memoryBudget?: MemoryBudget;
  eventWindowMs?: number;
  eventsPerWindow?: number;
  floodPerWindow?: number;
}

interface Pending {
  operation: string;
  packet: Buffer;
  resolve: (payload: Buffer) => void;
  reject: (e: VmseedError) => void;
  timer: NodeJS.Timeout;
}

// A real daemon writes a frame in one go, which arrives over a unix socket
// far inside this (measured: docs/libvirt-rpc.md, "An untrusted daemon");
// 10 s from its first byte only a dripping daemon misses.
export const DEFAULT_FRAME_DEADLINE_MS = 10_000;
// Unsolicited packets per window. libvirtd sends a handful of lifecycle
// events per domain state change and a PING every 5 s: 1,000 in 2 s is
// far beyond a node's worth of VMs booting at once, so more are dropped;
// 10,000 in 2 s (5,000/s) is a daemon flooding, and the connection is cut.
export const DEFAULT_EVENT_WINDOW_MS = 2_000;
export const DEFAULT_EVENTS_PER_WINDOW = 1_000;
export const DEFAULT_FLOOD_PER_WINDOW = 10_000;
// The largest unsolicited frame: the events vmseed registers for (lifecycle,
// device removed) carry a domain name of at most 251 bytes and an alias, a
// few hundred bytes in all; a PING is its header. A longer one is refused
// from its header, before its body is read: reading megabytes a packet only
// to drop it would hand the daemon the agent's event loop.
export const UNSOLICITED_FRAME_MAX = 4096;

// Why vmseed closed a connection on its own (its daemon misbehaved).
export type CutReason = 'flood' | 'slow-frame' | 'memory-budget' | 'protocol' | 'keepalive';

// Per connection; the session adds the event counts it decides on.
export interface ConnectionCounters {
  // Unsolicited packets: events, the daemon's PINGs, replies nobody waits for.
  eventsReceived: number;
  // Over the window's rate, or unusable (a domain name no real domain has).
  eventsDropped: number;
  // Delivered as one with an identical event still queued.
  eventsCoalesced: number;
  // Of the dropped: naming a domain longer than any real one.
  eventNamesTooLong: number;
}

export function now(): number {
  return performance.now();
}

export function timeoutError(operation: string, ms: number, socketPath: string): VmseedError {
  return new VmseedError(
    'LIBVIRT_TIMEOUT',
    `libvirt ${operation} did not answer within ${Math.round(ms)} ms on ${socketPath}; libvirtd may be stuck; will retry`,
    { kind: 'retryable' },
  );
}

export function unreachable(socketPath: string, why: string): VmseedError {
  return new VmseedError(
    'LIBVIRT_UNREACHABLE',
    `cannot connect to libvirt at ${socketPath}: ${why}; libvirtd does not answer on this URI (not started yet, or a wrong URI template); will retry`,
    { kind: 'retryable' },
  );
}

/**
 * Dialled through a descriptor of the socket's own inode (socket-hold.ts),
 * so the path cannot be swapped between the check and the connect. A path
 * that does not resolve is LIBVIRT_UNREACHABLE (retried), a refused one
 * LIBVIRT_ACCESS_DENIED (terminal). The caller closes what it returns.
 */
export function holdForDial(socketPath: string, holder: (path: string) => HeldSocket = holdSocket): HeldSocket {
  try {
    return holder(socketPath);
  } catch (e) {
    if (e instanceof VmseedError) throw e;
    throw unreachable(socketPath, (e as NodeJS.ErrnoException).code ?? 'open failed');
  }
}

// An answer that came on a live connection and did not decode: the daemon's
// doing, so the connection is cut rather than asked again (vmseed's own
// argument errors are terminal; the connection's own failures close it).
export function unreadableAnswer(err: unknown, conn: RpcConnection): err is VmseedError {
  return err instanceof VmseedError && err.code === 'LIBVIRT_PROTOCOL' && err.kind === 'retryable' && !conn.closed;
}

export class RpcConnection {
  readonly socketPath: string;
  readonly #socket: Socket;
  readonly #decoder: FrameDecoder;
  readonly #maxFrameBytes: number;
  readonly #pending = new Map<number, Pending>();
  // Serials waiting for a slot, and serials on the wire without a reply
  // (including ones whose caller gave up: libvirtd still counts them).
  readonly #queue: number[] = [];
  readonly #outstanding = new Set<number>();
  readonly #maxInFlight: number;
  readonly #pongWaiters = new Set<() => void>();
  readonly #onEvent: ((p: Packet) => void) | undefined;
  readonly #onClose: ((e: VmseedError | undefined, conn: RpcConnection) => void) | undefined;
  readonly #keepaliveIntervalMs: number;
  readonly #keepaliveTimeoutMs: number;
  #serial = 0;
  #closed = false;
  #lastReceived = now();
  #pingSentAt: number | undefined;
  #keepaliveTimer: NodeJS.Timeout | undefined;
  readonly #frameDeadlineMs: number;
  #frameTimer: NodeJS.Timeout | undefined;
  readonly #eventWindowMs: number;
  readonly #eventsPerWindow: number;
  readonly #floodPerWindow: number;
  #windowStart = now();
  #windowCount = 0;
  #cutReason: CutReason | undefined;
  readonly counters: ConnectionCounters = {
    eventsReceived: 0,
    eventsDropped: 0,
    eventsCoalesced: 0,
    eventNamesTooLong: 0,
  };

  private constructor(socket: Socket, o: RpcConnectionOptions) {
    this.socketPath = o.socketPath;
    this.#socket = socket;
    this.#maxFrameBytes = o.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#decoder = new FrameDecoder(this.#maxFrameBytes, o.memoryBudget ?? new MemoryBudget(), (h, bytes) =>
      this.#screen(h, bytes),
    );
    this.#frameDeadlineMs = o.frameDeadlineMs ?? DEFAULT_FRAME_DEADLINE_MS;
    this.#eventWindowMs = o.eventWindowMs ?? DEFAULT_EVENT_WINDOW_MS;
    this.#eventsPerWindow = o.eventsPerWindow ?? DEFAULT_EVENTS_PER_WINDOW;
    this.#floodPerWindow = o.floodPerWindow ?? DEFAULT_FLOOD_PER_WINDOW;
    this.#onEvent = o.onEvent;
    this.#onClose = o.onClose;
    this.#keepaliveIntervalMs = o.keepaliveIntervalMs ?? 5_000;
    this.#keepaliveTimeoutMs = o.keepaliveTimeoutMs ?? 5_000;
    this.#maxInFlight = o.maxInFlight ?? 4;
    socket.on('data', (chunk: Buffer) => this.#receive(chunk));
    socket.on('error', (e: NodeJS.ErrnoException) => this.destroy(this.#lost(e.code ?? e.message)));
    socket.on('close', () => this.destroy(this.#lost('closed by the daemon')));
    this.#armKeepalive();
  }

  static async open(o: RpcConnectionOptions & { deadline: number }): Promise<RpcConnection> {
    const held = holdForDial(o.socketPath);
    // The message names this bound: by the time the timer fires, no time is left.
    const wait = Math.max(0, o.deadline - now());
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = createConnection({ path: held.path });
      const timer = setTimeout(() => {
        s.destroy();
        reject(timeoutError('connect', wait, o.socketPath));
      }, wait);
      s.once('connect', () => {
        clearTimeout(timer);
        s.removeAllListeners('error');
        resolve(s);
      });
      s.once('error', (e: NodeJS.ErrnoException) => {
        clearTimeout(timer);
        s.destroy();
        if (e.code === 'EACCES' || e.code === 'EPERM') {
          reject(
            new VmseedError(
              'LIBVIRT_ACCESS_DENIED',
              `no permission to connect to ${o.socketPath} (${e.code}); run the agent as the socket's owner or group`,
              { kind: 'terminal', field: 'uri' },
            ),
          );
        } else {
          reject(unreachable(o.socketPath, e.code ?? e.message));
        }
      });
    }).finally(() => held.close());
    return new RpcConnection(socket, o);
  }

  get closed(): boolean {
    return this.#closed;
  }

  // Calls sent or queued whose callers still wait.
  get inFlight(): number {
    return this.#pending.size;
  }

  // Set when vmseed closed the connection because of what the daemon sent.
  get cutReason(): CutReason | undefined {
    return this.#cutReason;
  }

  // Bytes of a partial frame held for this connection.
  get bufferedBytes(): number {
    return this.#decoder.retainedBytes;
  }

  // Closes the connection because of the daemon's behaviour.
  cut(reason: CutReason, error: VmseedError): void {
    if (this.#closed) return;
    this.#cutReason = reason;
    this.destroy(error);
  }

  #lost(why: string): VmseedError {
    return new VmseedError(
      'LIBVIRT_CONNECTION_LOST',
      `connection to libvirt at ${this.socketPath} lost (${why}); a call in flight may or may not have taken effect; will re-read and retry`,
      { kind: 'retryable' },
    );
  }

  // Sends a CALL of the remote program and resolves with the reply payload;
  // an error reply becomes the mapped VmseedError.
  call(proc: number, args: Buffer, deadline: number, operation: string): Promise<Buffer> {
    if (this.#closed) return Promise.reject(this.#lost('already closed'));
    if (4 + HEADER_BYTES + args.length > this.#maxFrameBytes) {
      return Promise.reject(
        new VmseedError(
          'LIBVIRT_PROTOCOL',
          `libvirt ${operation}: arguments of ${args.length} bytes exceed the frame limit of ${this.#maxFrameBytes}`,
          { kind: 'terminal' },
        ),
      );
    }
    this.#serial = (this.#serial + 1) >>> 0;
    const serial = this.#serial;
    return new Promise<Buffer>((resolve, reject) => {
      const wait = Math.max(0, deadline - now());
      const timer = setTimeout(() => {
        this.#pending.delete(serial);
        const queued = this.#queue.indexOf(serial);
        if (queued >= 0) this.#queue.splice(queued, 1);
        reject(timeoutError(operation, wait, this.socketPath));
        // A late reply is dropped by serial; if the daemon is hung, the
        // whole connection goes.
        void this.ping(now() + this.#keepaliveTimeoutMs).catch(() => {});
      }, wait);
      const packet = encodePacket(
        {
          prog: REMOTE_PROGRAM,
          vers: REMOTE_PROTOCOL_VERSION,
          proc,
          type: MessageType.CALL,
          serial,
          status: MessageStatus.OK,
        },
        args,
      );
      this.#pending.set(serial, { operation, packet, resolve, reject, timer });
      this.#queue.push(serial);
      this.#pump();
    });
  }

  #pump(): void {
    while (!this.#closed && this.#outstanding.size < this.#maxInFlight && this.#queue.length > 0) {
      const serial = this.#queue.shift()!;
      const p = this.#pending.get(serial);
      if (!p) continue;
      this.#outstanding.add(serial);
      this.#socket.write(p.packet);
    }
  }

  // A keepalive round trip; tears the connection down when it fails.
  ping(deadline: number): Promise<void> {
    if (this.#closed) return Promise.reject(this.#lost('already closed'));
    return new Promise<void>((resolve, reject) => {
      const done = () => {
        clearTimeout(timer);
        resolve();
      };
      const timer = setTimeout(
        () => {
          this.#pongWaiters.delete(done);
          const e = timeoutError('keepalive', this.#keepaliveTimeoutMs, this.socketPath);
          this.cut('keepalive', this.#lost('no keepalive answer: daemon hung'));
          reject(e);
        },
        Math.max(0, deadline - now()),
      );
      this.#pongWaiters.add(done);
      this.#sendKeepalive(KeepaliveProc.PING);
    });
  }

  #sendKeepalive(proc: number): void {
    if (proc === KeepaliveProc.PING) this.#pingSentAt ??= now();
    this.#socket.write(
      encodePacket({
        prog: KEEPALIVE_PROGRAM,
        vers: KEEPALIVE_PROTOCOL_VERSION,
        proc,
        type: MessageType.MESSAGE,
        serial: 0,
        status: MessageStatus.OK,
      }),
    );
  }

  // Idle connections ping now and then, so a daemon that stopped answering
  // (SIGSTOP, a dead launcher's socket) is noticed before a call needs it.
  #armKeepalive(): void {
    if (this.#keepaliveIntervalMs <= 0) return;
    this.#keepaliveTimer = setInterval(
      () => {
        const t = now();
        if (this.#pingSentAt !== undefined && t - this.#pingSentAt > this.#keepaliveTimeoutMs) {
          this.cut(
            'keepalive',
            this.#lost(`no answer to a keepalive within ${this.#keepaliveTimeoutMs} ms: daemon hung`),
          );
        } else if (this.#pingSentAt === undefined && t - this.#lastReceived >= this.#keepaliveIntervalMs) {
          this.#sendKeepalive(KeepaliveProc.PING);
        }
      },
      Math.min(this.#keepaliveIntervalMs, this.#keepaliveTimeoutMs) / 2,
    );
    this.#keepaliveTimer.unref();
  }

  #receive(chunk: Buffer): void {
    if (this.#closed) return;
    let packets: Packet[];
    try {
      packets = this.#decoder.push(chunk);
    } catch (e) {
      this.cut(this.#decoder.overBudget ? 'memory-budget' : 'protocol', e as VmseedError);
      return;
    }
    // A byte of a frame is no sign of life: a daemon dripping one would
    // otherwise keep the keepalive quiet for ever.
    if (packets.length > 0) {
      this.#lastReceived = now();
      this.#pingSentAt = undefined;
    }
    this.#watchFrame(packets.length > 0);
    for (const p of packets) {
      if (this.#closed) return;
      this.#dispatch(p);
    }
  }

  // Runs the frame deadline while a frame is partial, from the read that
  // began it.
  #watchFrame(completedOne: boolean): void {
    if (!this.#decoder.partial) {
      clearTimeout(this.#frameTimer);
      this.#frameTimer = undefined;
      return;
    }
    if (this.#frameTimer && !completedOne) return;
    clearTimeout(this.#frameTimer);
    this.#frameTimer = setTimeout(() => {
      const len = this.#decoder.pendingFrameBytes;
      const what = len === undefined ? 'frame length word' : `frame of ${len} bytes`;
      this.cut(
        'slow-frame',
        protocolError(`${what} not complete after ${this.#frameDeadlineMs / 1000} s: daemon too slow`),
      );
    }, this.#frameDeadlineMs);
    this.#frameTimer.unref();
  }

  // A reply to a call on the wire (its caller may have given up).
  #solicited(h: Header): boolean {
    return h.prog === REMOTE_PROGRAM && h.type === MessageType.REPLY && this.#outstanding.has(h.serial);
  }

  #screen(h: Header, bytes: number): void {
    if (bytes <= UNSOLICITED_FRAME_MAX || this.#solicited(h)) return;
    throw protocolError(
      `unsolicited frame of ${bytes} bytes (program 0x${h.prog.toString(16)}, procedure ${h.proc}), while no event or keepalive is over ${UNSOLICITED_FRAME_MAX}: daemon misbehaving`,
    );
  }

  // Whether an unsolicited packet is handled: false when it is over the
  // window's rate (dropped) or the connection was cut for flooding.
  #admit(): boolean {
    const t = now();
    if (t - this.#windowStart >= this.#eventWindowMs) {
      this.#windowStart = t;
      this.#windowCount = 0;
    }
    this.#windowCount++;
    this.counters.eventsReceived++;
    if (this.#windowCount > this.#floodPerWindow) {
      this.cut(
        'flood',
        protocolError(
          `more than ${this.#floodPerWindow} unsolicited packets within ${this.#eventWindowMs} ms: daemon flooding`,
        ),
      );
      return false;
    }
    if (this.#windowCount > this.#eventsPerWindow) {
      this.counters.eventsDropped++;
      return false;
    }
    return true;
  }

  #dispatch(p: Packet): void {
    const h = p.header;
    if (h.prog === KEEPALIVE_PROGRAM && h.proc === KeepaliveProc.PONG && this.#pongWaiters.size > 0) {
      for (const w of [...this.#pongWaiters]) {
        this.#pongWaiters.delete(w);
        w();
      }
      return;
    }
    if (!this.#solicited(h) && !this.#admit()) return;
    if (h.prog === KEEPALIVE_PROGRAM) {
      if (h.proc === KeepaliveProc.PING) this.#sendKeepalive(KeepaliveProc.PONG);
      return;
    }
    if (h.prog !== REMOTE_PROGRAM) return;
    if (h.type === MessageType.MESSAGE) {
      try {
        this.#onEvent?.(p);
      } catch {
        // A listener's bug must not take the connection down.
      }
      return;
    }
    if (h.type !== MessageType.REPLY) return;
    if (this.#outstanding.delete(h.serial)) this.#pump();
    const pending = this.#pending.get(h.serial);
    if (!pending) return; // answered after its deadline: the caller has moved on
    this.#pending.delete(h.serial);
    clearTimeout(pending.timer);
    if (h.status === MessageStatus.OK) {
      pending.resolve(p.payload);
      return;
    }
    try {
      pending.reject(mapRemoteError(readRemoteError(p.payload), pending.operation));
    } catch (e) {
      pending.reject(e as VmseedError);
    }
  }

  // Fails every call in flight with `error` and drops the socket.
  destroy(error?: VmseedError): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#keepaliveTimer) clearInterval(this.#keepaliveTimer);
    clearTimeout(this.#frameTimer);
    this.#decoder.dispose();
    const reason = error ?? this.#lost('closed by vmseed');
    for (const [serial, p] of this.#pending) {
      clearTimeout(p.timer);
      this.#pending.delete(serial);
      p.reject(forCall(reason, p.operation));
    }
    this.#queue.length = 0;
    this.#outstanding.clear();
    this.#pongWaiters.clear();
    this.#socket.destroy();
    this.#onClose?.(error, this);
  }
}

// The error a call in flight gets when its connection goes: names the call,
// so the caller (and the status page) sees which one never got its answer.
function forCall(e: VmseedError, operation: string): VmseedError {
  return new LostCallError(operation, e);
}

export class LostCallError extends VmseedError {
  readonly operation: string;
  readonly reason: VmseedError;

  constructor(operation: string, reason: VmseedError) {
    super(reason.code, `libvirt ${operation}: ${reason.message}`, { kind: reason.kind, cause: reason });
    this.operation = operation;
    this.reason = reason;
  }
}
