// The RPC connection's transport rules against a scripted server on a real
// unix socket: reply matching by serial, error replies, deadlines, the
// keepalive probe that tears down a hung connection, frame limits, and the
// session handshake (auth, open, events).
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import { type Socket } from 'node:net';
import { mkdtempSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { RpcConnection, now } from '../../src/libvirt/rpc/rpc-connection.ts';
import { RemoteSession } from '../../src/libvirt/rpc/remote.ts';
import { ConnectionManager } from '../../src/libvirt/rpc/manager.ts';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';
import { XdrReader } from '../../src/libvirt/rpc/xdr.ts';
import {
  KEEPALIVE_PROGRAM,
  KeepaliveProc,
  MessageStatus,
  MessageType,
  REMOTE_PROGRAM,
  RemoteProc,
  encodePacket,
  writeDomain,
  type Packet,
  type DomainEventMessage,
} from '../../src/libvirt/rpc/protocol.ts';
import { XdrWriter } from '../../src/libvirt/rpc/xdr.ts';
import { VmseedError } from '../../src/errors.ts';
import { fakeDaemon, handshakeDaemon, remoteError, reply, u64 } from '../support/fake-rpc-daemon.ts';

const dir = mkdtempSync(join(tmpdir(), 'vmseed-rpc-conn-'));
after(() => rmSync(dir, { recursive: true, force: true }));

async function rejection(p: Promise<unknown>): Promise<VmseedError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  assert.ok(e instanceof VmseedError, `expected a VmseedError, got ${String(e)}`);
  return e;
}

