// Requests carrying X-Forwarded-For or Forwarded are refused on the real
// datasource listener, on every path it has (NoCloud files, IMDS, the
// OpenStack tree, the progress reports, the redirect's challenge, unknown
// paths), whatever the header's case or value; the same requests without
// the header are answered as before, and cloud-init's own NoCloud reader is
// not refused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { reportToken } from '../../src/datasource/reports/report-token.ts';
import { launcherTokenReader } from '../../src/agent/domain/launcher-token.ts';
import { CHALLENGE_PREFIX, newNonce } from '../../src/redirect/challenge.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { MapDirectory, cloudInitReadSeeded, nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { entry, facts, get, jwt, projectedToken, type Answer } from './imds-support.ts';

const POD = '55555555-5555-4555-8555-555555555555';
const TOKEN = jwt({ exp: 1_700_000_000, sub: 'system:serviceaccount:tenant:sa-a' });
const MD = { Metadata: 'true' };
const EVENT = JSON.stringify({ name: 'init-local', event_type: 'start', timestamp: 1, origin: 'cloudinit' });

let server: DatasourceServer;
let port: number;
let podsDir: string;
const keyring = new DatasourceKeyring([randomKey()]);
const dir = new MapDirectory();
const metrics = createMetrics({ version: 'test', processMetrics: false });
const reported: string[] = [];

before(async () => {
  podsDir = await mkdtemp(join(tmpdir(), 'vmseed-forwarded-'));
  await projectedToken(podsDir, POD, TOKEN);
  const a = facts({ serviceAccountName: 'sa-a', serviceAccountToken: true, launcherPods: [POD] });
  dir.add(entry('a', nocloudSeed('a', { delivery: 'http' }), a), ['127.0.0.1']);
  server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: dir,
    keyring,
    logger: quietLogger,
    metrics,
    compatSourceAddress: true,
    readServiceAccountToken: launcherTokenReader(podsDir),
    reports: {
      sink: {
        report: (e) => {
          reported.push(e.uid);
          return true;
        },
      },
    },
  });
  port = server.address.port;
});

after(async () => {
  await server.close();
  await rm(podsDir, { recursive: true, force: true });
});

function post(path: string, body: string, headers: Record<string, string>): Promise<Answer> {
  return new Promise((resolve, reject) => {
    const req = request(
      {
        host: '127.0.0.1',
        port,
        path,
        method: 'POST',
        headers: { ...headers, 'Content-Length': String(Buffer.byteLength(body)) },
        agent: false,
      },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (c: Buffer) => chunks.push(c));
        res.on('end', () =>
          resolve({ status: res.statusCode ?? 0, headers: res.headers, body: Buffer.concat(chunks).toString() }),
        );
      },
    );
    req.on('error', reject);
    req.end(body);
  });
}

async function refused(reason: string): Promise<number> {
  const m = await metrics.datasourceForwardedRefused.get();
  return m.values.find((v) => v.labels.reason === reason)?.value ?? 0;
}

const FORWARDED: Array<[Record<string, string>, string]> = [
  [{ 'X-Forwarded-For': '127.0.0.1' }, 'x-forwarded-for'],
  [{ 'x-forwarded-for': '' }, 'x-forwarded-for'],
  [{ Forwarded: 'for=127.0.0.1' }, 'forwarded'],
  [{ FORWARDED: 'for="[::1]";proto=http' }, 'forwarded'],
];

test('every path refuses a forwarded request with 400 and a clear body, counted by header', async () => {
  const token = keyring.sign('uid-a');
  const paths: Array<[string, Record<string, string>]> = [
    [`/v1/${token}/meta-data`, {}],
    [`/v1/${token}/user-data`, {}],
    ['/v1/meta-data', {}],
    ['/v1/identity', MD],
    ['/v1/token', MD],
    [`/v1/${token}/token`, MD],
    ['/openstack/latest/meta_data.json', {}],
    [`${CHALLENGE_PREFIX}${newNonce()}`, {}],
    ['/no/such/path', {}],
  ];
  const before = { xff: await refused('x-forwarded-for'), fwd: await refused('forwarded') };
  let count = 0;
  for (const [path, base] of paths) {
    for (const [h] of FORWARDED) {
      for (const method of ['GET', 'HEAD']) {
        const r = await get(port, path, { ...base, ...h }, '127.0.0.1', method);
        assert.equal(r.status, 400, `${method} ${path} ${JSON.stringify(h)}`);
        assert.equal(r.headers.connection, 'close');
        if (method === 'GET') {
          assert.match(r.body, /^forwarded requests are refused/);
          assert.ok(!r.body.includes(TOKEN) && !r.body.includes('127.0.0.1') && !r.body.includes('iid-a'));
        }
        count++;
      }
    }
  }
  // The progress report, with its body unread.
  for (const [h] of FORWARDED) {
    const r = await post(`/v1/${reportToken(keyring, 'uid-a')}/cloud-init-events`, EVENT, h);
    assert.equal(r.status, 400, JSON.stringify(h));
    assert.match(r.body, /^forwarded requests are refused/);
    count++;
  }
  assert.equal(reported.length, 0);
  const xff = (await refused('x-forwarded-for')) - before.xff;
  const fwd = (await refused('forwarded')) - before.fwd;
  assert.equal(xff + fwd, count);
  assert.equal(xff, fwd);
});

test('the same requests without the header are answered as before', async () => {
  const token = keyring.sign('uid-a');
  assert.equal((await get(port, `/v1/${token}/meta-data`)).status, 200);
  const id = await get(port, '/v1/identity', { ...MD, 'X-Real-IP': '127.0.0.9' });
  assert.equal(id.status, 200);
  assert.equal(JSON.parse(id.body).vmName, 'a');
  assert.equal((await get(port, '/openstack/latest/meta_data.json')).status, 200);
  const r = await post(`/v1/${reportToken(keyring, 'uid-a')}/cloud-init-events`, EVENT, {});
  assert.equal(r.status, 200);
  assert.deepEqual(reported, ['uid-a']);
});

test("cloud-init's own NoCloud reader sends no forwarding header and is served", async () => {
  const before = (await refused('x-forwarded-for')) + (await refused('forwarded'));
  const read = await cloudInitReadSeeded(`${server.baseUrl}/${keyring.sign('uid-a')}/`);
  assert.ok(read.ok, read.error);
  assert.match(JSON.stringify(read.md), /iid-a/);
  assert.equal((await refused('x-forwarded-for')) + (await refused('forwarded')), before);
});
