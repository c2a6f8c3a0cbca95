// The fakes' own codec for libvirt's RPC wire format, written from libvirt's
// protocol definitions and not from vmseed's client, so that an encoding
// bug the client shares between its writer and its reader shows up against
// the fakes:
//   src/rpc/virnetprotocol.x    the length word, virNetMessageHeader,
//                               virNetMessageType/Status, virNetMessageError
//   src/remote/remote_protocol.x  REMOTE_PROGRAM, the procedure numbers, the
//                               *_args, *_ret and *_msg structs below
//   RFC 4506 (XDR)              big-endian 4-byte units, opaque data and
//                               strings padded with zeros to a multiple of 4,
//                               "optional-data" (`*`) as a bool then the value
// Test code only: it checks what it reads and throws on anything else.

export const PROGRAM = { REMOTE: 0x20008086, KEEPALIVE: 0x6b656570 } as const;

// enum virNetMessageType
export const TYPE = { CALL: 0, REPLY: 1, MESSAGE: 2, STREAM: 3 } as const;
// enum virNetMessageStatus
export const STATUS = { OK: 0, ERROR: 1, CONTINUE: 2 } as const;

// enum remote_procedure (the numbers are libvirt's ABI).
export const PROC = {
  CONNECT_OPEN: 1,
  CONNECT_CLOSE: 2,
  CONNECT_GET_VERSION: 4,
  DOMAIN_GET_XML_DESC: 14,
  DOMAIN_LOOKUP_BY_NAME: 23,
  DOMAIN_RESUME: 28,
  DOMAIN_BLOCK_STATS: 64,
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

// virkeepaliveprotocol.x
export const KEEPALIVE_PROC = { PING: 1, PONG: 2 } as const;

// VIR_NET_MESSAGE_LEN_MAX + VIR_NET_MESSAGE_HEADER_MAX
const LEN_WORD = 4;
const HEADER = 24;
// VIR_NET_MESSAGE_MAX plus the length word (virnetprotocol.x).
const MESSAGE_MAX = 16777216 + LEN_WORD;
// REMOTE_STRING_MAX
export const STRING_MAX = 4194304;
// VIR_UUID_BUFLEN
export const UUID_LEN = 16;

export interface WireHeader {
  prog: number;
  vers: number;
  proc: number;
  type: number;
  serial: number;
  status: number;
}

export interface WirePacket {
  header: WireHeader;
  payload: Buffer;
}

// remote_nonnull_domain
export interface WireDomain {
  name: string;
  uuid: Buffer;
  id: number;
}

export class Encoder {
  readonly #parts: Buffer[] = [];

  #word(write: (b: Buffer) => void, size = 4): this {
    const b = Buffer.alloc(size);
    write(b);
    this.#parts.push(b);
    return this;
  }

  int(v: number): this {
    return this.#word((b) => b.writeInt32BE(v));
  }

  uint(v: number): this {
    return this.#word((b) => b.writeUInt32BE(v));
  }

  hyper(v: bigint): this {
    return this.#word((b) => b.writeBigInt64BE(v), 8);
  }

  uhyper(v: bigint): this {
    return this.#word((b) => b.writeBigUInt64BE(v), 8);
  }

  bool(v: boolean): this {
    return this.uint(v ? 1 : 0);
  }

  // opaque[n]: the bytes and zero padding to a multiple of four.
  fixed(data: Buffer): this {
    this.#parts.push(Buffer.from(data), Buffer.alloc((4 - (data.length % 4)) % 4));
    return this;
  }

  // opaque<> and string<>: a length word, then as fixed.
  opaque(data: Buffer): this {
    return this.uint(data.length).fixed(data);
  }

  string(s: string): this {
    return this.opaque(Buffer.from(s, 'utf8'));
  }

  // remote_string: a pointer to a remote_nonnull_string.
  maybeString(s: string | null): this {
    return s === null ? this.bool(false) : this.bool(true).string(s);
  }

  domain(d: WireDomain): this {
    if (d.uuid.length !== UUID_LEN) throw new Error(`a remote_uuid is ${UUID_LEN} bytes, not ${d.uuid.length}`);
    return this.string(d.name).fixed(d.uuid).int(d.id);
  }

  bytes(): Buffer {
    return Buffer.concat(this.#parts);
  }
}

export class Decoder {
  readonly #buf: Buffer;
  #at = 0;

  constructor(buf: Buffer) {
    this.#buf = buf;
  }

  #take(n: number): Buffer {
    if (this.#at + n > this.#buf.length) throw new Error(`XDR: ${n} bytes wanted, ${this.#buf.length - this.#at} left`);
    const b = this.#buf.subarray(this.#at, this.#at + n);
    this.#at += n;
    return b;
  }

  int(): number {
    return this.#take(4).readInt32BE();
  }

  uint(): number {
    return this.#take(4).readUInt32BE();
  }

  uhyper(): bigint {
    return this.#take(8).readBigUInt64BE();
  }

  bool(): boolean {
    const v = this.uint();
    if (v > 1) throw new Error(`XDR: bool ${v}`);
    return v === 1;
  }

  fixed(n: number): Buffer {
    const data = Buffer.from(this.#take(n));
    const pad = this.#take((4 - (n % 4)) % 4);
    if (pad.some((b) => b !== 0)) throw new Error('XDR: non-zero padding');
    return data;
  }

  opaque(max: number): Buffer {
    const n = this.uint();
    if (n > max) throw new Error(`XDR: ${n} bytes over the bound ${max}`);
    return this.fixed(n);
  }

  string(max = STRING_MAX): string {
    return this.opaque(max).toString('utf8');
  }

  maybeString(): string | null {
    return this.bool() ? this.string() : null;
  }

  domain(): WireDomain {
    return { name: this.string(), uuid: this.fixed(UUID_LEN), id: this.int() };
  }

  maybeDomain(): WireDomain | null {
    return this.bool() ? this.domain() : null;
  }

  // Everything read: a struct decoded with the wrong layout leaves bytes.
  done(what: string): void {
    if (this.#at !== this.#buf.length) throw new Error(`XDR: ${this.#buf.length - this.#at} bytes left after ${what}`);
  }
}

// Length word (counting itself), header, payload.
export function frame(header: WireHeader, payload: Buffer = Buffer.alloc(0)): Buffer {
  const head = new Encoder()
    .uint(LEN_WORD + HEADER + payload.length)
    .uint(header.prog)
    .uint(header.vers)
    .int(header.proc)
    .int(header.type)
    .uint(header.serial)
    .int(header.status)
    .bytes();
  return Buffer.concat([head, payload]);
}

export function unframe(whole: Buffer): WirePacket {
  const d = new Decoder(whole.subarray(0, LEN_WORD + HEADER));
  const len = d.uint();
  if (len !== whole.length) throw new Error(`frame says ${len} bytes, has ${whole.length}`);
  const header = { prog: d.uint(), vers: d.uint(), proc: d.int(), type: d.int(), serial: d.uint(), status: d.int() };
  return { header, payload: Buffer.from(whole.subarray(LEN_WORD + HEADER)) };
}

// Cuts a byte stream into whole frames, however it was split into reads.
export class FrameSplitter {
  #pending = Buffer.alloc(0);

  push(chunk: Buffer): Buffer[] {
    this.#pending = Buffer.concat([this.#pending, chunk]);
    const out: Buffer[] = [];
    while (this.#pending.length >= LEN_WORD) {
      const len = this.#pending.readUInt32BE(0);
      if (len < LEN_WORD + HEADER || len > MESSAGE_MAX) throw new Error(`a frame length of ${len}`);
      if (this.#pending.length < len) break;
      out.push(Buffer.from(this.#pending.subarray(0, len)));
      this.#pending = this.#pending.subarray(len);
    }
    return out;
  }
}

// struct virNetMessageError / remote_error.
export function errorPayload(code: number, domain: number, message: string): Buffer {
  return new Encoder()
    .int(code)
    .int(domain)
    .maybeString(message)
    .int(2) // level: VIR_ERR_ERROR
    .bool(false) // dom
    .maybeString(null)
    .maybeString(null)
    .maybeString(null)
    .int(0)
    .int(0)
    .bool(false) // net
    .bytes();
}

export interface WireError {
  code: number;
  domain: number;
  message: string | null;
  level: number;
}

export function readError(payload: Buffer): WireError {
  const d = new Decoder(payload);
  const e = { code: d.int(), domain: d.int(), message: d.maybeString(), level: d.int() };
  d.maybeDomain();
  d.maybeString();
  d.maybeString();
  d.maybeString();
  d.int();
  d.int();
  if (d.bool()) {
    d.string();
    d.fixed(UUID_LEN);
  }
  d.done('remote_error');
  return e;
}
