// The admission webhook tests' tools: a certificate directory from the test
// PKI, an HTTPS client that trusts only that PKI's CA, the fixtures, and
// Kubernetes' own JSON Patch (kubectl patch --local, the json-patch library
// the API server applies webhook patches with).
import { execFile } from 'node:child_process';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { testPki, type TestPki } from './test-pki.ts';
import { WEBHOOK_PATH } from '../../src/cluster/webhook/webhook-server.ts';

const run = promisify(execFile);

export type Json = Record<string, any>;

export async function fixtureReview(name: string): Promise<Json> {
  const text = await readFile(new URL(`../fixtures/webhook/${name}.json`, import.meta.url), 'utf8');
  return JSON.parse(text) as Json;
}

// A directory holding the PKI's server pair as tls.crt / tls.key.
export async function certDir(pki: TestPki, dir?: string): Promise<string> {
  const d = dir ?? (await mkdtemp(join(tmpdir(), 'vmseed-webhook-tls-')));
  await writeFile(join(d, 'tls.crt'), pki.serverCert);
  await writeFile(join(d, 'tls.key'), pki.serverKey);
  return d;
}

export { testPki, type TestPki };

export interface Answer {
  status: number;
  body: string;
  json?: Json;
}

export function post(
  port: number,
  ca: string,
  body: string | Buffer,
  // identity: a client certificate to present (--webhook-client-ca).
  options: { path?: string; method?: string; contentType?: string; identity?: { cert: string; key: string } } = {},
): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path: options.path ?? WEBHOOK_PATH,
        method: options.method ?? 'POST',
        ca,
        ...(options.identity ?? {}),
        headers: { 'Content-Type': options.contentType ?? 'application/json' },
        agent: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () => {
          const text = Buffer.concat(chunks).toString('utf8');
          let json: Json | undefined;
          try {
            json = res.headers['content-type'] === 'application/json' ? (JSON.parse(text) as Json) : undefined;
          } catch {
            json = undefined;
          }
          resolve({ status: res.statusCode ?? 0, body: text, ...(json ? { json } : {}) });
        });
        res.on('error', reject);
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

// The patch of an AdmissionReview answer, decoded.
export function patchOf(answer: Answer): Json[] | undefined {
  const p = answer.json?.response?.patch as string | undefined;
  return p === undefined ? undefined : (JSON.parse(Buffer.from(p, 'base64').toString('utf8')) as Json[]);
}

// The object after the API server would apply the patch.
export async function applyPatch(object: Json, patch: Json[]): Promise<Json> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-patch-'));
  try {
    await writeFile(join(dir, 'o.json'), JSON.stringify(object));
    const { stdout } = await run(
      'kubectl',
      ['patch', '--local', '-f', join(dir, 'o.json'), '--type=json', '-p', JSON.stringify(patch), '-o', 'json'],
      { timeout: 30_000 },
    );
    return JSON.parse(stdout) as Json;
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

// A client CA and client certificates it signed (the API server's webhook
// client identity), made with the openssl CLI as test-pki.ts makes the server's.
export interface ClientPki {
  caCert: string;
  // Client certificates (clientAuth) this CA signed, by subject CN.
  clients: Record<string, { cert: string; key: string }>;
}

// A client CA and client certificates it signed, made with the openssl CLI
// as test/support/test-pki.ts makes the server's. `sans`: DNS names per CN.
export async function clientPki(name: string, cns: string[], sans: Record<string, string[]> = {}): Promise<ClientPki> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-client-pki-'));
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
      `/CN=${name}`,
      '-keyout',
      f('ca.key'),
      '-out',
      f('ca.crt'),
      '-addext',
      'basicConstraints=critical,CA:TRUE',
      '-addext',
      'keyUsage=critical,keyCertSign,cRLSign',
    ]);
    const clients: ClientPki['clients'] = {};
    for (const [i, cn] of cns.entries()) {
      await run('openssl', [
        'req',
        '-new',
        ...ec,
        '-subj',
        `/CN=${cn}`,
        '-keyout',
        f(`${i}.key`),
        '-out',
        f(`${i}.csr`),
      ]);
      await writeFile(
        f(`${i}.cnf`),
        [
          'basicConstraints=critical,CA:FALSE',
          'keyUsage=critical,digitalSignature',
          'extendedKeyUsage=clientAuth',
          ...(sans[cn] ? [`subjectAltName=${sans[cn].map((d) => `DNS:${d}`).join(',')}`] : []),
          '',
        ].join('\n'),
      );
      await run('openssl', [
        'x509',
        '-req',
        '-in',
        f(`${i}.csr`),
        '-CA',
        f('ca.crt'),
        '-CAkey',
        f('ca.key'),
        '-CAcreateserial',
        '-days',
        '2',
        '-extfile',
        f(`${i}.cnf`),
        '-out',
        f(`${i}.crt`),
      ]);
      const [cert, key] = await Promise.all([readFile(f(`${i}.crt`), 'utf8'), readFile(f(`${i}.key`), 'utf8')]);
      clients[cn] = { cert, key };
    }
    return { caCert: await readFile(f('ca.crt'), 'utf8'), clients };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}
