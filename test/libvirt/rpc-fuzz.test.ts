// Arbitrary bytes, frames, chunkings and event sequences from a daemon:
// the frame decoder and a session never throw out of the socket handler,
// never hold more than their memory budget, and decode well-formed frames
// the same however the stream is cut.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { Socket } from 'node:net';
import fc from 'fast-check';
import { now } from '../../src/libvirt/rpc/rpc-connection.ts';
import { MemoryBudget } from '../../src/libvirt/rpc/budget.ts';
import {
  FrameDecoder,
  KEEPALIVE_PROGRAM,
  MessageType,
  REMOTE_PROGRAM,
  RemoteProc,
  encodePacket,
  writeDomain,
} from '../../src/libvirt/rpc/protocol.ts';
import { RemoteSession } from '../../src/libvirt/rpc/remote.ts';
import { XdrWriter } from '../../src/libvirt/rpc/xdr.ts';
import { VmseedError } from '../../src/errors.ts';
import { handshakeDaemon, reply } from '../support/fake-rpc-daemon.ts';
import { send, sleep } from '../support/hostile-rpc-daemon.ts';

const MAX_FRAME = 16 * 1024;

const header = fc.record({
  prog: fc.oneof(fc.constant(REMOTE_PROGRAM), fc.constant(KEEPALIVE_PROGRAM), fc.nat()),
  vers: fc.nat(),
  proc: fc.integer({ min: -0x80000000, max: 0x7fffffff }),
  type: fc.nat({ max: 6 }),
  serial: fc.nat(),
  status: fc.nat({ max: 3 }),
});
const packet = fc.record({
  header,
  // XDR data is a whole number of 4-byte units.
  payload: fc
    .nat({ max: 512 })
    .chain((n) => fc.uint8Array({ minLength: 4 * n, maxLength: 4 * n }))
    .map((a) => Buffer.from(a)),
});

// Cuts `stream` at the given points.
function cut(stream: Buffer, points: number[]): Buffer[] {
  const at = [...new Set(points.map((p) => p % (stream.length + 1)))].sort((a, b) => a - b);
  const out: Buffer[] = [];
  let from = 0;
  for (const p of [...at, stream.length]) {
    out.push(stream.subarray(from, p));
    from = p;
  }
  return out;
}

test(
  'fuzz: well-formed frames decode the same whatever the chunking; the decoder holds one frame at most',
  { timeout: 30_000 },
  () => {
    fc.assert(
      fc.property(fc.array(packet, { maxLength: 8 }), fc.array(fc.nat(), { maxLength: 40 }), (packets, points) => {
        const stream = Buffer.concat(packets.map((p) => encodePacket(p.header, p.payload)));
        const budget = new MemoryBudget(MAX_FRAME);
        const d = new FrameDecoder(MAX_FRAME, budget);
        const got = [];
        for (const c of cut(stream, points)) {
          got.push(...d.push(c));
          assert.ok(d.retainedBytes <= MAX_FRAME);
          assert.ok(budget.used <= budget.limit);
        }
        assert.deepEqual(
          got.map((p) => ({ header: { ...p.header }, payload: Buffer.from(p.payload) })),
          packets.map((p) => ({ header: { ...p.header }, payload: Buffer.from(p.payload) })),
        );
        assert.equal(d.partial, false);
        assert.equal(budget.used, 0);
      }),
      { numRuns: 200 },
    );
  },
);

test(
  'fuzz: arbitrary bytes fail only with LIBVIRT_PROTOCOL, within the budget, which is given back',
  { timeout: 30_000 },
  () => {
    fc.assert(
      fc.property(
        fc.array(
          fc.oneof(
            fc.uint8Array({ maxLength: 64 }).map((a) => Buffer.from(a)),
            fc.nat({ max: 2 * MAX_FRAME }).map((n) => new XdrWriter().u32(n).toBuffer()),
          ),
          { maxLength: 30 },
        ),
        fc.nat({ max: 3 * MAX_FRAME }),
        (chunks, limit) => {
          const budget = new MemoryBudget(limit);
          const d = new FrameDecoder(MAX_FRAME, budget);
          try {
            for (const c of chunks) {
              d.push(c);
              assert.ok(budget.used <= budget.limit && d.retainedBytes <= MAX_FRAME);
            }
          } catch (e) {
            assert.ok(e instanceof VmseedError, String(e));
            assert.equal(e.code, 'LIBVIRT_PROTOCOL');
          }
          d.dispose();
          assert.equal(budget.used, 0);
        },
      ),
      { numRuns: 200 },
    );
  },
);

