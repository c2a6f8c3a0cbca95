// The cluster component's object service beside an agent run from the
// DaemonSet's own spec (e2e/support/daemonset-agent.ts), for tests that
// have the fake API server but no cluster component pod: the real object
// service in this process, with the component's own service-account token
// and the RBAC manifests/cluster.yaml grants it, and what the kubelet gives
// the agent pod for it: the projected token (audience vmseed-cluster,
// registered for TokenReview with the node's name, as a pod-bound token
// carries it) and the vmseed-cluster-ca ConfigMap volume. The agent dials
// it on loopback (`objects-url` override) instead of the Service's name.
import { mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomUUID } from 'node:crypto';
import { pino } from 'pino';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { startObjectService, type ObjectService } from '../../src/cluster/objects/object-server.ts';
import type { FakeKube } from './fake-kube.ts';
import { testPki } from './test-pki.ts';

/** What startDaemonSetAgent needs to send the agent through the service. */
export interface ClusterObjects {
  // By volume name: the projected token and the CA ConfigMap.
  volumeDirs: Record<string, string>;
  // The node's datasource key directory (hostPath /var/lib/vmseed/keys).
  keyDir: string;
  overrides: Record<string, string>;
  service: ObjectService;
  close(): Promise<void>;
}

/** Starts the object service for `node`'s agent against `fake`. */
export async function startClusterObjects(fake: FakeKube, node: string): Promise<ClusterObjects> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-cluster-objects-'));
  const pki = await testPki('vmseed-objects');
  const upstream = fake.connection(fake.serviceAccountToken('vmseed', 'vmseed-cluster'));
  const service = await startObjectService({
    listen: { host: '127.0.0.1', port: 0 },
    tls: { cert: pki.serverCert, key: pki.serverKey },
    connection: upstream,
    api: new KubeConnectionApi(upstream),
    logger: pino({ level: 'silent' }),
    agentServiceAccount: 'vmseed:vmseed',
  });
  const token = `objects-${randomUUID()}`;
  fake.registerReviewToken(token, {
    username: 'system:serviceaccount:vmseed:vmseed',
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/node-name': [node] },
  });
  const tokenDir = join(dir, 'objects-token');
  const caDir = join(dir, 'objects-ca');
  const keyDir = join(dir, 'keys');
  for (const d of [tokenDir, caDir, keyDir]) await mkdir(d, { recursive: true, mode: 0o755 });
  await writeFile(join(tokenDir, 'token'), token, { mode: 0o644 });
  await writeFile(join(caDir, 'ca.crt'), pki.caCert, { mode: 0o644 });
  return {
    volumeDirs: { 'objects-token': tokenDir, 'objects-ca': caDir },
    keyDir,
    overrides: { 'objects-url': `https://127.0.0.1:${service.address.port}` },
    service,
    close: async () => {
      await service.close();
      await upstream.close(100);
      await rm(dir, { recursive: true, force: true });
    },
  };
}
