// A self-signed serving certificate made with node:crypto alone: Node can
// make keys and sign, but has no certificate builder, and a dependency (or
// an openssl binary in the image) for one small DER structure is more to
// trust and patch than the encoder below. The certificate is its own trust
// anchor (CA:TRUE), as KubeVirt's self-issued CA bundle is: clients put it
// in their `ca` list as it is, so there is no chain to build.
//
// Only the DER the certificate needs is written (X.690; RFC 5280 for the
// certificate's profile): definite lengths, minimal integers, and the one
// encoding DER allows for each value, so that strict parsers (OpenSSL's,
// Go's crypto/x509 in the API server's tools) take it.
import { createHash, generateKeyPairSync, randomBytes, sign, type KeyObject } from 'node:crypto';
import { isIP } from 'node:net';

// --- DER ---------------------------------------------------------------------

function tlv(tag: number, content: Buffer): Buffer {
  const n = content.length;
  let head: Buffer;
  if (n < 0x80) head = Buffer.from([tag, n]);
  else {
    const len: number[] = [];
    for (let v = n; v > 0; v = Math.floor(v / 256)) len.unshift(v & 0xff);
    head = Buffer.from([tag, 0x80 | len.length, ...len]);
  }
  return Buffer.concat([head, content]);
}

const seq = (...items: Buffer[]) => tlv(0x30, Buffer.concat(items));
const set = (...items: Buffer[]) => tlv(0x31, Buffer.concat(items));
// [n] EXPLICIT: constructed, context-specific.
const explicit = (n: number, inner: Buffer) => tlv(0xa0 | n, inner);
const octets = (b: Buffer) => tlv(0x04, b);
const bool = (v: boolean) => tlv(0x01, Buffer.from([v ? 0xff : 0x00]));
const utf8 = (s: string) => tlv(0x0c, Buffer.from(s, 'utf8'));

// An unsigned big-endian magnitude as a DER INTEGER: no redundant leading
// zero bytes, and one zero byte added when the top bit would make it negative.
function integer(magnitude: Buffer): Buffer {
  let i = 0;
  while (i < magnitude.length - 1 && magnitude[i] === 0) i++;
  const b = magnitude.subarray(i);
  return tlv(0x02, b[0] & 0x80 ? Buffer.concat([Buffer.from([0]), b]) : b);
}

// Whole bytes only; `unused` trailing bits of the last byte are padding.
const bitString = (b: Buffer, unused = 0) => tlv(0x03, Buffer.concat([Buffer.from([unused]), b]));

function oid(dotted: string): Buffer {
  const arcs = dotted.split('.').map(Number);
  const out: number[] = [];
  const values = [arcs[0] * 40 + arcs[1], ...arcs.slice(2)];
  for (const v of values) {
    const groups: number[] = [v & 0x7f];
    for (let rest = Math.floor(v / 128); rest > 0; rest = Math.floor(rest / 128)) groups.unshift((rest & 0x7f) | 0x80);
    out.push(...groups);
  }
  return tlv(0x06, Buffer.from(out));
}

// RFC 5280 4.1.2.5: UTCTime through 2049, GeneralizedTime from 2050, both in
// UTC with seconds and no fraction.
function time(d: Date): Buffer {
  const year = d.getUTCFullYear();
  const two = (n: number) => String(n).padStart(2, '0');
  const rest = `${two(d.getUTCMonth() + 1)}${two(d.getUTCDate())}${two(d.getUTCHours())}${two(d.getUTCMinutes())}${two(d.getUTCSeconds())}Z`;
  if (year >= 1950 && year <= 2049) return tlv(0x17, Buffer.from(`${two(year % 100)}${rest}`, 'ascii'));
  return tlv(0x18, Buffer.from(`${String(year).padStart(4, '0')}${rest}`, 'ascii'));
}

// --- the certificate -----------------------------------------------------------

const OID = {
  ecdsaWithSha256: '1.2.840.10045.4.3.2',
  commonName: '2.5.4.3',
  subjectKeyIdentifier: '2.5.29.14',
  keyUsage: '2.5.29.15',
  subjectAltName: '2.5.29.17',
  basicConstraints: '2.5.29.19',
  extKeyUsage: '2.5.29.37',
  serverAuth: '1.3.6.1.5.5.7.3.1',
};

const DAY_MS = 24 * 60 * 60 * 1000;
// Backdated so that a node whose clock runs a little behind the issuer's
// does not see a certificate from the future.
const BACKDATE_MS = 5 * 60 * 1000;
// X.520's upper bound for a common name.
const MAX_COMMON_NAME = 64;

function extension(id: string, critical: boolean, value: Buffer): Buffer {
  return seq(oid(id), ...(critical ? [bool(true)] : []), octets(value));
}

// dNSName [2] and iPAddress [7], IMPLICIT: a name that is an IP address
// must be an iPAddress entry, or TLS clients connecting by address refuse it.
function generalName(name: string): Buffer {
  const family = isIP(name);
  if (family === 4) return tlv(0x87, Buffer.from(name.split('.').map(Number)));
  if (family === 6) return tlv(0x87, ipv6Bytes(name));
  return tlv(0x82, Buffer.from(name, 'ascii'));
}