test('replies are matched by serial, whatever their order; an error reply becomes its code', async () => {
  const held: Array<[Packet, Socket]> = [];
  const fake = await fakeDaemon((p, sock) => {
    held.push([p, sock]);
    if (held.length === 3) {
      // answer in reverse order
      const [c, b, a] = [held[2], held[1], held[0]];
      reply(c[1], c[0], remoteError(42, "Domain not found: no domain with matching name 'c'"), MessageStatus.ERROR);
      reply(b[1], b[0], u64(2n));
      reply(a[1], a[0], u64(1n));
    }
  });
  const conn = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000 });
  try {
    const d = now() + 5_000;
    const [a, b, c] = [
      conn.call(157, Buffer.alloc(0), d, 'a'),
      conn.call(157, Buffer.alloc(0), d, 'b'),
      conn.call(157, Buffer.alloc(0), d, 'c'),
    ];
    assert.deepEqual(await a, u64(1n));
    assert.deepEqual(await b, u64(2n));
    const e = await rejection(c);
    assert.equal(e.code, 'DOMAIN_NOT_FOUND');
    assert.deepEqual(
      fake.received.map((p) => p.header.serial),
      [1, 2, 3],
    );
    assert.ok(fake.received.every((p) => p.header.prog === REMOTE_PROGRAM && p.header.type === MessageType.CALL));
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test('a daemon that stops answering: the call fails at its deadline, the keepalive probe goes unanswered, the connection is torn down', async () => {
  const fake = await fakeDaemon(() => {});
  let closedWith: VmseedError | undefined;
  const conn = await RpcConnection.open({
    socketPath: fake.path,
    deadline: now() + 5_000,
    keepaliveIntervalMs: 0,
    keepaliveTimeoutMs: 200,
    onClose: (e) => {
      closedWith = e;
    },
  });
  try {
    const other = conn.call(157, Buffer.alloc(0), now() + 60_000, 'other');
    const e = await rejection(conn.call(157, Buffer.alloc(0), now() + 100, 'get-lib-version'));
    assert.equal(e.code, 'LIBVIRT_TIMEOUT');
    assert.equal(e.kind, 'retryable');
    // The slow call still pending goes with the connection.
    const e2 = await rejection(other);
    assert.equal(e2.code, 'LIBVIRT_CONNECTION_LOST');
    assert.equal(conn.closed, true);
    assert.equal(closedWith?.code, 'LIBVIRT_CONNECTION_LOST');
    assert.ok(fake.received.some((p) => p.header.prog === KEEPALIVE_PROGRAM && p.header.proc === KeepaliveProc.PING));
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test('a slow call on a live daemon: it times out alone, the connection stays (PONG), a late reply is dropped', async () => {
  let slow: [Packet, Socket] | undefined;
  const fake = await fakeDaemon((p, sock) => {
    if (p.header.prog === KEEPALIVE_PROGRAM) {
      sock.write(encodePacket({ ...p.header, proc: KeepaliveProc.PONG }));
      return;
    }
    if (p.header.serial === 1) {
      slow = [p, sock];
      return;
    }
    reply(sock, p, u64(BigInt(p.header.serial)));
  });
  const conn = await RpcConnection.open({
    socketPath: fake.path,
    deadline: now() + 5_000,
    keepaliveIntervalMs: 0,
    keepaliveTimeoutMs: 2_000,
  });
  try {
    assert.equal((await rejection(conn.call(157, Buffer.alloc(0), now() + 100, 'slow'))).code, 'LIBVIRT_TIMEOUT');
    await conn.ping(now() + 2_000);
    reply(slow![1], slow![0], u64(99n)); // late
    assert.deepEqual(await conn.call(157, Buffer.alloc(0), now() + 2_000, 'next'), u64(2n));
    assert.equal(conn.closed, false);
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test('at most maxInFlight calls on the wire, the rest wait their turn; a keepalive still gets through', async () => {
  const held: Array<[Packet, Socket]> = [];
  const fake = await fakeDaemon((p, sock) => {
    if (p.header.prog === KEEPALIVE_PROGRAM) sock.write(encodePacket({ ...p.header, proc: KeepaliveProc.PONG }));
    else held.push([p, sock]);
  });
  const conn = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000, maxInFlight: 4 });
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  try {
    const calls = Array.from({ length: 10 }, () => conn.call(157, Buffer.alloc(0), now() + 10_000, 'v'));
    // The PING goes out after the ten calls; its PONG proves the daemon
    // read everything sent so far: four calls.
    await conn.ping(now() + 2_000);
    const onWire: number = held.length;
    assert.equal(onWire, 4);
    for (let answered = 0; answered < 10; answered++) {
      for (let i = 0; i < 2000 && held.length === 0; i++) await sleep(5);
      const [p, sock] = held.shift()!;
      reply(sock, p, u64(BigInt(p.header.serial)));
    }
    assert.deepEqual(
      await Promise.all(calls),
      Array.from({ length: 10 }, (_, i) => u64(BigInt(i + 1))),
    );
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test("the daemon's keepalive PING is answered with a PONG", async () => {
  let pong: () => void;
  const ponged = new Promise<void>((r) => {
    pong = r;
  });
  const fake = await fakeDaemon((p) => {
    if (p.header.prog === KEEPALIVE_PROGRAM && p.header.proc === KeepaliveProc.PONG) pong();
  });
  fake.server.on('connection', (sock) =>
    sock.write(
      encodePacket({
        prog: KEEPALIVE_PROGRAM,
        vers: 1,
        proc: KeepaliveProc.PING,
        type: MessageType.MESSAGE,
        serial: 0,
        status: 0,
      }),
    ),
  );
  const conn = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000 });
  try {
    await ponged;
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test('a frame over the limit drops the connection with LIBVIRT_PROTOCOL', async () => {
  const fake = await fakeDaemon((p, sock) => reply(sock, p, Buffer.alloc(64 * 1024)));
  const conn = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000, maxFrameBytes: 4096 });
  try {
    assert.equal((await rejection(conn.call(14, Buffer.alloc(0), now() + 5_000, 'dumpxml'))).code, 'LIBVIRT_PROTOCOL');
    assert.equal(conn.closed, true);
    // Arguments over the limit never leave the process.
    const conn2 = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000, maxFrameBytes: 4096 });
    assert.equal(
      (await rejection(conn2.call(160, Buffer.alloc(8192), now() + 5_000, 'attach'))).code,
      'LIBVIRT_PROTOCOL',
    );
    conn2.destroy();
  } finally {
    conn.destroy();
    await fake.close();
  }
});

test('a connect that does not complete in time names the bound it was given, not the time left', async () => {
  const fake = await fakeDaemon(() => {});
  try {
    const opening = rejection(RpcConnection.open({ socketPath: fake.path, deadline: now() + 200 }));
    // The loop is held past the bound before it can see the connect
    // complete; timers run before I/O in a loop turn, so the bound fires
    // first, whatever the machine's load.
    const until = now() + 400;
    while (now() < until);
    const e = await opening;
    assert.equal(e.code, 'LIBVIRT_TIMEOUT');
    const ms = Number(/^libvirt connect did not answer within (-?\d+) ms on /.exec(e.message)?.[1]);
    // What was left of the 200 ms when the connect began (opening the
    // socket's path took a little of it).
    assert.ok(ms > 100 && ms <= 200, e.message);
  } finally {
    await fake.close();
  }
});

test('only a real socket is dialled: a missing path is LIBVIRT_UNREACHABLE, a symlink or a file LIBVIRT_ACCESS_DENIED', async () => {
  const fake = await fakeDaemon(() => {});
  try {
    const link = join(dir, 'link.sock');
    symlinkSync(fake.path, link);
    const file = join(dir, 'file.sock');
    writeFileSync(file, '');
    const open = (socketPath: string) => rejection(RpcConnection.open({ socketPath, deadline: now() + 2_000 }));
    assert.equal((await open(join(dir, 'missing.sock'))).code, 'LIBVIRT_UNREACHABLE');
    assert.equal((await open(link)).code, 'LIBVIRT_ACCESS_DENIED');
    assert.equal((await open(file)).code, 'LIBVIRT_ACCESS_DENIED');
  } finally {
    await fake.close();
  }
});

test('session: auth none, open with the URI name, events delivered', async () => {
  const fake = await handshakeDaemon([0]);
  const events: DomainEventMessage[] = [];
  const s = await RemoteSession.open({
    socketPath: fake.path,
    name: 'qemu:///session',
    deadline: now() + 5_000,
    onDomainEvent: (e) => events.push(e),
  });
  try {
    const open = fake.received.find((p) => p.header.proc === RemoteProc.CONNECT_OPEN)!;
    assert.deepEqual(open.payload, new XdrWriter().optionalString('qemu:///session', 100).u32(0).toBuffer());
    await s.registerEvent(0, now() + 5_000);
    for (let i = 0; i < 1000 && events.length === 0; i++) await new Promise((r) => setTimeout(r, 10));
    assert.equal(events[0]?.kind, 'lifecycle');
    assert.equal(events[0]?.kind === 'lifecycle' && events[0].event, 'defined');
  } finally {
    s.conn.destroy();
    await fake.close();
  }
});

test('session: a daemon that only offers SASL is refused with LIBVIRT_ACCESS_DENIED, and the socket is closed', async () => {
  const fake = await handshakeDaemon([1]);
  try {
    const e = await rejection(
      RemoteSession.open({ socketPath: fake.path, name: 'qemu:///system', deadline: now() + 5_000 }),
    );
    assert.equal(e.code, 'LIBVIRT_ACCESS_DENIED');
    assert.equal(
      fake.received.some((p) => p.header.proc === RemoteProc.CONNECT_OPEN),
      false,
    );
  } finally {
    await fake.close();
  }
});

test('manager: one connection per URI, closed with CONNECT_CLOSE once idle; a watched URI stays open', async () => {
  const fake = await handshakeDaemon([0]);
  // Idle for 2 s: the three calls finish within it even when a loaded
  // machine spreads them out (both connections are counted open below).
  const m = new ConnectionManager({ idleMs: 2000, resolve: (uri) => ({ socketPath: fake.path, name: uri }) });
  const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));
  try {
    const call = (uri: string) =>
      m.withSession(uri, { deadline: now() + 5_000, idempotent: true }, (s) => s.getLibVersion(now() + 5_000));
    assert.deepEqual(await Promise.all([call('qemu:///system'), call('qemu:///system'), call('qemu:///session')]), [
      9_000_000n,
      9_000_000n,
      9_000_000n,
    ]);
    assert.equal(m.openCount, 2);
    // Calls of the remote program only: a keepalive PING and PONG (procedures
    // 1 and 2 of their own program) share CONNECT_OPEN's and CONNECT_CLOSE's
    // numbers, and a session quiet for 5 s (a loaded machine stretches the
    // waits below) sends them.
    const calls = (proc: number) =>
      fake.received.filter((p) => p.header.prog === REMOTE_PROGRAM && p.header.proc === proc).length;
    assert.equal(calls(RemoteProc.CONNECT_OPEN), 2);
    const unwatch = m.watch('qemu:///session');
    const closes = () => calls(RemoteProc.CONNECT_CLOSE);
    // (The CONNECT_CLOSE reaches the daemon a moment after the count drops.)
    for (let i = 0; i < 1500 && (m.openCount > 1 || closes() < 1); i++) await sleep(20);
    assert.equal(m.openCount, 1);
    assert.equal(m.connected('qemu:///session'), true);
    assert.equal(closes(), 1);
    unwatch();
    for (let i = 0; i < 1500 && (m.openCount > 0 || closes() < 2); i++) await sleep(20);
    assert.equal(m.openCount, 0);
    assert.equal(closes(), 2);
  } finally {
    await m.close();
    await fake.close();
  }
});

test("client: mutations of one domain never overlap; other domains' do", async () => {
  const inFlight = new Map<string, number>();
  let maxSame = 0;
  let maxTotal = 0;
  const fake = await handshakeDaemon([0], (p, sock) => {
    if (p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME) {
      const name = new XdrReader(p.payload).string(1000);
      reply(sock, p, writeDomain(new XdrWriter(), { name, uuid: Buffer.alloc(16), id: 1 }).toBuffer());
      return true;
    }
    if (p.header.proc === RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS) {
      const name = new XdrReader(p.payload).string(1000);
      inFlight.set(name, (inFlight.get(name) ?? 0) + 1);
      maxSame = Math.max(maxSame, ...inFlight.values());
      maxTotal = Math.max(
        maxTotal,
        [...inFlight.values()].reduce((a, b) => a + b, 0),
      );
      setTimeout(() => {
        inFlight.set(name, inFlight.get(name)! - 1);
        reply(sock, p, Buffer.alloc(0));
      }, 30);
      return true;
    }
    return false;
  });
  const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }) });
  try {
    const attach = (d: string) => client.attachDevice('qemu:///system', d, '<disk/>', { live: true, config: false });
    await Promise.all([attach('a'), attach('a'), attach('a'), attach('b'), attach('b')]);
    assert.equal(maxSame, 1);
    assert.equal(maxTotal, 2);
    assert.equal(fake.received.filter((p) => p.header.proc === RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS).length, 5);
  } finally {
    await client.close();
    await fake.close();
  }
});

