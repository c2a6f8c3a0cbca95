// Harness test (of the fakes' libvirt codec, not of vmseed).
// test/support/libvirt-wire.ts against the bytes a real libvirtd and virsh
// exchanged (test/fixtures/libvirt-rpc/session.txt): every recorded frame,
// and every recorded payload of the structs the fakes speak, decodes and
// encodes back to the very bytes libvirt wrote.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { Decoder, Encoder, PROC, TYPE, frame, unframe, type WireDomain } from './libvirt-wire.ts';

const frames = readFileSync(new URL('../fixtures/libvirt-rpc/session.txt', import.meta.url), 'utf8')
  .split('\n')
  .filter((l) => l.startsWith('> ') || l.startsWith('< '))
  .map((l) => Buffer.from(l.slice(2), 'hex'));

type Field = 'int' | 'uint' | 'string' | 'maybeString' | 'domain' | 'maybeDomain' | 'intList';
type Value = number | string | null | WireDomain | number[];

function read(d: Decoder, f: Field): Value {
  if (f === 'intList') return Array.from({ length: d.uint() }, () => d.int());
  return d[f]();
}

function write(e: Encoder, f: Field, v: Value): void {
  if (f === 'intList') {
    const list = v as number[];
    e.uint(list.length);
    for (const n of list) e.int(n);
  } else if (f === 'maybeDomain') {
    if (v === null) e.bool(false);
    else e.bool(true).domain(v as WireDomain);
  } else if (f === 'domain') e.domain(v as WireDomain);
  else if (f === 'maybeString') e.maybeString(v as string | null);
  else if (f === 'string') e.string(v as string);
  else if (f === 'int') e.int(v as number);
  else e.uint(v as number);
}

// remote_protocol.x: each procedure's *_args (call), *_ret (reply) or *_msg.
const LAYOUT: Record<number, { call?: Field[]; reply?: Field[]; message?: Field[] }> = {
  [PROC.AUTH_LIST]: { call: [], reply: ['intList'] },
  [PROC.CONNECT_OPEN]: { call: ['maybeString', 'uint'], reply: [] },
  [PROC.DOMAIN_LOOKUP_BY_NAME]: { call: ['string'], reply: ['domain'] },
  [PROC.DOMAIN_GET_XML_DESC]: { call: ['domain', 'uint'], reply: ['string'] },
  [PROC.DOMAIN_ATTACH_DEVICE_FLAGS]: { call: ['domain', 'string', 'uint'], reply: [] },
  [PROC.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY]: { call: ['int', 'maybeDomain'], reply: ['int'] },
  [PROC.CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY]: { call: ['int'], reply: [] },
  [PROC.DOMAIN_EVENT_CALLBACK_LIFECYCLE]: { message: ['int', 'domain', 'int', 'int'] },
  [PROC.CONNECT_CLOSE]: { call: [], reply: [] },
};

test('every recorded frame unframes and frames back to the same bytes', () => {
  assert.ok(frames.length >= 20);
  for (const raw of frames) assert.deepEqual(frame(unframe(raw).header, unframe(raw).payload), raw);
});

test("the recorded args, replies and event of each known procedure decode and encode back to libvirt's bytes", () => {
  let checked = 0;
  for (const raw of frames) {
    const { header, payload } = unframe(raw);
    const kind = header.type === TYPE.CALL ? 'call' : header.type === TYPE.REPLY ? 'reply' : 'message';
    const fields = LAYOUT[header.proc]?.[kind];
    if (fields === undefined) continue;
    const d = new Decoder(payload);
    const values = fields.map((f) => read(d, f));
    d.done(`${kind} of procedure ${header.proc}`);
    const e = new Encoder();
    fields.forEach((f, i) => write(e, f, values[i]));
    assert.deepEqual(e.bytes(), payload, `${kind} of procedure ${header.proc}`);
    checked++;
  }
  assert.ok(checked >= 18, `${checked} payloads checked`);
});

test('decoded, the recording says what virsh printed', () => {
  const expected = JSON.parse(
    readFileSync(new URL('../fixtures/libvirt-rpc/expected.json', import.meta.url), 'utf8'),
  ) as { name: string; uuid: string; id: number };
  const event = frames.map(unframe).find((p) => p.header.proc === PROC.DOMAIN_EVENT_CALLBACK_LIFECYCLE)!;
  const d = new Decoder(event.payload);
  d.int();
  const dom = d.domain();
  assert.deepEqual(
    { name: dom.name, uuid: dom.uuid.toString('hex'), id: dom.id, event: d.int(), detail: d.int() },
    // virDomainEventType 4 is RESUMED, detail 0 UNPAUSED: virsh printed "Resumed Unpaused".
    { name: expected.name, uuid: expected.uuid.replaceAll('-', ''), id: expected.id, event: 4, detail: 0 },
  );
});
