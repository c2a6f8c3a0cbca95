// A VM's identity is its launcher pod: with this node's pods known
// (KubeVirt), the datasource answers a VMI only from the address the kubelet
// reports for its current launcher pod (status.podIPs of a pod in
// status.activePods), on every path that answers by identity, token paths
// included. Each "pod" is a 127.0.0.x source address. Addresses the guest
// reports (status.interfaces) count for nothing, a token read from a VMI's
// spec is no credential elsewhere, and /v1/token hands out only a token whose
// claims name the VMI's namespace, ServiceAccount and launcher pod.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { AgentSeedDirectory } from '../../src/datasource/directory.ts';
import { DatasourceKeyring } from '../../src/datasource/tokens.ts';
import { launcherTokenReader } from '../../src/agent/domain/launcher-token.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import type { NodePod, NodePods } from '../../src/datasource/types.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { vmi } from '../support/agent-harness.ts';
import { nocloudSeed, quietLogger, randomKey } from './datasource-fixtures.ts';
import { TIMESTAMP_DIR, get, jwt, projectedToken } from './imds-support.ts';

const NODE = 'node-a';
const NS = 'tenant';
const POD = {
  a: 'aaaaaaaa-1111-4111-8111-000000000001',
  b: 'bbbbbbbb-1111-4111-8111-000000000002',
  c: 'cccccccc-1111-4111-8111-000000000003',
  d: 'dddddddd-1111-4111-8111-000000000004',
  e1: 'eeeeeeee-1111-4111-8111-000000000005',
  e2: 'eeeeeeee-1111-4111-8111-000000000006',
  f: 'ffffffff-1111-4111-8111-000000000007',
};
// Launcher pod IPs: a at .11, b at .12, and so on.
const IP = {
  a: '127.0.0.11',
  b: '127.0.0.12',
  c: '127.0.0.13',
  d: '127.0.0.14',
  e1: '127.0.0.15',
  e2: '127.0.0.16',
  f: '127.0.0.17',
  f2: '127.0.0.18',
};
// Any other pod of the cluster: where a namespace viewer runs curl.
const VIEWER = '127.0.0.50';
const MD = { Metadata: 'true' };

class FakePods implements NodePods {
  readonly pods = new Map<string, NodePod>();
  revision = 0;
  get(uid: string): NodePod | undefined {
    return this.pods.get(uid);
  }
  add(uid: string, name: string, owner: string, ips: string[], namespace = NS): void {
    this.pods.set(uid, { uid, name, namespace, owners: [owner], ips });
    this.revision++;
  }
}

function launcherToken(name: string, pod: string, over: Record<string, unknown> = {}): string {
  return jwt({
    exp: 1_800_000_000,
    'kubernetes.io': {
      namespace: NS,
      serviceaccount: { name: `sa-${name}` },
      pod: { name: `virt-launcher-${name}`, uid: pod },
      ...over,
    },
  });
}

// An IMDS VMI with a serviceAccount volume, its launcher pods on this node,
// and whatever addresses its guest agent reports.
function imdsVmi(name: string, pods: string[], reported: string[], status: Record<string, unknown> = {}): VmiObject {
  const v = vmi(name, { namespace: NS });
  v.metadata.uid = `uid-${name}`;
  v.metadata.annotations = { 'imds.kubevirt.io/enabled': 'true' };
  v.spec.volumes = [{ name: 'sa', serviceAccount: { serviceAccountName: `sa-${name}` } }];
  v.status = {
    nodeName: NODE,
    phase: 'Running',
    activePods: Object.fromEntries(pods.map((p) => [p, NODE])),
    interfaces: reported.map((ip, i) => ({ name: `if${i}`, ipAddress: ip })),
    ...status,
  };
  return v;
}

let server: DatasourceServer;
let podsDir: string;
const keyring = new DatasourceKeyring([randomKey()]);
const pods = new FakePods();
const seeds = new AgentSeedDirectory({ onFetch: () => {}, nodeName: NODE, pods });
const metrics = createMetrics({ version: 'test', processMetrics: false });
const put = (v: VmiObject) =>
  seeds.put(`${NS}/${v.metadata.name}`, v, nocloudSeed(v.metadata.name, { delivery: 'http' }));
const fetchFrom = (from: string, path: string) => get(server.address.port, path, MD, from);

