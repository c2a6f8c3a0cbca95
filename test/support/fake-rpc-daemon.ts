// A scripted libvirt daemon on a real unix socket, speaking libvirt's RPC
// framing (src/libvirt/rpc/protocol.ts): each test decides what every packet
// gets, or that it gets nothing (a hung daemon).
import { createServer, type Server, type Socket } from 'node:net';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import {
  FrameDecoder,
  MessageStatus,
  MessageType,
  REMOTE_PROGRAM,
  RemoteProc,
  encodePacket,
  writeDomain,
  type Packet,
} from '../../src/libvirt/rpc/protocol.ts';
import { XdrWriter } from '../../src/libvirt/rpc/xdr.ts';

export interface Fake {
  path: string;
  server: Server;
  received: Packet[];
  close(): Promise<void>;
}

// `onPacket` answers (or not) each packet the client sends. `at`: the
// socket's path (default: in a directory of its own, removed on close).
export async function fakeDaemon(onPacket: (p: Packet, sock: Socket) => void, at?: string): Promise<Fake> {
  const dir = at === undefined ? mkdtempSync(join(tmpdir(), 'vmseed-rpc-fake-')) : undefined;
  const path = at ?? join(dir!, 'libvirt-sock');
  const received: Packet[] = [];
  const sockets = new Set<Socket>();
  const server = createServer((sock) => {
    sockets.add(sock);
    const d = new FrameDecoder();
    sock.on('data', (c: Buffer) => {
      for (const p of d.push(c)) {
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

export function reply(sock: Socket, p: Packet, payload: Buffer, status: number = MessageStatus.OK): void {
  sock.write(encodePacket({ ...p.header, type: MessageType.REPLY, status }, payload));
}

export function remoteError(code: number, message: string): Buffer {
  return new XdrWriter()
    .i32(code)
    .i32(10)
    .optionalString(message, 1000)
    .i32(2)
    .bool(false)
    .optionalString(null, 1)
    .optionalString(null, 1)
    .optionalString(null, 1)
    .i32(0)
    .i32(0)
    .bool(false)
    .toBuffer();
}

// A lifecycle event (callback 1) for `name`; `event` is virDomainEventType.
export function lifecycleFrame(name: string, uuid: Buffer, event = 0): Buffer {
  return encodePacket(
    {
      prog: REMOTE_PROGRAM,
      vers: 1,
      proc: RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE,
      type: MessageType.MESSAGE,
      serial: 0,
      status: 0,
    },
    writeDomain(new XdrWriter().i32(1), { name, uuid, id: -1 }).i32(event).i32(0).toBuffer(),
  );
}

export function u64(v: bigint): Buffer {
  return new XdrWriter().u64(v).toBuffer();
}

// A daemon that speaks the handshake: AUTH_LIST -> `auth`, OPEN, event
// registration; then sends one lifecycle event. `extra` answers anything
// else it wants to.
export function handshakeDaemon(
  auth: number[],
  extra?: (p: Packet, sock: Socket) => boolean,
  at?: string,
): Promise<Fake> {
  return fakeDaemon((p, sock) => {
    if (extra?.(p, sock)) return;
    switch (p.header.proc) {
      case RemoteProc.AUTH_LIST: {
        const w = new XdrWriter().u32(auth.length);
        for (const a of auth) w.i32(a);
        reply(sock, p, w.toBuffer());
        return;
      }
      case RemoteProc.CONNECT_OPEN:
        reply(sock, p, Buffer.alloc(0));
        return;
      case RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY:
        reply(sock, p, new XdrWriter().i32(p.header.serial).toBuffer());
        sock.write(lifecycleFrame('ns_vm', Buffer.alloc(16, 1)));
        return;
      case RemoteProc.CONNECT_GET_LIB_VERSION:
        reply(sock, p, u64(9_000_000n));
        return;
      case RemoteProc.CONNECT_CLOSE:
        reply(sock, p, Buffer.alloc(0));
        return;
      default:
        reply(sock, p, remoteError(1, 'unexpected'), MessageStatus.ERROR);
    }
  }, at);
}
