// vmseed's RPC client against a session recorded from a real libvirtd
// (test/fixtures/libvirt-rpc, see its README): each call the client makes is
// compared with the call libvirt's own client (virsh) made for the same
// thing, decoded field by field and byte for byte, and answered with the
// reply libvirtd gave virsh; the client must decode those replies, and the
// recorded lifecycle event, to what virsh printed about the same domain.
// Frames are read with the fakes' codec (test/support/libvirt-wire.ts), not
// with the client's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { RemoteSession } from '../../src/libvirt/rpc/remote.ts';
import { now } from '../../src/libvirt/rpc/rpc-connection.ts';
import { AFFECT_LIVE, DomainEventId, type DomainEventMessage } from '../../src/libvirt/rpc/protocol.ts';
import { fakeDaemon, reply } from '../support/fake-rpc-daemon.ts';
import { Decoder, PROC, PROGRAM, TYPE, unframe, type WirePacket } from '../support/libvirt-wire.ts';

const FIXTURES = new URL('../fixtures/libvirt-rpc/', import.meta.url);

interface Expected {
  name: string;
  uuid: string;
  id: number;
  dumpxml: string;
  deviceXml: string;
  event: { domain: string; event: string; detail: string };
}

const expected = JSON.parse(readFileSync(new URL('expected.json', FIXTURES), 'utf8')) as Expected;

interface Frame {
  from: 'client' | 'daemon';
  packet: WirePacket;
  raw: Buffer;
}

function recording(): Frame[] {
  return readFileSync(new URL('session.txt', FIXTURES), 'utf8')
    .split('\n')
    .filter((l) => l.startsWith('> ') || l.startsWith('< '))
    .map((l) => {
      const raw = Buffer.from(l.slice(2), 'hex');
      return { from: l.startsWith('>') ? 'client' : 'daemon', packet: unframe(raw), raw };
    });
}

// The *_args of the calls compared, as remote_protocol.x lays them out.
const ARGS: Record<number, (d: Decoder) => unknown> = {
  [PROC.AUTH_LIST]: () => ({}),
  [PROC.CONNECT_OPEN]: (d) => ({ name: d.maybeString(), flags: d.uint() }),
  [PROC.DOMAIN_LOOKUP_BY_NAME]: (d) => ({ name: d.string() }),
  [PROC.DOMAIN_GET_XML_DESC]: (d) => ({ dom: d.domain(), flags: d.uint() }),
  [PROC.DOMAIN_ATTACH_DEVICE_FLAGS]: (d) => ({ dom: d.domain(), xml: d.string(), flags: d.uint() }),
  [PROC.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY]: (d) => ({ eventID: d.int(), dom: d.maybeDomain() }),
};

function args(p: WirePacket): unknown {
  const read = ARGS[p.header.proc];
  assert.ok(read, `procedure ${p.header.proc} is not one this test compares`);
  const d = new Decoder(p.payload);
  const v = read(d);
  d.done(`procedure ${p.header.proc}`);
  return v;
}

interface Replay {
  calls: Frame[];
  // The recorded call each of the client's calls was compared with.
  compared: Array<{ ours: WirePacket; theirs: Frame }>;
}

// A daemon answering each call with libvirtd's recorded reply to virsh's
// call of the same procedure (the first not yet used), and sending the
// recorded events after the registration they followed.
function replayer(frames: Frame[]): { replay: Replay; onPacket: Parameters<typeof fakeDaemon>[0] } {
  const calls = frames.filter((f) => f.from === 'client' && f.packet.header.prog === PROGRAM.REMOTE);
  const replay: Replay = { calls, compared: [] };
  const used = new Set<Frame>();
  const onPacket: Parameters<typeof fakeDaemon>[0] = (p, sock) => {
    if (p.header.prog !== PROGRAM.REMOTE) return;
    const theirs = calls.find((c) => !used.has(c) && c.packet.header.proc === p.header.proc);
    if (!theirs) {
      sock.destroy();
      return;
    }
    used.add(theirs);
    replay.compared.push({ ours: p, theirs });
    const answer = frames.find(
      (f) =>
        f.from === 'daemon' &&
        f.packet.header.prog === PROGRAM.REMOTE &&
        f.packet.header.type === TYPE.REPLY &&
        f.packet.header.serial === theirs.packet.header.serial,
    )!;
    reply(sock, p, answer.packet.payload, answer.packet.header.status);
    if (p.header.proc !== PROC.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY) return;
    for (const f of frames.slice(frames.indexOf(answer) + 1))
      if (f.from === 'daemon' && f.packet.header.prog === PROGRAM.REMOTE && f.packet.header.type === TYPE.MESSAGE)
        sock.write(f.raw);
  };
  return { replay, onPacket };
}

