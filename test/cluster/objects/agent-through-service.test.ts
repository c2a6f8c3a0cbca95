// The whole path with the node agent's RBAC as manifests/daemonset.yaml
// grants it (nothing on Secrets or ConfigMaps): the agent (its own
// controller, object watches and resolver) seeds a VMI from a Secret it
// reads through the object service, an edit of that Secret reseeds it, and
// while the service is down for a minute the agent keeps its seed while a
// new VMI waits (pending, one Normal Event, no Warning), seeded once the
// service is back.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { SecretObject } from '../../../src/api/objects.ts';
import { KubeConnectionApi } from '../../../src/kube/api-client.ts';
import { KubeConnection } from '../../../src/kube/connection.ts';
import { startObjectService, type ObjectService } from '../../../src/cluster/objects/object-server.ts';
import { FakeKube } from '../../support/fake-kube.ts';
import { loadManifestObjects } from '../../support/kube-authz.ts';
import { ROOT } from '../../support/manifests.ts';
import { testPki } from '../../support/test-pki.ts';
import { imageOf, NODE, startAgent, tempDir, vmi, waitFor } from '../../support/agent-harness.ts';
import { captureLogger } from '../../support/capture-logger.ts';

const ADMIN = 'admin-token';

const secret = (name: string, hostname: string): SecretObject => ({
  metadata: { name, namespace: 'default' },
  stringData: { userdata: `#cloud-config\nhostname: ${hostname}\n` },
});

// How long the object service stays down: a restart's worth and more.
const OUTAGE_MS = 60_000;

test('the agent seeds from Secrets it may only read through the object service', { timeout: 150_000 }, async (t) => {
  const fake = await FakeKube.start({
    adminTokens: [ADMIN],
    rbac: loadManifestObjects(`${ROOT}manifests/daemonset.yaml`),
  });
  const dir = await tempDir();
  const pki = await testPki('vmseed-objects');
  const upstream = fake.connection(ADMIN);
  const { logger } = captureLogger('info');
  const start = (port: number) =>
    startObjectService({
      listen: { host: '127.0.0.1', port },
      tls: { cert: pki.serverCert, key: pki.serverKey },
      connection: upstream,
      api: new KubeConnectionApi(upstream, { retry: { retries: 0 } }),
      logger,
      agentServiceAccount: 'vmseed:vmseed',
    });
  let service: ObjectService = await start(0);
  const port = service.address.port;
  fake.registerReviewToken('node-token', {
    username: 'system:serviceaccount:vmseed:vmseed',
    audiences: ['vmseed-cluster'],
    extra: { 'authentication.kubernetes.io/node-name': [NODE] },
  });
  const objects = new KubeConnection({ server: `https://127.0.0.1:${port}`, token: 'node-token', ca: pki.caCert });
  const h = await startAgent(fake, { stateDir: dir.path, objects, resyncPeriodMs: 3_600_000 });
  t.after(async () => {
    await h.stop();
    await objects.close(100);
    await service.close().catch(() => undefined);
    await upstream.close(100);
    await fake.close();
    await dir.remove();
  });

  // The agent's own credential is refused the Secret: only the service reads it.
  const direct = await new KubeConnectionApi(fake.connection(), { retry: { retries: 0 } }).request(
    'GET',
    '/api/v1/namespaces/default/secrets/ud',
  );
  assert.equal(direct.status, 403);

  fake.setSecret(secret('ud', 'one'));
  fake.applyVmi(vmi('v1', { cloudInit: 'secretRef: {name: ud}\n' }));
  const ready = (name: string) => h.agent.status.get(`default/${name}`)?.state === 'ready';
  await waitFor('v1 seeded through the service', () => ready('v1'), 20_000);
  const first = imageOf(h.store, fake.getVmi('default', 'v1')!);
  await waitFor('its watch open', () => service.watches().get(NODE) === 1, 10_000);

  const editedAt = performance.now();
  fake.setSecret(secret('ud', 'two'));
  await waitFor(
    'v1 reseeded after the edit',
    () => ready('v1') && imageOf(h.store, fake.getVmi('default', 'v1')!) !== first,
    20_000,
  );
  t.diagnostic(`Secret edit → reseeded through the service: ${(performance.now() - editedAt).toFixed(0)} ms`);
  const second = imageOf(h.store, fake.getVmi('default', 'v1')!);

  // The service goes down for a minute: v1 keeps its seed; v2's data was
  // never read, so it waits, retried every 50-400 ms all along.
  const downAt = performance.now();
  await service.close();
  fake.setSecret(secret('ud2', 'three'));
  fake.applyVmi(vmi('v2', { cloudInit: 'secretRef: {name: ud2}\n' }));
  await waitFor('v2 tried and waiting', () => {
    const s = h.agent.status.get('default/v2');
    return s !== undefined && s.state !== 'ready' && s;
  });
  while (performance.now() - downAt < OUTAGE_MS) {
    assert.ok(ready('v1'), 'v1 still ready while the service is down');
    assert.equal(imageOf(h.store, fake.getVmi('default', 'v1')!), second, "v1's seed is the one it had");
    await new Promise((r) => setTimeout(r, 5_000));
  }
  assert.ok(!ready('v2'));
  const waiting = h.agent.status.get('default/v2') as { state?: string; problem?: { code?: string } } | undefined;
  const warnings = fake.events().filter((e) => e.involvedObject.name === 'v2' && e.type === 'Warning');
  // Waiting, not failing: pending with the reason, a Normal Event, no Warning.
  assert.equal(waiting?.state, 'pending');
  assert.equal((waiting as { lastError?: { code?: string } }).lastError?.code, 'OBJECTS_SERVICE_UNAVAILABLE');
  assert.deepEqual(warnings, [], 'no Warning Event while the service is down');
  const waitingEvents = fake
    .events()
    .filter((e) => e.involvedObject.name === 'v2' && e.type === 'Normal' && e.reason === 'SeedWaiting');
  assert.equal(waitingEvents.length, 1);
  assert.equal(waitingEvents[0].count, 1, 'one Event when it starts waiting, not one per retry');
  const shown = h.agent.status.get('default/v2')!;
  assert.ok(shown.retries >= 1 && shown.retryAt !== undefined, 'the status says which retry comes when');
  const errors = await h.metrics.registry.getSingleMetricAsString('vmseed_reconcile_errors_total');
  assert.doesNotMatch(errors, /OBJECTS_SERVICE_UNAVAILABLE/, 'no error counted while it waits');

  service = await start(port);
  const backAt = performance.now();
  await waitFor('v2 seeded once the service is back', () => ready('v2'), 30_000);
  t.diagnostic(`service back → v2 seeded: ${(performance.now() - backAt).toFixed(0)} ms`);
  assert.deepEqual(
    fake.events().filter((e) => e.type === 'Warning'),
    [],
    'no Warning Event for the minute without the service',
  );
  assert.ok(
    !fake.requests.some((r) => r.resource === 'secrets' && r.user === fake.user && r.status === 200),
    'no Secret was read with the agent credential',
  );
});
