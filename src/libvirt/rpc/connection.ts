// One socket to a libvirt daemon: frames, serials, per-call deadlines and
// keepalive. Calls are pipelined (libvirtd runs several per client at once),
// replies are matched by serial. A call past its deadline fails at once; the
// connection is then probed with a keepalive PING and torn down if the daemon
// does not answer, so a hung daemon costs its callers one deadline, never a
// stuck promise.
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
  type Packet,
} from './protocol.ts';
import { mapRemoteError } from './errors.ts';
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
  // Called once, when the socket is gone (error undefined: closed by us).
  onClose?: (error: VmseedError | undefined) => void;
  // Calls on the wire at once; more wait here. libvirtd stops reading a
  // client with max_client_requests (default 5) calls outstanding, and a
  // keepalive PING it cannot read would look like a hung daemon, so this
  // stays below that.
  maxInFlight?: number;
}

interface Pending {
  operation: string;
  packet: Buffer;
  resolve: (payload: Buffer) => void;
  reject: (e: VmseedError) => void;
  timer: NodeJS.Timeout;
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

// Dialled through a descriptor of the socket's own inode (socket-hold.ts),
// so the path cannot be swapped between the check and the connect.
function hold(socketPath: string): HeldSocket {
  try {
    return holdSocket(socketPath);
  } catch (e) {
    if (e instanceof VmseedError) throw e;
    throw unreachable(socketPath, (e as NodeJS.ErrnoException).code ?? 'open failed');
  }
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
  readonly #onClose: ((e: VmseedError | undefined) => void) | undefined;
  readonly #keepaliveIntervalMs: number;
  readonly #keepaliveTimeoutMs: number;
  #serial = 0;
  #closed = false;
  #lastReceived = now();
  #pingSentAt: number | undefined;
  #keepaliveTimer: NodeJS.Timeout | undefined;

  private constructor(socket: Socket, o: RpcConnectionOptions) {
    this.socketPath = o.socketPath;
    this.#socket = socket;
    this.#maxFrameBytes = o.maxFrameBytes ?? DEFAULT_MAX_FRAME_BYTES;
    this.#decoder = new FrameDecoder(this.#maxFrameBytes);
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
    const held = hold(o.socketPath);
    const socket = await new Promise<Socket>((resolve, reject) => {
      const s = createConnection({ path: held.path });
      const timer = setTimeout(
        () => {
          s.destroy();
          reject(timeoutError('connect', o.deadline - now(), o.socketPath));
        },
        Math.max(0, o.deadline - now()),
      );
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
          this.destroy(this.#lost('no keepalive answer: daemon hung'));
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
          this.destroy(this.#lost(`no answer to a keepalive within ${this.#keepaliveTimeoutMs} ms: daemon hung`));
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
    this.#lastReceived = now();
    this.#pingSentAt = undefined;
    let packets: Packet[];
    try {
      packets = this.#decoder.push(chunk);
    } catch (e) {
      this.destroy(e as VmseedError);
      return;
    }
    for (const p of packets) this.#dispatch(p);
  }

  #dispatch(p: Packet): void {
    const h = p.header;
    if (h.prog === KEEPALIVE_PROGRAM) {
      if (h.proc === KeepaliveProc.PING) this.#sendKeepalive(KeepaliveProc.PONG);
      else if (h.proc === KeepaliveProc.PONG)
        for (const w of [...this.#pongWaiters]) {
          this.#pongWaiters.delete(w);
          w();
        }
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
    const reason = error ?? this.#lost('closed by vmseed');
    for (const [serial, p] of this.#pending) {
      clearTimeout(p.timer);
      this.#pending.delete(serial);
      p.reject(reason);
    }
    this.#queue.length = 0;
    this.#outstanding.clear();
    this.#pongWaiters.clear();
    this.#socket.destroy();
    this.#onClose?.(error);
  }
}
