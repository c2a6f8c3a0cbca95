// A hostile libvirt daemon (a guest that escaped owns its launcher's
// socket) against the RPC client: frames dripped a byte at a time, event
// names of a megabyte, event floods, frames past the memory budget, hung
// replies. The agent's memory and CPU stay bounded, the misbehaving
// connection is cut with a named error and backed off, others go on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Socket } from 'node:net';
import { RpcConnection, now, type CutReason } from '../../src/libvirt/rpc/rpc-connection.ts';
import { FrameDecoder, KEEPALIVE_PROGRAM, RemoteProc, type Packet } from '../../src/libvirt/rpc/protocol.ts';
import { DOMAIN_CACHE_BYTES, DOMAIN_NAME_MAX_BYTES, RemoteSession } from '../../src/libvirt/rpc/remote.ts';
import { ConnectionManager } from '../../src/libvirt/rpc/manager.ts';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';
import { VmseedError } from '../../src/errors.ts';
import { parseDomainXml } from '../../src/libvirt/disk-xml.ts';
import { fakeDaemon, handshakeDaemon, lifecycleFrame, reply } from '../support/fake-rpc-daemon.ts';
import { drip, replyHead, retainedBytes, send, sleep, until } from '../support/hostile-rpc-daemon.ts';
import { XdrWriter } from '../../src/libvirt/rpc/xdr.ts';
import { renderStatusPage, statusJson } from '../../src/http/status-page.ts';
import { sampleSnapshot } from '../support/fake-status.ts';

const MiB = 1024 * 1024;

async function rejection(p: Promise<unknown>): Promise<VmseedError> {
  const e = await p.then(
    () => undefined,
    (err: unknown) => err,
  );
  assert.ok(e instanceof VmseedError, `expected a VmseedError, got ${String(e)}`);
  return e;
}

test(
  'a 4 MiB reply dripped one byte per read: the decoder holds the frame, not a Buffer per byte',
  { timeout: 60_000 },
  () => {
    const d = new FrameDecoder(4 * MiB);
    // Each read of a socket is a Buffer of its own, as here.
    const head = replyHead(1, 4 * MiB);
    const before = retainedBytes();
    for (const b of head) d.push(Buffer.from([b]));
    for (let i = 0; i < 250_000; i++) d.push(Buffer.from([i & 0xff]));
    const held = retainedBytes() - before;
    console.log(`decoder: ${(held / MiB).toFixed(1)} MiB retained after 250,028 one-byte reads of a 4 MiB frame`);
    assert.ok(held < 5 * MiB, `${held} bytes retained for a 4 MiB frame`);
    assert.equal(d.partial, true);
  },
);

test(
  'a reply dripped byte by byte: the call fails when the frame deadline passes, named, and the connection is closed',
  { timeout: 30_000 },
  async () => {
    let dripping: Promise<number> | undefined;
    const fake = await fakeDaemon((p, sock) => {
      if (p.header.prog === KEEPALIVE_PROGRAM) return;
      dripping ??= drip(sock, Buffer.concat([replyHead(p.header.serial, 4 * MiB), Buffer.alloc(4096)]), 5);
    });
    const conn = await RpcConnection.open({ socketPath: fake.path, deadline: now() + 5_000, frameDeadlineMs: 300 });
    try {
      const t0 = Date.now();
      const e = await rejection(conn.call(RemoteProc.DOMAIN_GET_XML_DESC, Buffer.alloc(0), now() + 20_000, 'dumpxml'));
      assert.equal(e.code, 'LIBVIRT_PROTOCOL');
      assert.match(e.message, /dumpxml: .*frame of 4194304 bytes not complete after 0\.3 s: daemon too slow/);
      // Generous for a loaded machine, and still well before the 20 s call deadline.
      assert.ok(Date.now() - t0 < 15_000, 'at the frame deadline, not the call deadline');
      assert.equal(conn.closed, true);
      assert.equal(conn.cutReason, 'slow-frame');
      assert.equal(conn.bufferedBytes, 0, 'the partial frame is let go');
    } finally {
      conn.destroy();
      await fake.close();
    }
  },
);