function ipv6Bytes(text: string): Buffer {
  let addr = text;
  // An embedded IPv4 tail (::ffff:1.2.3.4) becomes two hex groups.
  const v4 = /(\d+)\.(\d+)\.(\d+)\.(\d+)$/.exec(addr);
  if (v4) {
    const [a, b, c, d] = v4.slice(1).map(Number);
    addr = addr.slice(0, v4.index) + `${((a << 8) | b).toString(16)}:${((c << 8) | d).toString(16)}`;
  }
  const [head, tail] = addr.split('::');
  const parse = (s: string | undefined) => (s ? s.split(':').map((g) => parseInt(g, 16)) : []);
  const h = parse(head);
  const t = parse(tail);
  const groups = tail === undefined ? h : [...h, ...new Array<number>(8 - h.length - t.length).fill(0), ...t];
  const out = Buffer.alloc(16);
  groups.forEach((g, i) => out.writeUInt16BE(g, i * 2));
  return out;
}

// RFC 5280 4.2.1.2 method (1): SHA-1 of the subjectPublicKey bits, here the
// uncompressed P-256 point.
function keyIdentifier(publicKey: KeyObject): Buffer {
  const jwk = publicKey.export({ format: 'jwk' });
  const point = Buffer.concat([
    Buffer.from([0x04]),
    Buffer.from(jwk.x ?? '', 'base64url'),
    Buffer.from(jwk.y ?? '', 'base64url'),
  ]);
  return createHash('sha1').update(point).digest();
}

/** What selfSignedCert issues: the names and how long it is valid. */
export interface SelfSignedCertOptions {
  commonName: string;
  // subjectAltName entries; an IP address literal becomes an iPAddress entry.
  dnsNames: string[];
  validDays: number;
  now?: Date;
}

/** A PEM certificate, its PKCS#8 PEM key, and the certificate's notAfter. */
export interface SelfSignedCert {
  certPem: string;
  keyPem: string;
  notAfter: Date;
}

/**
 * A new ECDSA P-256 key and a self-signed X.509 v3 certificate for it, valid
 * from a few minutes before `now` for `validDays`: CA:TRUE (it is its own
 * trust anchor), keyUsage digitalSignature and keyCertSign, extendedKeyUsage
 * serverAuth, subjectAltName of `dnsNames`, a subjectKeyIdentifier and a
 * random positive 128-bit serial; signed ecdsa-with-SHA256. Throws a
 * RangeError for an empty name list, a name that is not ASCII, a common name
 * over 64 characters or a validity that is not a positive number of days.
 */
export function selfSignedCert(options: SelfSignedCertOptions): SelfSignedCert {
  const { commonName, dnsNames, validDays } = options;
  if (dnsNames.length === 0) throw new RangeError('a certificate needs at least one DNS name');
  // dNSName is an IA5String: internationalized names go in as their A-labels.
  for (const name of dnsNames)
    if (name === '' || !/^[\x21-\x7e]+$/.test(name)) throw new RangeError(`not a DNS name: ${JSON.stringify(name)}`);
  if (commonName === '' || [...commonName].length > MAX_COMMON_NAME)
    throw new RangeError(`the common name must be 1 to ${MAX_COMMON_NAME} characters`);
  if (!Number.isFinite(validDays) || validDays <= 0) throw new RangeError(`validDays must be positive: ${validDays}`);

  const now = options.now ?? new Date();
  // Whole seconds: that is all either time type holds, and notAfter is
  // returned as the certificate states it.
  const notBefore = new Date(Math.floor((now.getTime() - BACKDATE_MS) / 1000) * 1000);
  const notAfter = new Date(Math.floor((now.getTime() + validDays * DAY_MS) / 1000) * 1000);

  const { publicKey, privateKey } = generateKeyPairSync('ec', { namedCurve: 'prime256v1' });
  const serial = randomBytes(16);
  // Positive (top bit clear) and exactly 16 bytes (a leading zero would be
  // dropped by the minimal encoding).
  serial[0] = (serial[0] & 0x7f) | 0x40;

  const name = seq(set(seq(oid(OID.commonName), utf8(commonName))));
  const signatureAlgorithm = seq(oid(OID.ecdsaWithSha256));
  const extensions = seq(
    extension(OID.basicConstraints, true, seq(bool(true))),
    // digitalSignature (bit 0) and keyCertSign (bit 5): 1000 0100, the two
    // trailing zero bits unused, as DER's named bit lists require.
    extension(OID.keyUsage, true, bitString(Buffer.from([0x84]), 2)),
    extension(OID.extKeyUsage, false, seq(oid(OID.serverAuth))),
    extension(OID.subjectAltName, false, seq(...dnsNames.map(generalName))),
    extension(OID.subjectKeyIdentifier, false, octets(keyIdentifier(publicKey))),
  );
  const tbs = seq(
    explicit(0, integer(Buffer.from([2]))), // v3
    integer(serial),
    signatureAlgorithm,
    name,
    seq(time(notBefore), time(notAfter)),
    name,
    publicKey.export({ type: 'spki', format: 'der' }),
    explicit(3, extensions),
  );
  const signature = sign('sha256', tbs, { key: privateKey, dsaEncoding: 'der' });
  const der = seq(tbs, signatureAlgorithm, bitString(signature));

  const body = der.toString('base64').replace(/.{1,64}/g, '$&\n');
  return {
    certPem: `-----BEGIN CERTIFICATE-----\n${body}-----END CERTIFICATE-----\n`,
    keyPem: privateKey.export({ type: 'pkcs8', format: 'pem' }).toString(),
    notAfter,
  };
}