// libvirtd finds the domain of a call by the handle's UUID (remote.c
// get_nonnull_domain, then the driver's FindByUUID), not by its name: the
// fake does the same, so a remembered handle of a redefined domain fails
// like it would on the real daemon.
test("client: a domain's handle is looked up once per session and reused; a stale one (redefined, new UUID) is looked up again and the attach happens once", async () => {
  const uuids = new Map<string, Buffer>([['a', Buffer.alloc(16, 0xa1)]]);
  const attached: string[] = [];
  let daemonSock: Socket | undefined;
  const byUuid = (p: Packet) => {
    const r = new XdrReader(p.payload);
    const name = r.string(1000);
    const uuid = r.fixedOpaque(16);
    return uuids.get(name)?.equals(uuid) ? name : undefined;
  };
  const fake = await handshakeDaemon([0], (p, sock) => {
    daemonSock = sock;
    switch (p.header.proc) {
      case RemoteProc.DOMAIN_LOOKUP_BY_NAME: {
        const name = new XdrReader(p.payload).string(1000);
        const uuid = uuids.get(name);
        if (!uuid)
          reply(
            sock,
            p,
            remoteError(42, `Domain not found: no domain with matching name '${name}'`),
            MessageStatus.ERROR,
          );
        else reply(sock, p, writeDomain(new XdrWriter(), { name, uuid, id: 1 }).toBuffer());
        return true;
      }
      case RemoteProc.DOMAIN_GET_STATE:
      case RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS: {
        const name = byUuid(p);
        if (name === undefined) {
          reply(sock, p, remoteError(42, 'Domain not found: no domain with matching uuid'), MessageStatus.ERROR);
        } else if (p.header.proc === RemoteProc.DOMAIN_GET_STATE) {
          reply(sock, p, new XdrWriter().i32(3).i32(0).toBuffer());
        } else {
          attached.push(`${name}:${uuids.get(name)!.toString('hex').slice(0, 2)}`);
          reply(sock, p, Buffer.alloc(0));
        }
        return true;
      }
      case RemoteProc.DOMAIN_IS_PERSISTENT:
        reply(sock, p, new XdrWriter().i32(byUuid(p) ? 1 : 0).toBuffer());
        return true;
    }
    return false;
  });
  const lifecycle = (name: string, uuid: Buffer, event: number) =>
    daemonSock!.write(
      encodePacket(
        {
          prog: REMOTE_PROGRAM,
          vers: 1,
          proc: RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE,
          type: MessageType.MESSAGE,
          serial: 0,
          status: 0,
        },
        writeDomain(new XdrWriter().i32(1), { name, uuid, id: -1 }).i32(event).i32(0).toBuffer(),
      ),
    );
  const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }) });
  const U = 'qemu:///system';
  const lookups = () => fake.received.filter((p) => p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME).length;
  const sent = (proc: number) => fake.received.filter((p) => p.header.proc === proc).length;
  const attach = () => client.attachDevice(U, 'a', '<disk/>', { live: true, config: false });
  try {
    assert.equal((await client.domainInfo(U, 'a')).state, 'paused');
    await attach();
    await client.domainInfo(U, 'a');
    assert.equal(lookups(), 1, 'one lookup for three calls');
    // Redefined behind our back, no event yet: the old UUID finds nothing.
    uuids.set('a', Buffer.alloc(16, 0xa2));
    await attach();
    assert.equal(lookups(), 2);
    assert.equal(sent(RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS), 3, 'the stale attempt, then the one that took');
    assert.deepEqual(attached, ['a:a1', 'a:a2']);
    // An `undefined` event drops the handle: the next call looks up first
    // instead of failing once. (A call after the event is answered after
    // it on the same socket, so the client has read the event by then.)
    lifecycle('a', Buffer.alloc(16, 0xa2), 1);
    await client.version(U);
    uuids.set('a', Buffer.alloc(16, 0xa3));
    await attach();
    assert.equal(sent(RemoteProc.DOMAIN_ATTACH_DEVICE_FLAGS), 4, 'no failed attempt');
    assert.equal(lookups(), 3);
    // A `defined` event hands over the new handle: no lookup at all.
    uuids.set('a', Buffer.alloc(16, 0xa4));
    lifecycle('a', Buffer.alloc(16, 0xa4), 0);
    await client.version(U);
    await attach();
    assert.equal(lookups(), 3);
    assert.deepEqual(attached, ['a:a1', 'a:a2', 'a:a3', 'a:a4']);
    // A name libvirt does not know: DOMAIN_NOT_FOUND, as before.
    const e = await rejection(client.domainInfo(U, 'nope'));
    assert.equal(e.code, 'DOMAIN_NOT_FOUND');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('client: the stop signal ends calls in flight and calls waiting their turn with CANCELLED at once; later calls are not sent', async () => {
  const fake = await handshakeDaemon([0], (p) => p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME); // never answered
  const stop = new AbortController();
  const client = new RpcLibvirtClient({
    resolve: (uri) => ({ socketPath: fake.path, name: uri }),
    cancel: stop.signal,
    timeoutMs: 600_000,
  });
  const U = 'qemu:///system';
  try {
    const read = client.domainInfo(U, 'a');
    const first = client.attachDevice(U, 'a', '<disk/>', { live: true, config: false });
    const queued = client.attachDevice(U, 'a', '<disk/>', { live: true, config: false });
    for (
      let i = 0;
      i < 1000 && fake.received.filter((p) => p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME).length < 2;
      i++
    )
      await new Promise((r) => setTimeout(r, 10));
    const t0 = Date.now();
    stop.abort();
    for (const p of [read, first, queued]) assert.equal((await rejection(p)).code, 'CANCELLED');
    assert.ok(Date.now() - t0 < 30_000, 'at once, not at the 600 s deadline');
    const sent = fake.received.length;
    assert.equal((await rejection(client.version(U))).code, 'CANCELLED');
    assert.equal(fake.received.length, sent, 'nothing sent after the stop');
  } finally {
    await client.close();
    await fake.close();
  }
});

test("client: a call's own signal (its reconcile's) ends it with the signal's reason; other calls and the connection carry on", async () => {
  const fake = await handshakeDaemon([0], (p) => p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME); // never answered
  const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }), timeoutMs: 600_000 });
  const U = 'qemu:///system';
  try {
    const gone = new AbortController();
    const hung = client.attachDevice(U, 'a', '<disk/>', { live: true, config: false, signal: gone.signal });
    const other = client.domainInfo(U, 'b');
    let otherSettled = false;
    other.then(
      () => (otherSettled = true),
      () => (otherSettled = true),
    );
    for (
      let i = 0;
      i < 1000 && fake.received.filter((p) => p.header.proc === RemoteProc.DOMAIN_LOOKUP_BY_NAME).length < 2;
      i++
    )
      await new Promise((r) => setTimeout(r, 10));
    const reason = new VmseedError('CANCELLED', 'VMI default/a was deleted', { kind: 'retryable' });
    gone.abort(reason);
    assert.equal(await rejection(hung), reason);
    assert.equal(await client.version(U), '9.0.0', 'the connection still serves');
    assert.equal(otherSettled, false, "a call without that signal still waits for libvirt's answer");
    const sent = fake.received.length;
    assert.equal(
      await rejection(client.resume(U, 'a', { signal: gone.signal })),
      reason,
      'a call given an aborted signal',
    );
    assert.equal(fake.received.length, sent, 'is not sent');
  } finally {
    await client.close();
    await fake.close();
  }
});

test('manager: close() ends a call that is backing off while libvirtd is away, long before its deadline', async () => {
  const fake = await handshakeDaemon([0]);
  const path = fake.path;
  await fake.close(); // the socket is gone: every connect fails
  const m = new ConnectionManager({
    backoffInitialMs: 200,
    backoffMaxMs: 200,
    resolve: (uri) => ({ socketPath: path, name: uri }),
  });
  const call = m.withSession('qemu:///system', { deadline: now() + 600_000, idempotent: true }, (s) =>
    s.getLibVersion(now() + 600_000),
  );
  await new Promise((r) => setTimeout(r, 300));
  const t0 = Date.now();
  await m.close();
  const e = await rejection(call);
  assert.equal(e.code, 'LIBVIRT_CONNECTION_LOST');
  // Far from the 600 s deadline; generous for a loaded machine.
  assert.ok(Date.now() - t0 < 30_000, `ended by close, after ${Date.now() - t0} ms`);
});