test(
  'an event dripped after the handshake on a watched URI: cut by the frame deadline, backed off, counted; another URI is served',
  { timeout: 30_000 },
  async () => {
    const drips: Array<Promise<number>> = [];
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc !== RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY || p.header.serial !== 4)
        return false;
      reply(sock, p, new XdrWriter().i32(2).toBuffer());
      drips.push(drip(sock, lifecycleFrame('ns_vm', Buffer.alloc(16, 7)), 10));
      return true;
    });
    const good = await handshakeDaemon([0]);
    const m = new ConnectionManager({
      frameDeadlineMs: 300,
      keepaliveIntervalMs: 60_000,
      backoffInitialMs: 100,
      resolve: (uri) => ({ socketPath: uri === 'hostile' ? fake.path : good.path, name: 'qemu:///session' }),
    });
    try {
      const unwatch = m.watch('hostile');
      assert.ok(
        await until(
          () => (m.stats().connections.find((c) => c.uri === 'hostile')?.cuts['slow-frame'] ?? 0) >= 2,
          10_000,
        ),
        'cut by the frame deadline, twice (reconnected after its backoff)',
      );
      const st = m.stats().connections.find((c) => c.uri === 'hostile')!;
      assert.match(st.lastCut!.message, /frame of \d+ bytes not complete after 0\.3 s: daemon too slow/);
      assert.ok(st.backoffMs >= 400, `backoff grows while cuts repeat (${st.backoffMs} ms)`);
      const v = await m.withSession('good', { deadline: now() + 5_000, idempotent: true }, (s) =>
        s.getLibVersion(now() + 5_000),
      );
      assert.equal(v, 9_000_000n);
      unwatch();
    } finally {
      await m.close();
      await fake.close();
      await good.close();
      await Promise.all(drips);
    }
  },
);

test(
  'a frame dripped with no call in flight is no sign of life: the keepalive still probes and closes',
  { timeout: 30_000 },
  async () => {
    let dripping: Promise<number> | undefined;
    const fake = await fakeDaemon(() => {});
    fake.server.on('connection', (sock: Socket) => {
      dripping = drip(sock, Buffer.concat([replyHead(0, 4 * MiB), Buffer.alloc(4096)]), 20);
    });
    let closed: VmseedError | undefined;
    const conn = await RpcConnection.open({
      socketPath: fake.path,
      deadline: now() + 5_000,
      keepaliveIntervalMs: 150,
      keepaliveTimeoutMs: 150,
      frameDeadlineMs: 60_000,
      onClose: (e) => (closed = e),
    });
    try {
      // The drip goes on for over a minute: a late keepalive timer still cuts it first.
      assert.ok(await until(() => conn.closed, 20_000), 'closed by the keepalive while the drip goes on');
      assert.equal(closed?.code, 'LIBVIRT_CONNECTION_LOST');
      assert.equal(conn.cutReason, 'keepalive');
    } finally {
      conn.destroy();
      await fake.close();
      await dripping;
    }
  },
);

test(
  'events with 1 MiB domain names: the first is refused from its header and the connection cut, before its megabyte is read',
  { timeout: 60_000 },
  async () => {
    const big = (i: number) => `${String(i).padStart(4, '0')}${'x'.repeat(MiB - 64)}`;
    let written = 0;
    let sent: Promise<void> | undefined;
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc === RemoteProc.CONNECT_GET_VERSION) {
        sent = (async () => {
          for (let i = 0; i < 400 && !sock.destroyed; i++) {
            await send(sock, lifecycleFrame(big(i), Buffer.alloc(16, i & 0xff)));
            if (!sock.destroyed) written++;
          }
        })();
      }
      return false;
    });
    const s = await RemoteSession.open({
      socketPath: fake.path,
      name: 'qemu:///session',
      deadline: now() + 5_000,
      eventsPerWindow: 100_000,
      floodPerWindow: 100_000,
    });
    try {
      const e = await rejection(s.getVersion(now() + 20_000));
      assert.equal(e.code, 'LIBVIRT_PROTOCOL');
      assert.match(
        e.message,
        /unsolicited frame of 10485\d\d bytes .*no event or keepalive is over 4096: daemon misbehaving/,
      );
      assert.equal(s.conn.cutReason, 'protocol');
      assert.equal(s.conn.counters.eventsReceived, 0, 'no megabyte event was taken in');
      await sent;
      // What the socket buffers took before the cut, not the 400 MiB.
      assert.ok(written < 32, `${written} frames of 1 MiB written before the cut`);
    } finally {
      s.conn.destroy();
      await fake.close();
    }
  },
);

