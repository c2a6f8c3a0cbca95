// XDR, framing, libvirt structs, error mapping and URI resolution of the RPC
// client, without a daemon (e2e/libvirt-rpc*.test.ts run the real one).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { XdrReader, XdrWriter } from '../../src/libvirt/rpc/xdr.ts';
import {
  FrameDecoder,
  MessageStatus,
  MessageType,
  REMOTE_PROGRAM,
  RemoteProc,
  encodePacket,
  readAuthList,
  readDomainEvent,
  readRemoteError,
  uuidString,
  writeDomain,
  type Header,
} from '../../src/libvirt/rpc/protocol.ts';
import { mapRemoteError } from '../../src/libvirt/rpc/remote-error.ts';
import { resolveUri } from '../../src/libvirt/rpc/uri.ts';
import { VmseedError } from '../../src/errors.ts';

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof VmseedError, String(e));
    return e.code;
  }
  return 'no error';
}

test('XDR: strings are length-prefixed and zero-padded to 4 bytes', () => {
  assert.equal(new XdrWriter().string('', 10).toBuffer().toString('hex'), '00000000');
  assert.equal(new XdrWriter().string('a', 10).toBuffer().toString('hex'), '0000000161000000');
  assert.equal(new XdrWriter().string('abcd', 10).toBuffer().toString('hex'), '0000000461626364');
  assert.equal(new XdrWriter().string('abcde', 10).toBuffer().toString('hex'), '000000056162636465000000');
  // optional string: a bool, then the value
  assert.equal(new XdrWriter().optionalString(null, 10).toBuffer().toString('hex'), '00000000');
  assert.equal(new XdrWriter().optionalString('q', 10).toBuffer().toString('hex'), '000000010000000171000000');
});

test('XDR: whatever is written reads back the same', () => {
  fc.assert(
    fc.property(
      fc.array(
        fc.oneof(
          fc.record({ t: fc.constant('s' as const), v: fc.string({ unit: 'grapheme', maxLength: 40 }) }),
          fc.record({ t: fc.constant('i' as const), v: fc.integer({ min: -0x80000000, max: 0x7fffffff }) }),
          fc.record({ t: fc.constant('u' as const), v: fc.integer({ min: 0, max: 0xffffffff }) }),
          fc.record({ t: fc.constant('h' as const), v: fc.bigInt({ min: 0n, max: 2n ** 64n - 1n }) }),
          fc.record({ t: fc.constant('o' as const), v: fc.option(fc.string({ maxLength: 10 })) }),
        ),
        { maxLength: 20 },
      ),
      (items) => {
        const w = new XdrWriter(4);
        for (const it of items) {
          if (it.t === 's') w.string(it.v, 1000);
          else if (it.t === 'i') w.i32(it.v);
          else if (it.t === 'u') w.u32(it.v);
          else if (it.t === 'h') w.u64(it.v);
          else w.optionalString(it.v, 1000);
        }
        assert.equal(w.length % 4, 0);
        const r = new XdrReader(w.toBuffer());
        for (const it of items) {
          const got =
            it.t === 's'
              ? r.string(1000)
              : it.t === 'i'
                ? r.i32()
                : it.t === 'u'
                  ? r.u32()
                  : it.t === 'h'
                    ? r.u64()
                    : r.optionalString(1000);
          assert.deepEqual(got, it.v);
        }
        r.end('items');
      },
    ),
  );
});

test('XDR reader: truncated data, a length over the cap, a bad bool and trailing bytes are LIBVIRT_PROTOCOL errors', () => {
  assert.equal(
    code(() => new XdrReader(Buffer.from('000000', 'hex')).u32()),
    'LIBVIRT_PROTOCOL',
  );
  // Claims 16 MiB with 4 bytes present: refused on the length, before any allocation.
  assert.equal(
    code(() => new XdrReader(Buffer.from('01000000', 'hex')).string(1024)),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => new XdrReader(Buffer.from('0000000861626364', 'hex')).string(1024)),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => new XdrReader(Buffer.from('00000002', 'hex')).bool()),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => {
      const r = new XdrReader(Buffer.from('0000000100000002', 'hex'));
      r.u32();
      r.end('x');
    }),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => new XdrWriter().string('abcdef', 4)),
    'LIBVIRT_PROTOCOL',
  );
});