const eventFrame = fc
  .record({
    kind: fc.constantFrom('lifecycle', 'device-removed', 'other'),
    name: fc.oneof(
      fc.string({ maxLength: 12 }),
      fc.nat({ max: 400 }).map((n) => 'n'.repeat(n)),
    ),
    uuid: fc.uint8Array({ minLength: 16, maxLength: 16 }).map((a) => Buffer.from(a)),
    event: fc.integer({ min: -2, max: 12 }),
    alias: fc.oneof(
      fc.constant('ua-vmseed_seed'),
      fc.nat({ max: 300 }).map((n) => 'a'.repeat(n)),
    ),
  })
  .map((e) => {
    const w = writeDomain(new XdrWriter().i32(1), { name: e.name, uuid: e.uuid, id: -1 });
    if (e.kind === 'lifecycle') w.i32(e.event).i32(0);
    else w.string(e.alias, 1024);
    const proc =
      e.kind === 'lifecycle'
        ? RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE
        : e.kind === 'device-removed'
          ? RemoteProc.DOMAIN_EVENT_CALLBACK_DEVICE_REMOVED
          : 400;
    return encodePacket(
      { prog: REMOTE_PROGRAM, vers: 1, proc, type: MessageType.MESSAGE, serial: 0, status: 0 },
      w.toBuffer(),
    );
  });

// What the daemon sends after the handshake: events, arbitrary packets,
// stray replies and garbage, cut anywhere.
const script = fc
  .array(
    fc.oneof(
      { weight: 4, arbitrary: eventFrame },
      { weight: 2, arbitrary: packet.map((p) => encodePacket(p.header, p.payload)) },
      { weight: 1, arbitrary: fc.uint8Array({ maxLength: 40 }).map((a) => Buffer.from(a)) },
    ),
    { maxLength: 12 },
  )
  .chain((frames) => {
    const stream = Buffer.concat(frames);
    return fc.array(fc.nat(), { maxLength: 10 }).map((points) => cut(stream, points));
  });

test(
  'fuzz: a session fed arbitrary frames and event sequences never throws, stays within its budget and gives it back',
  { timeout: 60_000 },
  async () => {
    let play: Buffer[] = [];
    const plays: Array<Promise<void>> = [];
    const fake = await handshakeDaemon([0], (p, sock: Socket) => {
      if (p.header.proc !== RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY) return false;
      reply(sock, p, new XdrWriter().i32(1).toBuffer());
      const chunks = play;
      plays.push(
        (async () => {
          for (const c of chunks) {
            if (sock.destroyed) return;
            await send(sock, c);
            await new Promise((r) => setImmediate(r));
          }
        })(),
      );
      return true;
    });
    const budget = new MemoryBudget(64 * 1024);
    try {
      await fc.assert(
        fc.asyncProperty(script, async (chunks) => {
          play = chunks;
          const events: unknown[] = [];
          const s = await RemoteSession.open({
            socketPath: fake.path,
            name: 'qemu:///session',
            deadline: now() + 5_000,
            maxFrameBytes: MAX_FRAME,
            memoryBudget: budget,
            keepaliveIntervalMs: 0,
            onDomainEvent: (e) => events.push(e),
          });
          try {
            // Garbage read with the reply ends the connection before it.
            await s.registerEvent(0, now() + 5_000).catch((e: unknown) => assert.ok(e instanceof VmseedError));
            await Promise.all(plays.splice(0));
            await sleep(2);
            assert.ok(budget.used <= budget.limit);
            assert.ok(s.cacheBytes <= 1024 * 1024);
            if (s.conn.closed) assert.ok(s.conn.cutReason === undefined || s.conn.cutReason === 'protocol');
          } finally {
            s.conn.destroy();
          }
          assert.equal(budget.used, 0, 'frames and handles given back');
        }),
        { numRuns: 200 },
      );
    } finally {
      await fake.close();
    }
  },
);
