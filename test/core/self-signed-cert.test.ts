// The self-signed certificate, checked by parsers other than the code that
// wrote it: node's X509Certificate, OpenSSL's command line (text dump and
// verify), and a real TLS handshake with hostname verification.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { X509Certificate, createPrivateKey, createPublicKey, sign, verify } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connect, createServer, type TLSSocket } from 'node:tls';
import type { AddressInfo } from 'node:net';
import { promisify } from 'node:util';
import { selfSignedCert } from '../../src/core/self-signed-cert.ts';

const run = promisify(execFile);
const NAMES = ['vmseed-objects.vmseed.svc', 'vmseed-objects.vmseed.svc.cluster.local'];
const DAY_MS = 24 * 60 * 60 * 1000;

test('node parses it: names, CA, validity, extensions', () => {
  const now = new Date('2030-03-01T12:00:00.750Z');
  const c = selfSignedCert({ commonName: 'vmseed-objects', dnsNames: [...NAMES, '10.96.0.10'], validDays: 90, now });
  const x = new X509Certificate(c.certPem);
  assert.equal(x.subjectAltName, `DNS:${NAMES[0]}, DNS:${NAMES[1]}, IP Address:10.96.0.10`);
  assert.equal(x.ca, true);
  assert.equal(x.subject, 'CN=vmseed-objects');
  assert.equal(x.issuer, x.subject, 'self-issued');
  assert.equal(x.checkIssued(x), true);
  assert.equal(x.verify(x.publicKey), true, 'self-signed');
  assert.deepEqual(x.keyUsage, ['1.3.6.1.5.5.7.3.1'], 'extendedKeyUsage serverAuth');
  assert.equal(new Date(x.validTo).getTime(), Math.floor((now.getTime() + 90 * DAY_MS) / 1000) * 1000);
  assert.equal(c.notAfter.getTime(), new Date(x.validTo).getTime(), 'notAfter is what the certificate states');
  assert.ok(new Date(x.validFrom) < now, 'valid from before now (clock skew)');
  assert.ok(now.getTime() - new Date(x.validFrom).getTime() <= 10 * 60 * 1000);
  assert.equal(x.publicKey.asymmetricKeyType, 'ec');
  assert.equal(x.publicKey.asymmetricKeyDetails?.namedCurve, 'prime256v1');
  assert.match(x.serialNumber, /^[4-7][0-9A-F]{31}$/, '16 bytes, positive, no leading zero byte');
  assert.notEqual(selfSignedCert({ commonName: 'x', dnsNames: ['x'], validDays: 1 }).certPem, c.certPem);
  assert.match(c.keyPem, /^-----BEGIN PRIVATE KEY-----\n/, 'PKCS#8');
});

test('the key is the certificate key', () => {
  const c = selfSignedCert({ commonName: 'k', dnsNames: ['k.example'], validDays: 1 });
  const key = createPrivateKey(c.keyPem);
  const x = new X509Certificate(c.certPem);
  assert.equal(x.checkPrivateKey(key), true);
  const data = Buffer.from('object service');
  const sig = sign('sha256', data, key);
  assert.equal(verify('sha256', data, x.publicKey, sig), true);
  assert.equal(verify('sha256', data, createPublicKey(c.keyPem), sig), true);
  const other = selfSignedCert({ commonName: 'k', dnsNames: ['k.example'], validDays: 1 });
  assert.equal(x.checkPrivateKey(createPrivateKey(other.keyPem)), false);
});

test('validity past 2049 is a GeneralizedTime; bad options are refused', () => {
  const c = selfSignedCert({ commonName: 'late', dnsNames: ['late'], validDays: 365, now: new Date('2049-12-01') });
  assert.equal(new X509Certificate(c.certPem).validTo, 'Dec  1 00:00:00 2050 GMT');
  assert.equal(c.notAfter.toISOString(), '2050-12-01T00:00:00.000Z');
  assert.throws(() => selfSignedCert({ commonName: 'a', dnsNames: [], validDays: 1 }), RangeError);
  assert.throws(() => selfSignedCert({ commonName: 'a', dnsNames: ['a b'], validDays: 1 }), RangeError);
  assert.throws(() => selfSignedCert({ commonName: 'a'.repeat(65), dnsNames: ['a'], validDays: 1 }), RangeError);
  assert.throws(() => selfSignedCert({ commonName: 'a', dnsNames: ['a'], validDays: 0 }), RangeError);
});