test(
  '400 defined events with 1 KiB domain names: none cached, all dropped and counted; the cache stays in its byte budget',
  { timeout: 120_000 },
  async () => {
    const long = (i: number) => `${String(i).padStart(4, '0')}${'x'.repeat(1020)}`;
    let sent: Promise<void> | undefined;
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc === RemoteProc.CONNECT_GET_VERSION) {
        sent = (async () => {
          for (let i = 0; i < 400 && !sock.destroyed; i++) {
            await send(sock, lifecycleFrame(long(i), Buffer.alloc(16, i & 0xff)));
          }
          // 5,000 names of the longest real length, to fill the byte budget.
          for (let i = 0; i < 5_000 && !sock.destroyed; i++) {
            const name = `${String(i).padStart(5, '0')}${'n'.repeat(DOMAIN_NAME_MAX_BYTES - 5)}`;
            await send(sock, lifecycleFrame(name, Buffer.alloc(16, 1)));
          }
        })();
      }
      return false;
    });
    let delivered = 0;
    const s = await RemoteSession.open({
      socketPath: fake.path,
      name: 'qemu:///session',
      deadline: now() + 5_000,
      eventsPerWindow: 100_000,
      floodPerWindow: 100_000,
      onDomainEvent: () => delivered++,
    });
    try {
      const before = retainedBytes();
      await s.getVersion(now() + 5_000).catch(() => undefined);
      assert.ok(
        await until(() => s.conn.counters.eventsReceived >= 5_400 || s.conn.closed, 100_000),
        `all events read (${s.conn.counters.eventsReceived})`,
      );
      assert.equal(s.conn.closed, false, `cut: ${s.conn.cutReason}`);
      await sent;
      await sleep(20);
      assert.equal(s.conn.counters.eventNamesTooLong, 400);
      assert.ok(s.cacheBytes <= DOMAIN_CACHE_BYTES, `${s.cacheBytes} bytes of handles`);
      assert.ok(s.knownDomains > 1_000 && s.knownDomains < 5_000, `${s.knownDomains} handles kept`);
      assert.ok(retainedBytes() - before < 8 * MiB, 'no long names held');
      assert.ok(delivered <= 5_000);
    } finally {
      s.conn.destroy();
      await fake.close();
    }
  },
);

test(
  'domain XML over the 1 MiB vmseed reads: refused from its length as DOMAIN_XML_REFUSED on the connection that read it, which stays up',
  { timeout: 30_000 },
  async () => {
    let opens = 0;
    const xml = `<domain><name>ns_vm</name>${'<x/>'.repeat(MiB / 2)}</domain>`;
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc === RemoteProc.AUTH_LIST) opens++;
      if (p.header.proc !== RemoteProc.DOMAIN_GET_XML_DESC) return false;
      reply(sock, p, new XdrWriter().string(xml, 4 * MiB).toBuffer());
      return true;
    });
    const client = new RpcLibvirtClient({
      timeoutMs: 10_000,
      resolve: (uri) => ({ socketPath: fake.path, name: uri }),
    });
    try {
      for (let i = 0; i < 3; i++) {
        const e = await rejection(client.domainXml('qemu:///system', 'ns_vm'));
        assert.equal(e.code, 'DOMAIN_XML_REFUSED');
        assert.match(
          e.message,
          /libvirt returned 2097\d\d\d bytes of XML for domain 'ns_vm', more than the 1048576 vmseed reads/,
        );
      }
      assert.equal(opens, 1, 'connections opened');
      const st = client.stats().connections[0];
      assert.equal(st.connected, true);
      assert.deepEqual(st.cuts, {});
    } finally {
      await client.close();
      await fake.close();
    }
  },
);