before(async () => {
  podsDir = await mkdtemp(join(tmpdir(), 'vmseed-launchers-'));
  for (const n of ['a', 'b', 'e1', 'e2'] as const) {
    const name = n.startsWith('e') ? 'e' : n;
    await projectedToken(
      podsDir,
      POD[n],
      launcherToken(name, POD[n], { pod: { name: `virt-launcher-${n}`, uid: POD[n] } }),
    );
    pods.add(POD[n], `virt-launcher-${n}`, `uid-${name}`, [IP[n]]);
  }
  await projectedToken(podsDir, POD.d, launcherToken('d', POD.d));
  pods.add(POD.d, 'virt-launcher-d', 'uid-d', [IP.d]);
  // a's guest agent claims b's launcher address besides its own.
  put(imdsVmi('a', [POD.a], [IP.a, IP.b]));
  put(imdsVmi('b', [POD.b], [IP.b]));
  put(imdsVmi('d', [POD.d], [IP.d]));
  server = await startDatasourceServer({
    listen: { host: '127.0.0.1', port: 0 },
    directory: seeds,
    keyring,
    logger: quietLogger,
    metrics,
    compatSourceAddress: true,
    readServiceAccountToken: launcherTokenReader(podsDir),
  });
});

after(async () => {
  await server.close();
  await rm(podsDir, { recursive: true, force: true });
});

test('the serial from the VMI spec opens nothing from an address that is not its launcher pod', async () => {
  const token = keyring.sign('uid-b');
  for (const path of ['meta-data', 'user-data', 'identity', 'token']) {
    assert.equal((await fetchFrom(VIEWER, `/v1/${token}/${path}`)).status, 404, `${path} from a viewer's pod`);
    assert.equal((await fetchFrom(IP.a, `/v1/${token}/${path}`)).status, 404, `${path} from another VMI's pod`);
  }
  const own = await fetchFrom(IP.b, `/v1/${token}/user-data`);
  assert.equal(own.status, 200);
  assert.match(own.body, /secret-of-b/);
  assert.equal((await fetchFrom(IP.b, `/v1/${token}/identity`)).status, 200);
});

test("a guest claiming its neighbour's address changes nothing for the neighbour and gets it nothing", async () => {
  const b = await fetchFrom(IP.b, '/v1/user-data');
  assert.equal(b.status, 200);
  assert.match(b.body, /secret-of-b/);
  assert.deepEqual(JSON.parse((await fetchFrom(IP.b, '/v1/identity')).body), {
    namespace: NS,
    serviceAccountName: 'sa-b',
    vmName: 'b',
  });
  const token = await fetchFrom(IP.b, '/v1/token');
  assert.equal(token.status, 200);
  assert.equal(JSON.parse(token.body).token, launcherToken('b', POD.b));
  // The attacker's own address answers with its own seed, never b's.
  const a = await fetchFrom(IP.a, '/v1/user-data');
  assert.match(a.body, /secret-of-a/);
  assert.doesNotMatch(a.body, /secret-of-b/);
  assert.equal((await fetchFrom(IP.a, `/v1/${keyring.sign('uid-b')}/meta-data`)).status, 404);
  assert.equal((await fetchFrom(IP.a, '/openstack/latest/user_data')).status, 200);
  assert.match((await fetchFrom(IP.b, '/openstack/latest/user_data')).body, /secret-of-b/);
});

test('a launcher pod not known yet gets 404, not the seed of the VMI that reports its address', async () => {
  put(imdsVmi('c', [POD.c], [IP.c]));
  assert.equal((await fetchFrom(IP.c, '/v1/meta-data')).status, 404);
  assert.equal((await fetchFrom(IP.c, '/v1/identity')).status, 404);
  assert.equal((await fetchFrom(IP.c, `/v1/${keyring.sign('uid-c')}/meta-data`)).status, 404);
  // A pod of this node that is not the VMI's (another owner) does not count.
  pods.add(POD.c, 'virt-launcher-c', 'uid-someone-else', [IP.c]);
  assert.equal((await fetchFrom(IP.c, '/v1/meta-data')).status, 404);
  pods.add(POD.c, 'virt-launcher-c', 'uid-c', [IP.c]);
  assert.equal((await fetchFrom(IP.c, '/v1/meta-data')).status, 200);
  // Two VMIs claiming one launcher address: neither is answered.
  pods.add(POD.c, 'virt-launcher-c', 'uid-c', [IP.c, IP.b]);
  assert.equal((await fetchFrom(IP.b, '/v1/meta-data')).status, 404);
  pods.add(POD.c, 'virt-launcher-c', 'uid-c', [IP.c]);
  assert.equal((await fetchFrom(IP.b, '/v1/meta-data')).status, 200);
});

