// `vmseed cluster --objects-cert-secret` as the base manifests run it: the
// object service issues its own certificate into the Secret, publishes the
// CA in the ConfigMap, is not Ready before, and a node agent's connection
// that trusts only that ConfigMap's ca.crt (mounted as --objects-ca-file)
// reads through it under the Service's name.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { startObjects } from '../../../src/commands/cluster/object-service.ts';
import { loadClusterConfig } from '../../../src/config/cluster-config.ts';
import { KubeConnection } from '../../../src/kube/connection.ts';
import { KubeConnectionApi } from '../../../src/kube/api-client.ts';
import { createMetrics } from '../../../src/metrics/metrics.ts';
import { FakeKube } from '../../support/fake-kube.ts';
import { resourceType } from '../../support/fake-kube-objects.ts';
import { vmi, waitFor } from '../../support/agent-harness.ts';
import { captureLogger } from '../../support/capture-logger.ts';

const ADMIN = 'admin-token';

test(
  'the object service issues its own certificate; agents trust it through the published CA',
  { timeout: 60_000 },
  async (t) => {
    const fake = await FakeKube.start({ adminTokens: [ADMIN] });
    // The component's namespace, which the manifests create before it.
    fake.objects.create(
      resourceType('', 'namespaces')!,
      undefined,
      JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'vmseed' } }),
    );
    const dir = await mkdtemp(join(tmpdir(), 'vmseed-self-issued-'));
    const kubeconfig = await fake.writeKubeconfig(dir, ADMIN);
    const config = loadClusterConfig(
      [
        '--webhook-listen=off',
        '--objects-listen=127.0.0.1:0',
        '--objects-cert-secret=vmseed/vmseed-cluster-tls',
        '--objects-ca-configmap=vmseed/vmseed-cluster-ca',
        `--kubeconfig=${kubeconfig}`,
      ],
      {},
      dir,
    )!;
    const { logger, lines } = captureLogger('info');
    const service = await startObjects(config, logger, createMetrics({ version: 'test' }));
    const conns: KubeConnection[] = [];
    let last: string | undefined;
    t.after(async () => {
      for (const c of conns) await c.close(100);
      await service.close();
      await fake.close();
      await rm(dir, { recursive: true, force: true });
    });

    await waitFor(
      `ready with its certificate`,
      async () => {
        const p = await service.readiness?.();
        if (p) last = p;
        return p === undefined;
      },
      20_000,
    ).catch((e: Error) => assert.fail(`${e.message}: ${last}\n${lines.join('\n')}`));
    const secret = fake.getSecret('vmseed', 'vmseed-cluster-tls');
    assert.equal(secret?.type, 'kubernetes.io/tls');
    const ca = fake.getConfigMap('vmseed', 'vmseed-cluster-ca')?.data?.['ca.crt'];
    assert.match(ca ?? '', /^-----BEGIN CERTIFICATE-----/);
    const caFile = join(dir, 'ca.crt');
    await writeFile(caFile, ca!);

    fake.setSecret({ metadata: { name: 'ud', namespace: 'default' }, stringData: { userdata: '#cloud-config\n' } });
    fake.applyVmi(vmi('v1', { cloudInit: 'secretRef: {name: ud}\n', node: 'node-a' }));
    fake.registerReviewToken('agent-token', {
      username: 'system:serviceaccount:vmseed:vmseed',
      audiences: ['vmseed-cluster'],
      extra: { 'authentication.kubernetes.io/node-name': ['node-a'] },
    });
    // The listener under the Service's name, as the agents dial it.
    const viaLoopback = new KubeConnection({
      server: `https://127.0.0.1:${service.address.port}`,
      serverName: 'vmseed-cluster.vmseed.svc',
      token: 'agent-token',
      caFile,
    });
    conns.push(viaLoopback);
    const got = await new KubeConnectionApi(viaLoopback, { retry: { retries: 0 } }).request(
      'GET',
      '/api/v1/namespaces/default/secrets/ud',
    );
    assert.equal(got.status, 200);
    // Another name than the Service's is not what the certificate names.
    const wrongName = new KubeConnection({
      server: `https://127.0.0.1:${service.address.port}`,
      serverName: 'elsewhere.example',
      token: 'agent-token',
      caFile,
    });
    conns.push(wrongName);
    await assert.rejects(
      new KubeConnectionApi(wrongName, { retry: { retries: 0 } }).request(
        'GET',
        '/api/v1/namespaces/default/secrets/ud',
      ),
    );
    // Nothing of the key in the log.
    const key = Buffer.from(String(secret?.data?.['tls.key'] ?? ''), 'base64').toString();
    assert.ok(key.includes('PRIVATE KEY'));
    const body = key.split('\n').find((l) => l.length > 40)!;
    assert.ok(!lines.some((l) => l.includes(body)));
  },
);