test(
  'an answer that does not decode: the connection is cut as a protocol error and the call fails at once, not dialled again until its deadline',
  { timeout: 30_000 },
  async () => {
    let opens = 0;
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc === RemoteProc.AUTH_LIST) opens++;
      if (p.header.proc !== RemoteProc.CONNECT_GET_LIB_VERSION) return false;
      // A hyper and four bytes no reply of this call has.
      reply(sock, p, new XdrWriter().u64(9_000_000n).u32(7).toBuffer());
      return true;
    });
    const m = new ConnectionManager({ resolve: (uri) => ({ socketPath: fake.path, name: uri }) });
    try {
      const t0 = now();
      const e = await rejection(
        m.withSession('qemu:///system', { deadline: now() + 20_000, idempotent: true }, (s) =>
          s.getLibVersion(now() + 20_000),
        ),
      );
      assert.equal(e.code, 'LIBVIRT_PROTOCOL');
      assert.match(e.message, /4 unexpected trailing bytes after get-lib-version reply/);
      assert.equal(opens, 1, 'connections opened');
      assert.ok(now() - t0 < 15_000, `failed after ${(now() - t0).toFixed(0)} ms, not at the deadline`);
      const st = m.stats().connections[0];
      assert.equal(st.cuts.protocol, 1);
      assert.match(st.lastCut!.message, /trailing bytes/);
    } finally {
      await m.close();
      await fake.close();
    }
  },
);

test(
  'an event flood: over the rate the events are dropped, past the flood limit the connection is cut and counted, then backed off',
  { timeout: 60_000 },
  async () => {
    let flooding = true;
    const floods: Array<Promise<void>> = [];
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc !== RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY || p.header.serial !== 4)
        return false;
      reply(sock, p, new XdrWriter().i32(2).toBuffer());
      {
        const burst = Buffer.concat(
          Array.from({ length: 2_000 }, (_, i) => lifecycleFrame(`d${i % 50}`, Buffer.alloc(16, 1), i % 9)),
        );
        floods.push(
          (async () => {
            while (flooding && !sock.destroyed) {
              await send(sock, burst);
              await new Promise((r) => setImmediate(r));
            }
          })(),
        );
      }
      return true;
    });
    const m = new ConnectionManager({
      backoffInitialMs: 100,
      cutBackoffMaxMs: 60_000,
      resolve: (uri) => ({ socketPath: fake.path, name: uri }),
    });
    let delivered = 0;
    m.onEvent((e) => {
      if (e.type === 'lifecycle') delivered++;
    });
    const cpu0 = process.cpuUsage();
    const t0 = Date.now();
    try {
      const unwatch = m.watch('qemu:///session');
      assert.ok(await until(() => (m.stats().connections[0]?.cuts.flood ?? 0) >= 3, 20_000), 'cut three times');
      const st = m.stats().connections[0];
      assert.match(st.lastCut!.message, /more than 10000 unsolicited packets within 2000 ms: daemon flooding/);
      assert.ok(st.eventsReceived >= 30_000);
      assert.ok(st.eventsDropped > 0);
      assert.ok(delivered <= 3 * 1_000 + 100, `${delivered} delivered (at most 1,000 per window and connection)`);
      assert.ok(st.backoffMs >= 800, `backoff ${st.backoffMs} ms grows with each cut`);
      const cpu = process.cpuUsage(cpu0);
      // What the operator sees: the cut, its reason and message, on the page and in status.json.
      const snapshot = { ...sampleSnapshot(), libvirt: m.stats() };
      const html = renderStatusPage(snapshot, { now: new Date() });
      assert.match(html, /<section class="panel" id="libvirt" data-cut="true">/);
      assert.match(html, /flood ×\d+/);
      assert.match(html, /daemon flooding/);
      const json = statusJson(snapshot, undefined, new Date());
      assert.ok((json.libvirt?.connections[0].cuts.flood ?? 0) >= 3);
      console.log(
        `flood: ${st.eventsReceived} received, ${st.eventsDropped} dropped, ${delivered} delivered, ${st.cuts.flood} cuts in ${Date.now() - t0} ms; cpu ${((cpu.user + cpu.system) / 1000).toFixed(0)} ms (daemon included)`,
      );
      unwatch();
    } finally {
      flooding = false;
      await m.close();
      await fake.close();
      await Promise.all(floods);
    }
  },
);

