// XDR (RFC 4506) for the few types libvirt's remote protocol needs: 32-bit
// ints, 64-bit unsigned hypers, strings, fixed opaque data and optional
// ("pointer") values. The reader checks every length against what is left in
// the buffer and against a caller's cap before it allocates, so a corrupt or
// hostile frame costs an error, never memory.
import { VmseedError } from '../../errors.ts';

export function protocolError(what: string): VmseedError {
  return new VmseedError('LIBVIRT_PROTOCOL', `libvirt RPC: ${what}; the connection is dropped and reopened`, {
    kind: 'retryable',
  });
}

function pad4(n: number): number {
  return (4 - (n % 4)) % 4;
}

export class XdrWriter {
  #buf: Buffer;
  #len = 0;

  constructor(initial = 256) {
    this.#buf = Buffer.alloc(initial);
  }

  #room(n: number): void {
    if (this.#len + n <= this.#buf.length) return;
    let size = this.#buf.length * 2;
    while (size < this.#len + n) size *= 2;
    const next = Buffer.alloc(size);
    this.#buf.copy(next, 0, 0, this.#len);
    this.#buf = next;
  }

  u32(v: number): this {
    if (!Number.isInteger(v) || v < 0 || v > 0xffffffff) throw new RangeError(`u32 out of range: ${v}`);
    this.#room(4);
    this.#buf.writeUInt32BE(v, this.#len);
    this.#len += 4;
    return this;
  }

  i32(v: number): this {
    if (!Number.isInteger(v) || v < -0x80000000 || v > 0x7fffffff) throw new RangeError(`i32 out of range: ${v}`);
    this.#room(4);
    this.#buf.writeInt32BE(v, this.#len);
    this.#len += 4;
    return this;
  }

  u64(v: bigint): this {
    this.#room(8);
    this.#buf.writeBigUInt64BE(v, this.#len);
    this.#len += 8;
    return this;
  }

  bool(v: boolean): this {
    return this.u32(v ? 1 : 0);
  }

  // Variable-length opaque data / string: length, bytes, zero padding.
  opaque(data: Buffer, max: number): this {
    // Ours, not the daemon's: the same argument would fail on any connection.
    if (data.length > max)
      throw new VmseedError(
        'LIBVIRT_PROTOCOL',
        `libvirt RPC: an argument of ${data.length} bytes exceeds the limit of ${max}; not sent`,
        { kind: 'terminal' },
      );
    this.u32(data.length);
    this.fixedOpaque(data);
    return this;
  }

  fixedOpaque(data: Buffer): this {
    const p = pad4(data.length);
    this.#room(data.length + p);
    data.copy(this.#buf, this.#len);
    this.#len += data.length;
    this.#buf.fill(0, this.#len, this.#len + p);
    this.#len += p;
    return this;
  }

  string(s: string, max: number): this {
    return this.opaque(Buffer.from(s, 'utf8'), max);
  }

  // remote_string: a pointer, i.e. a bool then the value when present.
  optionalString(s: string | null, max: number): this {
    if (s === null) return this.bool(false);
    return this.bool(true).string(s, max);
  }

  get length(): number {
    return this.#len;
  }

  toBuffer(): Buffer {
    return this.#buf.subarray(0, this.#len);
  }
}

export class XdrReader {
  readonly #buf: Buffer;
  #pos: number;

  constructor(buf: Buffer, offset = 0) {
    this.#buf = buf;
    this.#pos = offset;
  }

  #need(n: number, what: string): void {
    if (n < 0 || this.#pos + n > this.#buf.length)
      throw protocolError(`truncated ${what} (${n} bytes needed, ${this.#buf.length - this.#pos} left)`);
  }

  u32(): number {
    this.#need(4, 'unsigned int');
    const v = this.#buf.readUInt32BE(this.#pos);
    this.#pos += 4;
    return v;
  }

  i32(): number {
    this.#need(4, 'int');
    const v = this.#buf.readInt32BE(this.#pos);
    this.#pos += 4;
    return v;
  }

  u64(): bigint {
    this.#need(8, 'unsigned hyper');
    const v = this.#buf.readBigUInt64BE(this.#pos);
    this.#pos += 8;
    return v;
  }

  bool(): boolean {
    const v = this.u32();
    if (v > 1) throw protocolError(`bool with value ${v}`);
    return v === 1;
  }

  fixedOpaque(n: number): Buffer {
    this.#need(n + pad4(n), 'fixed opaque data');
    const out = Buffer.from(this.#buf.subarray(this.#pos, this.#pos + n));
    this.#pos += n + pad4(n);
    return out;
  }

  opaque(max: number): Buffer {
    const n = this.u32();
    if (n > max) throw protocolError(`a field of ${n} bytes exceeds the limit of ${max}`);
    return this.fixedOpaque(n);
  }

  string(max: number): string {
    return this.opaque(max).toString('utf8');
  }

  optionalString(max: number): string | null {
    return this.bool() ? this.string(max) : null;
  }

  get remaining(): number {
    return this.#buf.length - this.#pos;
  }

  // A reply that decodes but leaves bytes behind was read with the wrong
  // layout: better to fail than to act on misparsed fields.
  end(what: string): void {
    if (this.remaining !== 0) throw protocolError(`${this.remaining} unexpected trailing bytes after ${what}`);
  }
}
