// The subset of libvirt's wire protocol vmseed speaks. Numbers and layouts
// come from libvirt's src/rpc/virnetprotocol.x (framing, header, error),
// src/rpc/virkeepaliveprotocol.x and src/remote/remote_protocol.x
// (procedures, argument and reply structs); procedure numbers are part of
// libvirt's ABI and never change.
import { XdrReader, XdrWriter, protocolError } from './xdr.ts';

export const REMOTE_PROGRAM = 0x20008086;
export const REMOTE_PROTOCOL_VERSION = 1;
export const KEEPALIVE_PROGRAM = 0x6b656570;
export const KEEPALIVE_PROTOCOL_VERSION = 1;

export const MessageType = { CALL: 0, REPLY: 1, MESSAGE: 2, STREAM: 3, CALL_WITH_FDS: 4, REPLY_WITH_FDS: 5 } as const;
export const MessageStatus = { OK: 0, ERROR: 1, CONTINUE: 2 } as const;

export const KeepaliveProc = { PING: 1, PONG: 2 } as const;

export const RemoteProc = {
  CONNECT_OPEN: 1,
  CONNECT_CLOSE: 2,
  CONNECT_GET_VERSION: 4,
  DOMAIN_GET_XML_DESC: 14,
  DOMAIN_LOOKUP_BY_NAME: 23,
  DOMAIN_RESUME: 28,
  AUTH_LIST: 66,
  AUTH_POLKIT: 70,
  DOMAIN_IS_PERSISTENT: 151,
  CONNECT_GET_LIB_VERSION: 157,
  DOMAIN_ATTACH_DEVICE_FLAGS: 160,
  DOMAIN_DETACH_DEVICE_FLAGS: 161,
  DOMAIN_GET_STATE: 212,
  CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY: 316,
  CONNECT_DOMAIN_EVENT_CALLBACK_DEREGISTER_ANY: 317,
  DOMAIN_EVENT_CALLBACK_LIFECYCLE: 318,
  DOMAIN_EVENT_CALLBACK_DEVICE_REMOVED: 333,
} as const;

export const AuthType = { NONE: 0, SASL: 1, POLKIT: 2 } as const;

// virDomainEventID
export const DomainEventId = { LIFECYCLE: 0, DEVICE_REMOVED: 15 } as const;

// virDomainEventType, in libvirt's order.
export const LIFECYCLE_EVENTS = [
  'defined',
  'undefined',
  'started',
  'suspended',
  'resumed',
  'stopped',
  'shutdown',
  'pmsuspended',
  'crashed',
] as const;
export type LifecycleEvent = (typeof LIFECYCLE_EVENTS)[number] | 'unknown';

// virDomainState, in libvirt's order.
export const DOMAIN_STATES = [
  'nostate',
  'running',
  'blocked',
  'paused',
  'shutdown',
  'shutoff',
  'crashed',
  'pmsuspended',
] as const;
export type RawDomainState = (typeof DOMAIN_STATES)[number] | 'unknown';

// virDomainModificationImpact / virDomainDeviceModifyFlags
export const AFFECT_LIVE = 1;
export const AFFECT_CONFIG = 2;
// virDomainXMLFlags
export const XML_INACTIVE = 2;

// The wire format allows 32 MiB (VIR_NET_MESSAGE_MAX in current libvirt);
// vmseed reads domain XML and small replies, so it refuses far less.
export const DEFAULT_MAX_FRAME_BYTES = 4 * 1024 * 1024;
export const HEADER_BYTES = 24;
const LEN_BYTES = 4;
// REMOTE_STRING_MAX
export const STRING_MAX = 1024 * 1024;
export const UUID_BYTES = 16;
// REMOTE_AUTH_TYPE_LIST_MAX
const AUTH_TYPE_LIST_MAX = 20;

export interface Header {
  prog: number;
  vers: number;
  proc: number;
  type: number;
  serial: number;
  status: number;
}

export interface Packet {
  header: Header;
  payload: Buffer;
}

export function encodePacket(header: Header, payload: Buffer = Buffer.alloc(0)): Buffer {
  const w = new XdrWriter(LEN_BYTES + HEADER_BYTES + payload.length);
  w.u32(LEN_BYTES + HEADER_BYTES + payload.length)
    .u32(header.prog)
    .u32(header.vers)
    .i32(header.proc)
    .u32(header.type)
    .u32(header.serial)
    .u32(header.status)
    .fixedOpaque(payload);
  return w.toBuffer();
}

// Splits a byte stream into packets. The length word is checked before any
// of the frame is buffered, so an absurd length fails at once.
export class FrameDecoder {
  readonly #max: number;
  #chunks: Buffer[] = [];
  #buffered = 0;