test('openssl parses it and verifies it against itself', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-selfsigned-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const c = selfSignedCert({ commonName: 'vmseed-objects', dnsNames: NAMES, validDays: 30 });
  const pem = join(dir, 'cert.pem');
  await writeFile(pem, c.certPem);
  const text = (await run('openssl', ['x509', '-noout', '-text', '-in', pem])).stdout;
  assert.match(text, /Version: 3 \(0x2\)/);
  assert.match(text, /Signature Algorithm: ecdsa-with-SHA256/);
  assert.match(text, /X509v3 Basic Constraints: critical\s+CA:TRUE/);
  assert.match(text, /X509v3 Key Usage: critical\s+Digital Signature, Certificate Sign/);
  assert.match(text, /X509v3 Extended Key Usage:\s*\n\s+TLS Web Server Authentication/);
  assert.match(text, new RegExp(`DNS:${NAMES[0].replaceAll('.', '\\.')}, DNS:${NAMES[1].replaceAll('.', '\\.')}`));
  assert.match(text, /X509v3 Subject Key Identifier:\s*\n\s+([0-9A-F]{2}:){19}[0-9A-F]{2}/);
  const verified = await run('openssl', ['verify', '-CAfile', pem, pem]);
  assert.equal(verified.stdout.trim(), `${pem}: OK`);
  const keyFile = join(dir, 'key.pem');
  await writeFile(keyFile, c.keyPem, { mode: 0o600 });
  const fromKey = (await run('openssl', ['pkey', '-in', keyFile, '-pubout'])).stdout;
  const fromCert = (await run('openssl', ['x509', '-in', pem, '-noout', '-pubkey'])).stdout;
  assert.equal(fromKey, fromCert, 'openssl reads the PKCS#8 key as the certificate key');
  const check = await run('openssl', ['x509', '-in', pem, '-noout', '-checkhost', NAMES[1]]);
  assert.match(check.stdout, /does match certificate/);
});

async function handshake(
  port: number,
  ca: string,
  servername: string,
): Promise<{ authorized: boolean; error?: string; altNameError?: string }> {
  return new Promise((resolve, reject) => {
    const socket: TLSSocket = connect({
      host: '127.0.0.1',
      port,
      ca,
      servername,
      // Checked below, after the handshake, so a refusal is seen as one.
      rejectUnauthorized: false,
    });
    socket.once('secureConnect', () => {
      const result = {
        authorized: socket.authorized,
        ...(socket.authorizationError ? { error: String(socket.authorizationError) } : {}),
      };
      socket.end();
      resolve(result);
    });
    socket.once('error', reject);
  });
}

async function strictHandshake(port: number, ca: string, servername: string): Promise<string> {
  return new Promise((resolve) => {
    const socket = connect({ host: '127.0.0.1', port, ca, servername });
    socket.once('secureConnect', () => {
      socket.end();
      resolve('connected');
    });
    socket.once('error', (e: NodeJS.ErrnoException) => resolve(e.code ?? e.message));
  });
}

test('a TLS client that trusts the certificate connects by one of its names, not by another', async (t) => {
  const c = selfSignedCert({ commonName: 'vmseed-objects', dnsNames: NAMES, validDays: 7 });
  const server = createServer({ cert: c.certPem, key: c.keyPem }, (s) => s.end('hello'));
  await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
  t.after(() => new Promise<void>((r) => server.close(() => r())));
  const { port } = server.address() as AddressInfo;

  const ok = await handshake(port, c.certPem, NAMES[0]);
  assert.deepEqual(ok, { authorized: true });
  assert.equal(await strictHandshake(port, c.certPem, NAMES[1]), 'connected');

  assert.equal(await strictHandshake(port, c.certPem, 'other.vmseed.svc'), 'ERR_TLS_CERT_ALTNAME_INVALID');
  const stranger = selfSignedCert({ commonName: 'vmseed-objects', dnsNames: NAMES, validDays: 7 });
  const untrusted = await handshake(port, stranger.certPem, NAMES[0]);
  assert.equal(untrusted.authorized, false, 'another certificate with the same names is not a trust anchor for it');
  assert.equal(await strictHandshake(port, stranger.certPem, NAMES[0]), 'DEPTH_ZERO_SELF_SIGNED_CERT');
});
