// The flags on both sides of the object service: the agent's --objects-*
// (off by default: direct reads) and `vmseed cluster`'s --objects-listen.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, loadConfig } from '../../../src/config/config.ts';
import { loadClusterConfig } from '../../../src/config/cluster-config.ts';

test('agent: --objects-url sends Secret/ConfigMap reads to the service; unset, to the API server', () => {
  assert.equal(loadConfig([], { NODE_NAME: 'n1' }, '/')!.objects, undefined);
  const c = loadConfig(
    ['--objects-url', 'https://vmseed-cluster.vmseed.svc:8444/', '--objects-ca-file', 'ca.crt'],
    { NODE_NAME: 'n1' },
    '/etc/x',
  )!;
  assert.deepEqual(c.objects, {
    url: 'https://vmseed-cluster.vmseed.svc:8444',
    tokenFile: '/var/run/secrets/vmseed/objects/token',
    caFile: '/etc/x/ca.crt',
  });
  assert.throws(() => loadConfig(['--objects-url', 'http://x:8444'], { NODE_NAME: 'n1' }, '/'), ConfigError);
  assert.throws(() => loadConfig(['--local', 'examples', '--objects-url', 'https://x'], {}, '/'), ConfigError);
});

test('cluster: --objects-listen turns the service on, with its defaults', () => {
  assert.equal(loadClusterConfig([], {}, '/')!.objects, undefined);
  const c = loadClusterConfig(['--objects-listen', '0.0.0.0:8444'], {}, '/')!;
  assert.deepEqual(c.objects, {
    listen: { host: '0.0.0.0', port: 8444 },
    certDir: '/etc/vmseed/objects-tls',
    agentServiceAccount: 'vmseed:vmseed',
  });
  assert.throws(
    () => loadClusterConfig(['--objects-listen', ':8444', '--agent-service-account', 'vmseed'], {}, '/'),
    /agent-service-account/,
  );
});

test('cluster: --objects-cert-secret issues its own certificate, its CA published beside it', () => {
  const c = loadClusterConfig(
    ['--objects-listen', '0.0.0.0:8444', '--objects-cert-secret', 'vmseed/vmseed-cluster-tls'],
    {},
    '/',
  )!;
  assert.deepEqual(c.objects?.selfSigned, {
    secret: { namespace: 'vmseed', name: 'vmseed-cluster-tls' },
    caConfigMap: { namespace: 'vmseed', name: 'vmseed-cluster-ca' },
  });
  assert.throws(
    () =>
      loadClusterConfig(
        ['--objects-listen', ':8444', '--objects-cert-secret', 'a/x', '--objects-ca-configmap', 'b/y'],
        {},
        '/',
      ),
    /must be in the namespace of --objects-cert-secret/,
  );
  assert.throws(
    () => loadClusterConfig(['--objects-listen', ':8444', '--objects-cert-secret', 'x'], {}, '/'),
    /--objects-cert-secret: 'x' is not NAMESPACE\/NAME/,
  );
  // The webhook off (the base manifests' cluster component serves objects only).
  assert.equal(loadClusterConfig(['--webhook-listen', 'off'], {}, '/')!.webhook.listen, undefined);
});
