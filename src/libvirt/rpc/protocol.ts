// The subset of libvirt's wire protocol vmseed speaks. Numbers and layouts
// come from libvirt's src/rpc/virnetprotocol.x (framing, header, error),
// src/rpc/virkeepaliveprotocol.x and src/remote/remote_protocol.x
// (procedures, argument and reply structs); procedure numbers are part of
// libvirt's ABI and never change.
import type { MemoryBudget } from './budget.ts';
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
  DOMAIN_BLOCK_STATS: 64,
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
// of the frame is buffered, so an absurd length fails at once. A frame that
// arrives whole is decoded in place; one cut across reads is copied into a
// single buffer of its announced length, reserved from the budget first, so
// what a daemon makes us hold is the frame's size however it is dripped
// (one Buffer per read would cost far more than the byte it holds:
// measured in docs/libvirt-rpc.md, "An untrusted daemon"). A screen, when
// given, sees each frame's header and length as soon as they are in,
// before the body is copied, and refuses a frame by throwing.
export type FrameScreen = (header: Header, frameBytes: number) => void;

export class FrameDecoder {
  readonly #max: number;
  readonly #budget: MemoryBudget | undefined;
  readonly #screen: FrameScreen | undefined;
  readonly #lenWord = Buffer.alloc(LEN_BYTES);
  #lenFill = 0;
  #frame: Buffer | undefined;
  #fill = 0;
  #screened = false;
  // Set when push() failed because the budget could not hold a frame.
  overBudget = false;

  constructor(maxFrameBytes: number = DEFAULT_MAX_FRAME_BYTES, budget?: MemoryBudget, screen?: FrameScreen) {
    this.#max = maxFrameBytes;
    this.#budget = budget;
    this.#screen = screen;
  }

  // A frame (or its length word) has begun and not ended.
  get partial(): boolean {
    return this.#lenFill > 0 || this.#frame !== undefined;
  }

  // Bytes this decoder holds between reads.
  get retainedBytes(): number {
    return this.#frame?.length ?? 0;
  }

  // The length of the frame being received, when known.
  get pendingFrameBytes(): number | undefined {
    return this.#frame?.length;
  }

  push(chunk: Buffer): Packet[] {
    const out: Packet[] = [];
    let at = 0;
    while (at < chunk.length) {
      if (this.#frame === undefined) {
        if (this.#lenFill === 0 && chunk.length - at >= LEN_BYTES) {
          const len = this.#checkLength(chunk.readUInt32BE(at));
          const headed = chunk.length - at >= LEN_BYTES + HEADER_BYTES;
          if (headed) this.#screen?.(readHeader(chunk, at), len);
          if (chunk.length - at >= len) {
            out.push(decodeFrame(chunk.subarray(at, at + len)));
            at += len;
            continue;
          }
          this.#begin(len);
          this.#screened = headed;
        } else {
          const n = Math.min(LEN_BYTES - this.#lenFill, chunk.length - at);
          chunk.copy(this.#lenWord, this.#lenFill, at, at + n);
          this.#lenFill += n;
          at += n;
          if (this.#lenFill < LEN_BYTES) break;
          this.#lenFill = 0;
          this.#begin(this.#checkLength(this.#lenWord.readUInt32BE(0)));
          this.#lenWord.copy(this.#frame!, 0);
          this.#fill = LEN_BYTES;
          continue;
        }
      }
      const frame = this.#frame!;
      const n = Math.min(frame.length - this.#fill, chunk.length - at);
      chunk.copy(frame, this.#fill, at, at + n);
      this.#fill += n;
      at += n;
      if (!this.#screened && this.#fill >= LEN_BYTES + HEADER_BYTES) {
        this.#screened = true;
        this.#screen?.(readHeader(frame, 0), frame.length);
      }
      if (this.#fill === frame.length) {
        this.#release();
        out.push(decodeFrame(frame));
      }
    }
    return out;
  }

  // Gives back what a partial frame holds (the connection is going).
  dispose(): void {
    this.#release();
    this.#lenFill = 0;
  }

  #checkLength(len: number): number {
    if (len < LEN_BYTES + HEADER_BYTES) throw protocolError(`frame length ${len} is shorter than a header`);
    if (len > this.#max) throw protocolError(`frame of ${len} bytes exceeds the limit of ${this.#max}`);
    return len;
  }

  #begin(len: number): void {
    if (this.#budget && !this.#budget.take(len)) {
      this.overBudget = true;
      throw protocolError(
        `frame of ${len} bytes does not fit the libvirt memory budget (${this.#budget.used} of ${this.#budget.limit} bytes in use)`,
      );
    }
    this.#frame = Buffer.allocUnsafe(len);
    this.#fill = 0;
    this.#screened = false;
  }

  #release(): void {
    if (this.#frame !== undefined) this.#budget?.give(this.#frame.length);
    this.#frame = undefined;
    this.#fill = 0;
  }
}

// The header of the frame starting at `at` (its length word first).
function readHeader(buf: Buffer, at: number): Header {
  const r = new XdrReader(buf, at + LEN_BYTES);
  return { prog: r.u32(), vers: r.u32(), proc: r.i32(), type: r.u32(), serial: r.u32(), status: r.u32() };
}

function decodeFrame(frame: Buffer): Packet {
  return { header: readHeader(frame, 0), payload: frame.subarray(LEN_BYTES + HEADER_BYTES) };
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
