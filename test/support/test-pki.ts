// A throwaway PKI for the fake API server: a CA of the test's own and a
// server certificate it signed, for 127.0.0.1, localhost and the in-cluster
// names (kubernetes.default.svc...). Made with the `openssl` CLI once per
// process and name (EC P-256: a few tens of milliseconds), then reused.
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export interface TestPki {
  // PEM: what a client trusts (the service account's ca.crt).
  caCert: string;
  serverCert: string;
  serverKey: string;
}

const cache = new Map<string, Promise<TestPki>>();

// Distinct names give distinct CAs: a server from one must be refused by a
// client that trusts the other. `ips`: more addresses the server certificate
// names (a fake API server listening elsewhere than on loopback).
export function testPki(name = 'fake-kube', ips: string[] = []): Promise<TestPki> {
  const key = [name, ...ips].join(' ');
  let p = cache.get(key);
  if (!p) {
    p = generate(name, ips);
    cache.set(key, p);
  }
  return p;
}

async function generate(name: string, ips: string[]): Promise<TestPki> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-pki-'));
  try {
    const f = (n: string) => join(dir, n);
    const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
    await run('openssl', [
      'req',
      '-x509',
      ...ec,
      '-days',
      '2',
      '-subj',
      `/CN=${name}-ca`,
      '-keyout',
      f('ca.key'),
      '-out',
      f('ca.crt'),
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    await run('openssl', [
      'req',
      '-new',
      ...ec,
      '-subj',
      '/CN=kube-apiserver',
      '-keyout',
      f('server.key'),
      '-out',
      f('server.csr'),
    ]);
    await writeFile(
      f('ext.cnf'),
      [
        'basicConstraints=critical,CA:FALSE',
        'keyUsage=critical,digitalSignature,keyEncipherment',
        'extendedKeyUsage=serverAuth',
        `subjectAltName=IP:127.0.0.1,${ips.map((ip) => `IP:${ip},`).join('')}DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local`,
        '',
      ].join('\n'),
    );
    await run('openssl', [
      'x509',
      '-req',
      '-in',
      f('server.csr'),
      '-CA',
      f('ca.crt'),
      '-CAkey',
      f('ca.key'),
      '-CAcreateserial',
      '-days',
      '2',
      '-extfile',
      f('ext.cnf'),
      '-out',
      f('server.crt'),
    ]);
    const [caCert, serverCert, serverKey] = await Promise.all([
      readFile(f('ca.crt'), 'utf8'),
      readFile(f('server.crt'), 'utf8'),
      readFile(f('server.key'), 'utf8'),
    ]);
    return { caCert, serverCert, serverKey };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