const uuidOf = (b: Buffer): string => {
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
};

test('the recording holds the calls this test replays, each answered', () => {
  const frames = recording();
  for (const proc of Object.values(PROC).filter((n) => String(n) in ARGS)) {
    const call = frames.find((f) => f.from === 'client' && f.packet.header.proc === proc);
    assert.ok(call, `virsh called procedure ${proc}`);
    assert.ok(
      frames.some((f) => f.from === 'daemon' && f.packet.header.serial === call.packet.header.serial),
      `libvirtd answered procedure ${proc}`,
    );
  }
  assert.ok(frames.some((f) => f.packet.header.proc === PROC.DOMAIN_EVENT_CALLBACK_LIFECYCLE));
});

test("the client's calls match virsh's, and it decodes libvirtd's replies and event as virsh did", async () => {
  const frames = recording();
  const { replay, onPacket } = replayer(frames);
  const fake = await fakeDaemon(onPacket);
  const events: DomainEventMessage[] = [];
  const s = await RemoteSession.open({
    socketPath: fake.path,
    name: 'qemu:///system',
    deadline: now() + 20_000,
    onDomainEvent: (e) => events.push(e),
  });
  try {
    const dom = await s.lookupByName(expected.name, now() + 20_000);
    assert.deepEqual(
      { name: dom.name, uuid: uuidOf(dom.uuid), id: dom.id },
      {
        name: expected.name,
        uuid: expected.uuid,
        id: expected.id,
      },
    );
    assert.equal(await s.getXmlDesc(dom, 0, now() + 20_000), expected.dumpxml);
    await s.attachDevice(dom, expected.deviceXml, AFFECT_LIVE, now() + 20_000);
    await s.registerEvent(DomainEventId.LIFECYCLE, now() + 20_000);
    for (let i = 0; i < 2000 && events.length === 0; i++) await new Promise((r) => setTimeout(r, 10));

    // virsh prints virDomainEventType and its detail by name: "Resumed
    // Unpaused" is event 4, detail 0 (VIR_DOMAIN_EVENT_RESUMED_UNPAUSED).
    assert.deepEqual(expected.event, { domain: expected.name, event: 'Resumed', detail: 'Unpaused' });
    assert.equal(events.length, 1);
    const ev = events[0];
    assert.equal(ev.kind, 'lifecycle');
    assert.deepEqual(
      ev.kind === 'lifecycle' && {
        name: ev.domain.name,
        uuid: uuidOf(ev.domain.uuid),
        event: ev.event,
        detail: ev.detail,
      },
      { name: expected.name, uuid: expected.uuid, event: 'resumed', detail: 0 },
    );

    assert.deepEqual(
      replay.compared.map((c) => c.ours.header.proc),
      [
        PROC.AUTH_LIST,
        PROC.CONNECT_OPEN,
        PROC.DOMAIN_LOOKUP_BY_NAME,
        PROC.DOMAIN_GET_XML_DESC,
        PROC.DOMAIN_ATTACH_DEVICE_FLAGS,
        PROC.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY,
      ],
    );
    for (const { ours, theirs } of replay.compared) {
      const what = `procedure ${ours.header.proc}`;
      const { serial: _ours, ...header } = ours.header;
      const { serial: _theirs, ...recorded } = theirs.packet.header;
      assert.deepEqual(header, recorded, `${what}: header`);
      assert.deepEqual(args(ours), args(theirs.packet), `${what}: arguments`);
      assert.deepEqual(ours.payload, theirs.packet.payload, `${what}: bytes`);
    }
  } finally {
    s.conn.destroy();
    await fake.close();
  }
});