test('packet: length word, then prog/vers/proc/type/serial/status, then the payload', () => {
  const buf = encodePacket({
    prog: REMOTE_PROGRAM,
    vers: 1,
    proc: RemoteProc.CONNECT_GET_LIB_VERSION,
    type: MessageType.CALL,
    serial: 7,
    status: MessageStatus.OK,
  });
  assert.equal(
    buf.toString('hex'),
    '0000001c' + '20008086' + '00000001' + '0000009d' + '00000000' + '00000007' + '00000000',
  );
});

const sample: Array<{ header: Header; payload: Buffer }> = [
  {
    header: { prog: REMOTE_PROGRAM, vers: 1, proc: 212, type: 1, serial: 1, status: 0 },
    payload: Buffer.from('0000000300000001', 'hex'),
  },
  { header: { prog: 0x6b656570, vers: 1, proc: 1, type: 2, serial: 0, status: 0 }, payload: Buffer.alloc(0) },
  {
    header: { prog: REMOTE_PROGRAM, vers: 1, proc: 14, type: 1, serial: 2, status: 0 },
    payload: new XdrWriter().string('<domain/>'.repeat(50), 1 << 20).toBuffer(),
  },
];

test('frame decoder: the same packets however the stream is cut', () => {
  const stream = Buffer.concat(sample.map((p) => encodePacket(p.header, p.payload)));
  fc.assert(
    fc.property(fc.array(fc.integer({ min: 1, max: stream.length }), { maxLength: 12 }), (cuts) => {
      const points = [...new Set(cuts)].sort((a, b) => a - b);
      const d = new FrameDecoder(1 << 20);
      const got = [];
      let at = 0;
      for (const p of [...points, stream.length]) {
        got.push(...d.push(stream.subarray(at, p)));
        at = p;
      }
      assert.deepEqual(
        got.map((p) => ({ header: p.header, payload: Buffer.from(p.payload) })),
        sample,
      );
    }),
  );
});

test('frame decoder: an oversized or undersized length fails on its 4 bytes', () => {
  assert.equal(
    code(() => new FrameDecoder(1024).push(Buffer.from('00000401', 'hex'))),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => new FrameDecoder(1024).push(Buffer.from('7fffffff', 'hex'))),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(
    code(() => new FrameDecoder(1024).push(Buffer.from('00000010', 'hex'))),
    'LIBVIRT_PROTOCOL',
  );
  assert.deepEqual(new FrameDecoder(1024).push(Buffer.from('00000400', 'hex')), []); // 1 KiB: waits for the rest
});

test('frame decoder: a length word cut across reads is checked against the cap once whole, before any frame is held', () => {
  const word = (n: number) => {
    const b = Buffer.alloc(4);
    b.writeUInt32BE(n);
    return b;
  };
  for (const cuts of [[2], [1], [3], [1, 2, 3]]) {
    const bounds = [0, ...cuts, 4];
    const pieces = (b: Buffer) => bounds.slice(1).map((end, i) => b.subarray(bounds[i], end));
    for (const len of [1025, 8 * 1024 * 1024]) {
      const d = new FrameDecoder(1024);
      const parts = pieces(word(len));
      const last = parts.pop()!;
      for (const p of parts) assert.deepEqual(d.push(p), [], 'a partial length word waits');
      assert.throws(() => d.push(last), {
        code: 'LIBVIRT_PROTOCOL',
        message: new RegExp(`frame of ${len} bytes exceeds the limit of 1024`),
      });
      assert.equal(d.retainedBytes, 0, `cut at ${cuts.join('+')}: nothing held for a ${len}-byte frame`);
    }
    // At the cap, the same cut frame arrives whole.
    const d = new FrameDecoder(1024);
    const frame = encodePacket(sample[0].header, Buffer.alloc(1024 - 28, 7));
    assert.equal(frame.length, 1024);
    const got = [];
    for (const p of pieces(frame.subarray(0, 4))) got.push(...d.push(p));
    got.push(...d.push(frame.subarray(4)));
    assert.equal(got.length, 1, `cut at ${cuts.join('+')}`);
    assert.deepEqual(Buffer.from(got[0].payload), Buffer.alloc(1024 - 28, 7));
  }
});

const uuid = Buffer.from('00112233445566778899aabbccddeeff', 'hex');

