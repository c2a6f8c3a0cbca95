// The flags the DaemonSet and its variants pass (--platform, --pods-dir,
// --status-listen, --namespaces): parsed and validated. The KubeVirt preset's
// effect on the libvirt settings is tested with the preset itself.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, loadConfig } from '../../src/config/config.ts';

const cluster = (args: string[], env: NodeJS.ProcessEnv = {}) =>
  loadConfig(args, { NODE_NAME: 'n1', ...env }, '/work')!;

test('cluster defaults: kubevirt platform, /pods, status detail on loopback 8090, all namespaces', () => {
  const c = cluster([]);
  assert.equal(c.libvirt.platform, 'kubevirt');
  assert.equal(c.libvirt.podsDir, '/pods');
  assert.deepEqual(c.statusListen, { host: '127.0.0.1', port: 8090 });
  assert.equal(c.namespaces, undefined);
});

test('local defaults: libvirt platform, one listener for everything', () => {
  const c = loadConfig(['--local', 'examples', '--listen', '127.0.0.1:9999'], {}, '/srv')!;
  assert.equal(c.libvirt.platform, 'libvirt');
  assert.deepEqual(c.statusListen, { host: '127.0.0.1', port: 9999 });
});

test('explicit values and their environment fallbacks', () => {
  const c = cluster([
    '--platform=libvirt',
    '--pods-dir=kubelet-pods',
    '--status-listen=0.0.0.0:9000',
    '--namespaces=team-a, team-b,team-a',
  ]);
  assert.equal(c.libvirt.platform, 'libvirt');
  assert.equal(c.libvirt.podsDir, '/work/kubelet-pods');
  assert.deepEqual(c.statusListen, { host: '0.0.0.0', port: 9000 });
  assert.deepEqual(c.namespaces, ['team-a', 'team-b'], 'trimmed, each once');
  assert.ok(Object.isFrozen(c.namespaces));
  const e = cluster([], { VMSEED_PLATFORM: 'libvirt', VMSEED_NAMESPACES: 'x' });
  assert.equal(e.libvirt.platform, 'libvirt');
  assert.deepEqual(e.namespaces, ['x']);
});

test('bad values are one-line ConfigErrors naming the flag', () => {
  assert.throws(
    () => cluster(['--platform=openstack']),
    (e: unknown) =>
      e instanceof ConfigError && /--platform: 'openstack' is not one of kubevirt, libvirt/.test(e.message),
  );
  assert.throws(
    () => cluster(['--status-listen=8090']),
    (e: unknown) => e instanceof ConfigError && /--status-listen/.test(e.message),
  );
  for (const bad of ['', 'team-a,', 'Team-A', 'a/b', 'x'.repeat(64)]) {
    assert.throws(
      () => cluster([`--namespaces=${bad}`]),
      (e: unknown) => e instanceof ConfigError && /^--namespaces: /.test(e.message),
      JSON.stringify(bad),
    );
  }
});
