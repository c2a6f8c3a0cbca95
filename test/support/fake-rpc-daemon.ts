// A scripted libvirt daemon on a real unix socket, speaking libvirt's RPC
// framing with the fakes' own codec (libvirt-wire.ts, written from libvirt's
// .x files, never from vmseed's client): each test decides what every packet
// gets, or that it gets nothing (a hung daemon).
import { createServer, type Server, type Socket } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  Decoder,
  Encoder,
  FrameSplitter,
  KEEPALIVE_PROC,
  PROC,
  PROGRAM,
  STATUS,
  TYPE,
  errorPayload,
  frame,
  unframe,
  type WirePacket,
} from './libvirt-wire.ts';

export interface Fake {
  path: string;
  server: Server;
  received: WirePacket[];
  close(): Promise<void>;
}

// `onPacket` answers (or not) each packet the client sends. `at`: the
// socket's path (default: in a directory of its own, removed on close).
export async function fakeDaemon(onPacket: (p: WirePacket, sock: Socket) => void, at?: string): Promise<Fake> {
  const dir = at === undefined ? mkdtempSync(join(tmpdir(), 'vmseed-rpc-fake-')) : undefined;
  const path = at ?? join(dir!, 'libvirt-sock');
  const received: WirePacket[] = [];
  const sockets = new Set<Socket>();
  const server = createServer((sock) => {
    sockets.add(sock);
    const frames = new FrameSplitter();
    sock.on('data', (c: Buffer) => {
      let whole: Buffer[];
      try {
        whole = frames.push(c);
      } catch {
        // libvirtd drops a client whose length word is out of bounds.
        sock.destroy();
        return;
      }
      for (const f of whole) {
        const p = unframe(f);
        received.push(p);
        onPacket(p, sock);
      }
    });
    sock.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(path, r));
  return {
    path,
    server,
    received,
    close: () =>
      new Promise<void>((r) => {
        for (const s of sockets) s.destroy();
        server.close(() => {
          if (dir !== undefined) rmSync(dir, { recursive: true, force: true });
          r();
        });
      }),
  };
}

export function reply(sock: Socket, p: WirePacket, payload: Buffer, status: number = STATUS.OK): void {
  sock.write(frame({ ...p.header, type: TYPE.REPLY, status }, payload));
}

// A remote_error of virErrorDomain 10 (VIR_FROM_QEMU).
export function remoteError(code: number, message: string): Buffer {
  return errorPayload(code, 10, message);
}

// A lifecycle event (callback 1) for `name`; `event` is virDomainEventType.
export function lifecycleFrame(name: string, uuid: Buffer, event = 0): Buffer {
  return frame(
    {
      prog: PROGRAM.REMOTE,
      vers: 1,
      proc: PROC.DOMAIN_EVENT_CALLBACK_LIFECYCLE,
      type: TYPE.MESSAGE,
      serial: 0,
      status: STATUS.OK,
    },
    new Encoder().int(1).domain({ name, uuid, id: -1 }).int(event).int(0).bytes(),
  );
}

export function u64(v: bigint): Buffer {
  return new Encoder().uhyper(v).bytes();
}

// What libvirtd answers a call whose arguments do not decode
// (virNetMessageDecodePayload: VIR_ERR_RPC from VIR_FROM_RPC).
function undecodable(sock: Socket, p: WirePacket): void {
  reply(sock, p, errorPayload(39, 7, 'Unable to decode message payload'), STATUS.ERROR);
}

// Decodes a call's *_args exactly; false (and the daemon's error reply
// sent) when they do not.
function decodes(sock: Socket, p: WirePacket, read: (d: Decoder) => void): boolean {
  const d = new Decoder(p.payload);
  try {
    read(d);
    d.done(`procedure ${p.header.proc}`);
    return true;
  } catch {
    undecodable(sock, p);
    return false;
  }
}

const noArgs = (): void => {};

// A daemon that speaks the handshake: AUTH_LIST -> `auth`, OPEN, event
// registration; then sends one lifecycle event. `extra` answers anything
// else it wants to. The arguments of the calls it answers are decoded as
// remote_protocol.x lays them out.
export function handshakeDaemon(
  auth: number[],
  extra?: (p: WirePacket, sock: Socket) => boolean,
  at?: string,
): Promise<Fake> {
  return fakeDaemon((p, sock) => {
    if (extra?.(p, sock)) return;
    // A keepalive PING has procedure number 1, as CONNECT_OPEN has: libvirtd
    // tells them apart by program (virkeepaliveprotocol.x) and answers PONG.
    if (p.header.prog === PROGRAM.KEEPALIVE) {
      if (p.header.proc === KEEPALIVE_PROC.PING)
        sock.write(frame({ ...p.header, proc: KEEPALIVE_PROC.PONG, type: TYPE.MESSAGE }, Buffer.alloc(0)));
      return;
    }
    switch (p.header.proc) {
      case PROC.AUTH_LIST: {
        if (!decodes(sock, p, noArgs)) return;
        const w = new Encoder().uint(auth.length);
        for (const a of auth) w.int(a);
        reply(sock, p, w.bytes());
        return;
      }
      case PROC.CONNECT_OPEN:
        // remote_connect_open_args { remote_string name; unsigned int flags; }
        if (
          !decodes(sock, p, (d) => {
            d.maybeString();
            d.uint();
          })
        )
          return;
        reply(sock, p, Buffer.alloc(0));
        return;
      case PROC.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY:
        // { int eventID; remote_domain dom; } -> { int callbackID; }
        if (
          !decodes(sock, p, (d) => {
            d.int();
            d.maybeDomain();
          })
        )
          return;
        reply(sock, p, new Encoder().int(p.header.serial).bytes());
        sock.write(lifecycleFrame('ns_vm', Buffer.alloc(16, 1)));
        return;
      case PROC.CONNECT_GET_LIB_VERSION:
        if (!decodes(sock, p, noArgs)) return;
        reply(sock, p, u64(9_000_000n));
        return;
      case PROC.CONNECT_CLOSE:
        if (!decodes(sock, p, noArgs)) return;
        reply(sock, p, Buffer.alloc(0));
        return;
      default:
        reply(sock, p, remoteError(1, 'unexpected'), STATUS.ERROR);
    }
  }, at);
}