test(
  "frames past the memory budget: the connection asking for more is closed, named; the other's frame completes",
  { timeout: 30_000 },
  async () => {
    const frame = (serial: number) => {
      const f = Buffer.alloc(700 * 1024);
      replyHead(serial, f.length).copy(f);
      return f;
    };
    const held: Array<[Packet, Socket]> = [];
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc === RemoteProc.DOMAIN_GET_XML_DESC) {
        held.push([p, sock]);
        // First 100 bytes of a 700 KiB reply: the rest later.
        sock.write(frame(p.header.serial).subarray(0, 100));
        return true;
      }
      return false;
    });
    const m = new ConnectionManager({
      memoryBudgetBytes: MiB,
      resolve: (uri) => ({ socketPath: fake.path, name: uri }),
    });
    const xml = (uri: string) =>
      m.withSession(uri, { deadline: now() + 10_000, idempotent: false }, (s) =>
        s.conn.call(RemoteProc.DOMAIN_GET_XML_DESC, Buffer.alloc(0), now() + 10_000, `dumpxml on ${uri}`),
      );
    try {
      const a = xml('a');
      a.catch(() => {});
      assert.ok(await until(() => held.length === 1 && m.stats().memoryBudget.used >= 700 * 1024, 5_000));
      const e = await rejection(xml('b'));
      assert.equal(e.code, 'LIBVIRT_PROTOCOL');
      assert.match(e.message, /frame of 716800 bytes does not fit the libvirt memory budget/);
      assert.equal(m.stats().connections.find((c) => c.uri === 'b')?.cuts['memory-budget'], 1);
      const [p, sock] = held[0];
      sock.write(frame(p.header.serial).subarray(100));
      assert.equal((await a).length, 700 * 1024 - 28);
      const cached = m.stats().connections.reduce((n, c) => n + c.cacheBytes, 0);
      assert.equal(m.stats().memoryBudget.used, cached, 'the frame is given back; cached handles stay');
    } finally {
      await m.close();
      await fake.close();
    }
  },
);

test(
  'a reply that hangs until the connection dies: the error names that call and its real timeout, not the reconnect',
  { timeout: 30_000 },
  async () => {
    let opened = 0;
    const fake = await handshakeDaemon([0], (p) => {
      if (p.header.proc === RemoteProc.AUTH_LIST) opened++;
      // The second connection hangs from its first call, the first from the XML.
      if (opened > 1) return true;
      return p.header.proc === RemoteProc.DOMAIN_GET_XML_DESC || p.header.prog === KEEPALIVE_PROGRAM;
    });
    const client = new RpcLibvirtClient({
      timeoutMs: 1_500,
      keepaliveIntervalMs: 100,
      keepaliveTimeoutMs: 200,
      resolve: (uri) => ({ socketPath: fake.path, name: uri }),
    });
    try {
      const e = await rejection(client.domainXml('qemu:///system', 'ns_vm'));
      assert.equal(e.code, 'LIBVIRT_TIMEOUT');
      assert.match(e.message, /^libvirt dumpxml 'ns_vm' got no answer within 1[45]\d\d ms: .*daemon hung/);
    } finally {
      await client.close();
      await fake.close();
    }
  },
);

test(
  "domain XML with a DOCTYPE read over RPC: refused with the XML reader's code, not a virsh one",
  { timeout: 30_000 },
  async () => {
    const doctype = '<!DOCTYPE d [<!ENTITY x "y">]><domain><name>&x;</name></domain>';
    const fake = await handshakeDaemon([0], (p, sock) => {
      if (p.header.proc !== RemoteProc.DOMAIN_GET_XML_DESC) return false;
      reply(sock, p, new XdrWriter().string(doctype, 1024).toBuffer());
      return true;
    });
    const client = new RpcLibvirtClient({ resolve: (uri) => ({ socketPath: fake.path, name: uri }) });
    try {
      const xml = await client.domainXml('qemu:///system', 'ns_vm');
      const e = (() => {
        try {
          parseDomainXml(xml);
        } catch (err) {
          return err;
        }
      })();
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'DOMAIN_XML_REFUSED');
      assert.doesNotMatch(e.message, /virsh/);
      assert.match(e.message, /DOCTYPE/);
    } finally {
      await client.close();
      await fake.close();
    }
  },
);