  constructor(maxFrameBytes: number = DEFAULT_MAX_FRAME_BYTES) {
    this.#max = maxFrameBytes;
  }

  push(chunk: Buffer): Packet[] {
    this.#chunks.push(chunk);
    this.#buffered += chunk.length;
    const out: Packet[] = [];
    for (;;) {
      if (this.#buffered < LEN_BYTES) break;
      const head = this.#peek(LEN_BYTES);
      const len = head.readUInt32BE(0);
      if (len < LEN_BYTES + HEADER_BYTES) throw protocolError(`frame length ${len} is shorter than a header`);
      if (len > this.#max) throw protocolError(`frame of ${len} bytes exceeds the limit of ${this.#max}`);
      if (this.#buffered < len) break;
      const frame = this.#take(len);
      const r = new XdrReader(frame, LEN_BYTES);
      const header: Header = {
        prog: r.u32(),
        vers: r.u32(),
        proc: r.i32(),
        type: r.u32(),
        serial: r.u32(),
        status: r.u32(),
      };
      out.push({ header, payload: frame.subarray(LEN_BYTES + HEADER_BYTES) });
    }
    return out;
  }

  #peek(n: number): Buffer {
    if (this.#chunks[0].length >= n) return this.#chunks[0];
    const all = Buffer.concat(this.#chunks);
    this.#chunks = [all];
    return all;
  }

  #take(n: number): Buffer {
    const all = this.#chunks.length === 1 ? this.#chunks[0] : Buffer.concat(this.#chunks);
    const frame = all.subarray(0, n);
    const rest = all.subarray(n);
    this.#chunks = rest.length ? [rest] : [];
    this.#buffered = rest.length;
    return frame;
  }
}

// remote_nonnull_domain
export interface DomainRef {
  name: string;
  uuid: Buffer;
  id: number;
}

export function writeDomain(w: XdrWriter, d: DomainRef): XdrWriter {
  w.string(d.name, STRING_MAX);
  if (d.uuid.length !== UUID_BYTES) throw protocolError(`a domain uuid of ${d.uuid.length} bytes`);
  w.fixedOpaque(d.uuid);
  return w.i32(d.id);
}

export function readDomain(r: XdrReader): DomainRef {
  return { name: r.string(STRING_MAX), uuid: r.fixedOpaque(UUID_BYTES), id: r.i32() };
}

export function uuidString(uuid: Buffer): string {
  const h = uuid.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

// remote_error (virNetMessageError): code and domain are virErrorNumber and
// virErrorDomain; message is libvirt's human-readable text.
export interface RemoteError {
  code: number;
  domain: number;
  message: string | null;
  level: number;
}

export function readRemoteError(payload: Buffer): RemoteError {
  const r = new XdrReader(payload);
  const code = r.i32();
  const domain = r.i32();
  const message = r.optionalString(STRING_MAX);
  const level = r.i32();
  // dom, str1..3, int1, int2, net follow; nothing vmseed uses.
  return { code, domain, message, level };
}

export function readAuthList(payload: Buffer): number[] {
  const r = new XdrReader(payload);
  const n = r.u32();
  if (n > AUTH_TYPE_LIST_MAX) throw protocolError(`auth list of ${n} entries`);
  const types: number[] = [];
  for (let i = 0; i < n; i++) types.push(r.i32());
  r.end('auth list');
  return types;
}

export type DomainEventMessage =
  | { kind: 'lifecycle'; callbackId: number; domain: DomainRef; event: LifecycleEvent; detail: number }
  | { kind: 'device-removed'; callbackId: number; domain: DomainRef; alias: string };

// Decodes a MESSAGE packet of the remote program; undefined for events
// vmseed did not subscribe to.
export function readDomainEvent(proc: number, payload: Buffer): DomainEventMessage | undefined {
  const r = new XdrReader(payload);
  if (proc === RemoteProc.DOMAIN_EVENT_CALLBACK_LIFECYCLE) {
    const callbackId = r.i32();
    const domain = readDomain(r);
    const ev = r.i32();
    const detail = r.i32();
    r.end('lifecycle event');
    return { kind: 'lifecycle', callbackId, domain, event: LIFECYCLE_EVENTS[ev] ?? 'unknown', detail };
  }
  if (proc === RemoteProc.DOMAIN_EVENT_CALLBACK_DEVICE_REMOVED) {
    const callbackId = r.i32();
    const domain = readDomain(r);
    const alias = r.string(STRING_MAX);
    r.end('device-removed event');
    return { kind: 'device-removed', callbackId, domain, alias };
  }
  return undefined;
}
