import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ConfigError, loadConfig } from '../../src/config/config.ts';
import { parseDuration } from '../../src/config/values.ts';

test('local mode defaults', () => {
  const c = loadConfig(['--local', 'examples'], {}, '/srv')!;
  assert.equal(c.mode, 'local');
  assert.equal(c.localDir, '/srv/examples');
  assert.equal(c.stateDir, '/srv/var/seeds');
  assert.deepEqual(c.listen, { host: '127.0.0.1', port: 8080 });
  assert.equal(c.libvirt.mode, 'off');
  assert.equal(c.kubevirtVolumes, 'own');
  assert.ok(Object.isFrozen(c) && Object.isFrozen(c.libvirt) && Object.isFrozen(c.listen));
});

test('cluster defaults, NODE_NAME from the environment, flags beat the environment', () => {
  const c = loadConfig([], { NODE_NAME: 'worker-3' }, '/')!;
  assert.equal(c.mode, 'kubernetes');
  assert.equal(c.nodeName, 'worker-3');
  assert.equal(c.stateDir, '/var/lib/vmseed/seeds');
  assert.deepEqual(c.listen, { host: '0.0.0.0', port: 8080 });
  assert.equal(c.kubevirtVolumes, 'ignore');
  // rpc: the preset's launcher socket URI is one the RPC client dials.
  assert.equal(c.libvirt.mode, 'rpc');
  assert.equal(c.kubeconfig, undefined);
  const d = loadConfig(
    ['--node-name', 'flag-node', '--concurrency', '8', '--resync-period', '90s', '--listen', '[::1]:9090'],
    { NODE_NAME: 'env-node', VMSEED_CONCURRENCY: '2', VMSEED_DISK_BUS: 'scsi' },
    '/',
  )!;
  assert.equal(d.nodeName, 'flag-node');
  assert.equal(d.concurrency, 8);
  assert.equal(d.resyncPeriodMs, 90_000);
  assert.deepEqual(d.listen, { host: '::1', port: 9090 });
  assert.equal(d.libvirt.diskBus, 'scsi');
});

test('bad values are one clear ConfigError each', () => {
  const bad: Array<[string[], NodeJS.ProcessEnv, RegExp]> = [
    [[], {}, /--node-name .* required/],
    [['--node-name', 'Bad_Name'], {}, /not a valid Kubernetes node name/],
    [['--local', 'd', '--concurrency', '0'], {}, /--concurrency: 0 is out of range/],
    [['--local', 'd', '--kubevirt-volumes', 'both'], {}, /--kubevirt-volumes: 'both' is not one of own, ignore/],
    [['--local', 'd', '--libvirt', 'qemu'], {}, /--libvirt/],
    [['--local', 'd', '--resync-period', 'soon'], {}, /--resync-period: 'soon' is not a duration/],
    [['--local', 'd', '--listen', '127.0.0.1'], {}, /--listen/],
    [['--local', 'd', '--domain-name', '{vm}'], {}, /unknown placeholder \{vm\}/],
    // Checked here only: the injector and the publisher take the templates as given.
    [['--local', 'd', '--domain-name', '{namespace}-{pod}'], {}, /--domain-name: unknown placeholder \{pod\}/],
    [['--local', 'd', '--image-path-in-domain', '/x/{pod}'], {}, /--image-path-in-domain: unknown placeholder \{pod\}/],
    [['--local', 'd', '--publish-dir', '/pods/{pod}/x'], {}, /--publish-dir: unknown placeholder \{pod\}/],
    [['--local', 'd', '--disk-bus', 'sata'], {}, /--disk-bus: 'sata'/],
    [['--local', 'd'], { VMSEED_LOG_LEVEL: 'loud' }, /--log-level: 'loud'/],
    [['--what'], {}, /Unknown option '--what'/],
    [['--node-name', 'n1', '--context', 'other'], {}, /--context: needs --kubeconfig/],
  ];
  for (const [argv, env, re] of bad) {
    assert.throws(
      () => loadConfig(argv, env, '/'),
      (e: unknown) => e instanceof ConfigError && re.test(e.message) && !e.message.includes('\n'),
      argv.join(' '),
    );
  }
});

test('durations', () => {
  assert.equal(parseDuration('500ms', 'x'), 500);
  assert.equal(parseDuration('2m', 'x'), 120_000);
  assert.equal(parseDuration('1h', 'x'), 3_600_000);
  assert.equal(parseDuration('15', 'x'), 15_000);
  assert.throws(() => parseDuration('0s', 'x'), ConfigError);
});

test('--libvirt rpc: the RPC client under the injector, with the per-call timeout; virsh stays available', async () => {
  const { makeInjector } = await import('../../src/commands/agent/agent-command.ts');
  const c = loadConfig(['--local', 'd', '--libvirt', 'rpc', '--virsh-timeout', '7s'], {}, '/')!;
  assert.equal(c.libvirt.mode, 'rpc');
  const rpc = makeInjector(c)!;
  assert.deepEqual([rpc.client.kind, rpc.client.supportsEvents], ['rpc', true]);
  await rpc.client.close();
  const virsh = makeInjector(loadConfig(['--local', 'd', '--libvirt', 'virsh'], {}, '/')!)!;
  assert.deepEqual([virsh.client.kind, virsh.client.supportsEvents], ['virsh', false]);
  assert.throws(
    () => loadConfig(['--local', 'd', '--libvirt', 'grpc'], {}, '/'),
    (e: unknown) => e instanceof ConfigError && /off, virsh, rpc/.test(e.message),
  );
  // A remote URI: virsh by default, and refused for rpc.
  const ssh = ['--libvirt-uri', 'qemu+ssh://root@host/system', '--platform', 'libvirt', '--resume-via', 'virsh'];
  assert.equal(loadConfig(ssh, { NODE_NAME: 'n' }, '/')!.libvirt.mode, 'virsh');
  assert.equal(
    loadConfig(['--platform', 'libvirt', '--resume-via', 'virsh'], { NODE_NAME: 'n' }, '/')!.libvirt.mode,
    'rpc',
  );
  assert.throws(
    () => loadConfig([...ssh, '--libvirt', 'rpc'], { NODE_NAME: 'n' }, '/'),
    (e: unknown) => e instanceof ConfigError && /--libvirt virsh/.test(e.message),
  );
});