// What a daemon does to its first call (AUTH_LIST), before any session is up.
const HANDSHAKE_ATTACKS: Array<{
  reason: CutReason;
  what: string;
  message: RegExp;
  attack: (p: Packet, sock: Socket) => void;
}> = [
  {
    reason: 'flood',
    what: 'a flood of events instead of the answer',
    message: /more than 500 unsolicited packets within 2000 ms: daemon flooding/,
    attack: (_p, sock) => sock.write(Buffer.concat(Array.from({ length: 600 }, () => lifecycleFrame('ns_vm', UUID)))),
  },
  {
    reason: 'slow-frame',
    what: 'the answer dripped',
    message: /frame of \d+ bytes not complete after 0\.2 s: daemon too slow/,
    // The length word at once, the rest dripped: the cut names the frame's
    // length however slowly a loaded machine runs the drip.
    attack: (p, sock) => {
      const head = replyHead(p.header.serial, 4096);
      sock.write(head.subarray(0, 4));
      void drip(sock, head.subarray(4), 20);
    },
  },
  {
    reason: 'memory-budget',
    what: 'an answer announcing more than the memory budget',
    message: /frame of 2097152 bytes does not fit the libvirt memory budget/,
    attack: (p, sock) => sock.write(replyHead(p.header.serial, 2 * MiB)),
  },
  {
    reason: 'protocol',
    what: 'an answer that does not decode',
    message: /auth list of 1000 entries/,
    attack: (p, sock) => reply(sock, p, new XdrWriter().u32(1000).toBuffer()),
  },
  {
    reason: 'protocol',
    what: 'a 1 MiB event instead of the answer',
    message: /unsolicited frame of 10486\d\d bytes/,
    attack: (_p, sock) => sock.write(lifecycleFrame('x'.repeat(MiB), UUID)),
  },
  {
    reason: 'protocol',
    what: 'an answer announcing more than the frame limit',
    message: /frame of 8388608 bytes exceeds the limit of 4194304/,
    attack: (p, sock) => sock.write(replyHead(p.header.serial, 8 * MiB)),
  },
];
const UUID = Buffer.alloc(16, 3);

for (const h of HANDSHAKE_ATTACKS) {
  test(
    `cut during the handshake (${h.what}): counted as a ${h.reason} cut on the status page, backed off, and a call does not retry it`,
    { timeout: 30_000 },
    async () => {
      let opens = 0;
      const fake = await fakeDaemon((p, sock) => {
        if (p.header.proc !== RemoteProc.AUTH_LIST) return;
        opens++;
        h.attack(p, sock);
      });
      const m = new ConnectionManager({
        frameDeadlineMs: 200,
        eventsPerWindow: 100,
        floodPerWindow: 500,
        memoryBudgetBytes: MiB,
        backoffInitialMs: 100,
        resolve: (uri) => ({ socketPath: fake.path, name: uri }),
      });
      try {
        const unwatch = m.watch('watched');
        const cuts = () => m.stats().connections.find((c) => c.uri === 'watched')?.cuts[h.reason] ?? 0;
        assert.ok(await until(() => cuts() >= 2, 10_000), `cut twice while opening (${cuts()})`);
        const st = m.stats().connections.find((c) => c.uri === 'watched')!;
        assert.equal(st.connected, false);
        assert.match(st.lastCut!.message, h.message);
        assert.ok(st.backoffMs >= 400, `backoff grows with each cut (${st.backoffMs} ms)`);
        if (h.reason === 'flood') assert.ok(st.eventsReceived >= 1_000, `${st.eventsReceived} events counted`);
        unwatch();
        const html = renderStatusPage({ ...sampleSnapshot(), libvirt: m.stats() }, { now: new Date() });
        assert.match(html, new RegExp(`${h.reason} ×\\d+`));

        // A call on another URI of the same daemon: one connection, cut,
        // and the call fails with it rather than dialling again until its
        // deadline.
        const before = opens;
        const e = await rejection(
          m.withSession('called', { deadline: now() + 20_000, idempotent: true }, (s) =>
            s.getLibVersion(now() + 20_000),
          ),
        );
        assert.match(e.message, h.message);
        assert.equal(opens - before, 1, 'connections the call opened');
        assert.equal(m.stats().connections.find((c) => c.uri === 'called')?.cuts[h.reason], 1);
      } finally {
        await m.close();
        await fake.close();
      }
    },
  );
}