test('events: lifecycle and device-removed callback messages decode; others are ignored', () => {
  const dom = { name: 'ns_vm', uuid, id: 4 };
  const life = writeDomain(new XdrWriter().i32(3), dom).i32(2).i32(1).toBuffer();
  assert.deepEqual(readDomainEvent(RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE, life), {
    kind: 'lifecycle',
    callbackId: 3,
    domain: dom,
    event: 'started',
    detail: 1,
  });
  const removed = writeDomain(new XdrWriter().i32(4), dom).string('ua-vmseed', 100).toBuffer();
  assert.deepEqual(readDomainEvent(RemoteProc.DOMAIN_EVENT_CALLBACK_DEVICE_REMOVED, removed), {
    kind: 'device-removed',
    callbackId: 4,
    domain: dom,
    alias: 'ua-vmseed',
  });
  assert.equal(readDomainEvent(319, life), undefined);
  assert.equal(
    code(() => readDomainEvent(RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE, Buffer.concat([life, Buffer.alloc(4)]))),
    'LIBVIRT_PROTOCOL',
  );
  assert.equal(uuidString(uuid), '00112233-4455-6677-8899-aabbccddeeff');
});

test('remote_error and auth list decode', () => {
  const err = new XdrWriter()
    .i32(42)
    .i32(10)
    .optionalString("Domain not found: no domain with matching name 'x'", 1000)
    .i32(2)
    .bool(false)
    .optionalString(null, 1)
    .optionalString(null, 1)
    .optionalString(null, 1)
    .i32(0)
    .i32(0)
    .bool(false)
    .toBuffer();
  assert.deepEqual(readRemoteError(err), {
    code: 42,
    domain: 10,
    message: "Domain not found: no domain with matching name 'x'",
    level: 2,
  });
  assert.deepEqual(readAuthList(new XdrWriter().u32(2).i32(0).i32(2).toBuffer()), [0, 2]);
  assert.equal(
    code(() => readAuthList(new XdrWriter().u32(1000).toBuffer())),
    'LIBVIRT_PROTOCOL',
  );
});

test('libvirt errors map to the codes the virsh runner uses', () => {
  const m = (c: number, message: string) => mapRemoteError({ code: c, domain: 10, message, level: 2 }, 'op');
  assert.equal(m(42, "Domain not found: no domain with matching name 'x'").code, 'DOMAIN_NOT_FOUND');
  assert.equal(m(42, 'x').kind, 'retryable');
  assert.equal(m(99, 'device not found: no target device sdz').code, 'DEVICE_NOT_FOUND');
  assert.equal(m(1, 'non unique alias detected: ua-vmseed').code, 'ALIAS_IN_USE');
  assert.equal(m(27, "target 'sda' duplicated for disk sources '/a' and '/b'").code, 'TARGET_IN_USE');
  assert.equal(
    m(38, "Cannot access storage file '/x.iso': No such file or directory").code,
    'SEED_FILE_NOT_ACCESSIBLE',
  );
  assert.equal(m(68, 'Timed out during operation: cannot acquire state change lock').code, 'LIBVIRT_TIMEOUT');
  assert.equal(m(88, 'access denied').code, 'LIBVIRT_ACCESS_DENIED');
  assert.equal(m(88, 'access denied').kind, 'terminal');
  const other = m(1, 'internal error: something\nelse');
  assert.equal(other.code, 'LIBVIRT_FAILED');
  assert.match(other.message, /something else \(libvirt error 1\)/);
  assert.ok(m(1, 'x'.repeat(10_000)).message.length < 700, 'long messages are cut');
});

test('URIs: system, session, and an explicit socket', () => {
  const none = () => false;
  assert.deepEqual(resolveUri('qemu:///system', { exists: none }), {
    socketPath: '/run/libvirt/libvirt-sock',
    name: 'qemu:///system',
  });
  assert.deepEqual(resolveUri('qemu:///system', { exists: (p) => p.endsWith('virtqemud-sock') }), {
    socketPath: '/run/libvirt/virtqemud-sock',
    name: 'qemu:///system',
  });
  assert.deepEqual(
    resolveUri('qemu+unix:///session?socket=/pods/p1/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock'),
    {
      socketPath: '/pods/p1/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock',
      name: 'qemu:///session',
    },
  );
  assert.deepEqual(resolveUri('qemu:///session', { exists: none, runtimeDir: '/run/user/107' }), {
    socketPath: '/run/user/107/libvirt/libvirt-sock',
    name: 'qemu:///session',
  });
  for (const bad of [
    'qemu+ssh://host/system',
    'test:///default',
    'qemu:///system?mode=legacy',
    'qemu+unix:///session?socket=relative',
    'xen:///system',
  ]) {
    assert.equal(
      code(() => resolveUri(bad, { exists: none, runtimeDir: '/r' })),
      'CONFIG_INVALID',
      bad,
    );
  }
});