test('/v1/token refuses, and counts, a token whose claims name another namespace, ServiceAccount or pod', async () => {
  const file = join(
    podsDir,
    POD.d,
    'volumes',
    'kubernetes.io~projected',
    'kube-api-access-x7k2p',
    TIMESTAMP_DIR,
    'token',
  );
  const bad = {
    namespace: launcherToken('d', POD.d, { namespace: 'other' }),
    serviceaccount: launcherToken('d', POD.d, { serviceaccount: { name: 'sa-admin' } }),
    pod: launcherToken('d', POD.d, { pod: { name: 'virt-launcher-b', uid: POD.b } }),
    unreadable: jwt({ exp: 1_800_000_000 }),
  };
  for (const [reason, token] of Object.entries(bad)) {
    await writeFile(file, `${token}\n`);
    assert.equal((await fetchFrom(IP.d, '/v1/token')).status, 404, reason);
  }
  // Right UID, another pod's name.
  await writeFile(file, `${launcherToken('d', POD.d, { pod: { name: 'virt-launcher-b', uid: POD.d } })}\n`);
  assert.equal((await fetchFrom(IP.d, '/v1/token')).status, 404);
  const text = await metrics.registry.metrics();
  for (const reason of ['namespace', 'serviceaccount', 'unreadable'])
    assert.match(text, new RegExp(`vmseed_imds_token_refused_total\\{reason="${reason}"\\} 1`));
  assert.match(text, /vmseed_imds_token_refused_total\{reason="pod"\} 2/);
  await writeFile(file, `${launcherToken('d', POD.d)}\n`);
  assert.equal((await fetchFrom(IP.d, '/v1/token')).status, 200);
});

test("a migration's target pod takes over when KubeVirt marks it completed", async () => {
  const migrating = (completed: boolean) =>
    imdsVmi('e', [POD.e1, POD.e2], [IP.e1], {
      migrationState: {
        sourceNode: NODE,
        targetNode: NODE,
        sourcePod: 'virt-launcher-e1',
        targetPod: 'virt-launcher-e2',
        completed,
      },
    });
  put(migrating(false));
  assert.equal((await fetchFrom(IP.e1, '/v1/meta-data')).status, 200);
  assert.equal((await fetchFrom(IP.e2, '/v1/meta-data')).status, 404);
  put(migrating(true));
  assert.equal((await fetchFrom(IP.e1, '/v1/meta-data')).status, 404);
  assert.equal((await fetchFrom(IP.e2, '/v1/meta-data')).status, 200);
  const token = await fetchFrom(IP.e2, '/v1/token');
  assert.equal(token.status, 200);
  assert.equal(
    JSON.parse(token.body).token.split('.')[1],
    launcherToken('e', POD.e2, { pod: { name: 'virt-launcher-e2', uid: POD.e2 } }).split('.')[1],
  );
});

test("a launcher pod's new address answers at once and its old one gets 404 on every path", async () => {
  await projectedToken(podsDir, POD.f, launcherToken('f', POD.f));
  pods.add(POD.f, 'virt-launcher-f', 'uid-f', [IP.f]);
  put(imdsVmi('f', [POD.f], [IP.f]));
  const token = keyring.sign('uid-f');
  const paths = ['/v1/meta-data', '/v1/identity', '/v1/token', `/v1/${token}/user-data`, `/v1/${token}/identity`];
  for (const path of paths) assert.equal((await fetchFrom(IP.f, path)).status, 200, `${path} from its address`);
  // Served requests read what the directory derived once; they do not rebuild it.
  assert.equal(seeds.get('uid-f'), seeds.get('uid-f'));
  pods.add(POD.f, 'virt-launcher-f', 'uid-f', [IP.f2]);
  for (const path of paths) {
    assert.equal((await fetchFrom(IP.f, path)).status, 404, `${path} from the old address`);
    assert.equal((await fetchFrom(IP.f2, path)).status, 200, `${path} from the new address`);
  }
  assert.match((await fetchFrom(IP.f2, `/v1/${token}/user-data`)).body, /secret-of-f/);
  // The pod's name is a launcher fact /v1/token checks the token's claims
  // against: a renamed pod no longer matches the token written for it.
  pods.add(POD.f, 'virt-launcher-f-renamed', 'uid-f', [IP.f2]);
  assert.equal((await fetchFrom(IP.f2, '/v1/token')).status, 404);
  assert.equal((await fetchFrom(IP.f2, '/v1/identity')).status, 200);
  pods.add(POD.f, 'virt-launcher-f', 'uid-f', [IP.f2]);
  assert.equal((await fetchFrom(IP.f2, '/v1/token')).status, 200);
  // The VMI leaving the directory takes its answers with it.
  seeds.drop(`${NS}/f`);
  for (const path of paths) assert.equal((await fetchFrom(IP.f2, path)).status, 404, `${path} once dropped`);
});
