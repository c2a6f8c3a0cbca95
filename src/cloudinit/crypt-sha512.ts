// SHA-512 crypt ("$6$"), Ulrich Drepper's "Unix crypt using SHA-256 and
// SHA-512" (https://www.akkadia.org/drepper/SHA-crypt.txt), as glibc, openssl
// passwd -6 and Python's crypt.crypt implement it. Written here because the
// seed must carry a hash, never the clear password, and src/cloudinit has no
// child processes to ask openssl.
//
// Not the unixcrypt package (3.0.4): it gives the same hashes (300 random
// passwords and salts compared), but takes more CPU per hash, short
// passwords most of all (docs/threat-model.md, "Measured"; this one's cost:
// `npm run bench:crypt`), since it feeds a Hash object piece by piece; it
// takes string passwords only; and it truncates a long salt or picks a
// random one where this refuses the call.
import { hash } from 'node:crypto';

const ALPHABET = './0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz';
/** The longest salt SHA-512 crypt takes, in characters. */
export const SALT_MAX = 16;
const ROUNDS_DEFAULT = 5000;

// One-shot crypto.hash over the concatenation: the 5000-round loop is
// dominated by per-call overhead, which a Hash object per round adds to
// (docs/threat-model.md, "Measured").
const sha512 = (...parts: Buffer[]): Buffer =>
  hash('sha512', parts.length === 1 ? parts[0] : Buffer.concat(parts), 'buffer');

// Step 9/10/20 of the spec: a sequence of `len` bytes made from whole digests
// followed by a prefix.
function repeatTo(digest: Buffer, len: number): Buffer {
  const out = Buffer.alloc(len);
  for (let i = 0; i < len; i += 64) digest.copy(out, i, 0, Math.min(64, len - i));
  return out;
}

// The spec's permuted base64 of the final 64 bytes: byte triples
// (i, i+21, i+42) rotated by i mod 3, then the last byte alone.
function encode(d: Buffer): string {
  let out = '';
  const b64 = (b2: number, b1: number, b0: number, n: number) => {
    let w = (b2 << 16) | (b1 << 8) | b0;
    for (let i = 0; i < n; i++) {
      out += ALPHABET[w & 0x3f];
      w >>= 6;
    }
  };
  for (let i = 0; i < 21; i++) {
    const t = [i, i + 21, i + 42];
    const r = i % 3;
    const [x, y, z] = [t[r], t[(r + 1) % 3], t[(r + 2) % 3]];
    b64(d[x], d[y], d[z], 4);
  }
  b64(0, 0, d[63], 2);
  return out;
}

/** Whether `salt` is 1 to SALT_MAX characters of crypt's alphabet [./0-9A-Za-z]. */
export function isValidSalt(salt: string): boolean {
  return salt.length > 0 && salt.length <= SALT_MAX && [...salt].every((c) => ALPHABET.includes(c));
}

/**
 * The "$6$" hash of `password` (a string is taken as UTF-8). `rounds` is clamped to
 * 1000..999,999,999 and written into the hash unless it is the default 5000. Throws TypeError for
 * an invalid salt. CPU-bound, growing with the password's length: callers bound it first.
 */
export function sha512Crypt(password: string | Uint8Array, salt: string, rounds = ROUNDS_DEFAULT): string {
  if (!isValidSalt(salt)) throw new TypeError('salt must be 1-16 characters of [./0-9A-Za-z]');
  const key = Buffer.from(typeof password === 'string' ? Buffer.from(password, 'utf8') : password);
  const s = Buffer.from(salt, 'ascii');
  const r = Math.min(999_999_999, Math.max(1000, rounds));

  const b = sha512(key, s, key);
  const aParts: Buffer[] = [key, s, repeatTo(b, key.length)];
  for (let n = key.length; n > 0; n >>= 1) aParts.push(n & 1 ? b : key);
  const a = sha512(...aParts);

  const dp = repeatTo(sha512(...Array<Buffer>(key.length).fill(key)), key.length);
  const ds = repeatTo(sha512(...Array<Buffer>(16 + a[0]).fill(s)), s.length);

  let c = a;
  for (let i = 0; i < r; i++) {
    const parts: Buffer[] = [];
    parts.push(i & 1 ? dp : c);
    if (i % 3) parts.push(ds);
    if (i % 7) parts.push(dp);
    parts.push(i & 1 ? c : dp);
    c = sha512(...parts);
  }
  const prefix = r === ROUNDS_DEFAULT ? `$6$${salt}$` : `$6$rounds=${r}$${salt}$`;
  return prefix + encode(c);
}
