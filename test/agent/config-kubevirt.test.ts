// Flags for running beside KubeVirt: {podUID} templates, --publish-dir,
// --resume-via; and what `makeInjector` builds from them.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig, configSummary } from '../../src/config.ts';
import { makeInjector } from '../../src/commands/agent.ts';
import { FakeLibvirt } from '../support/fake-libvirt.ts';

const POD_SOCKET = 'qemu+unix:///session?socket=/pods/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock';

test('{podUID} is a placeholder of every per-VMI template; --publish-dir and --resume-via', () => {
  const c = loadConfig(
    ['--libvirt-uri', POD_SOCKET, '--domain-name', '{namespace}_{name}', '--image-path-in-domain', '/var/run/kubevirt/hotplug-disks/{basename}', '--publish-dir', '/pods/{podUID}/volumes/kubernetes.io~empty-dir/hotplug-disks'],
    { NODE_NAME: 'n1' },
    '/',
  )!;
  assert.equal(c.libvirt.uri, POD_SOCKET);
  assert.equal(c.libvirt.publishDir, '/pods/{podUID}/volumes/kubernetes.io~empty-dir/hotplug-disks');
  assert.equal(c.libvirt.resumeVia, 'kubevirt', 'cluster default');
  assert.equal(configSummary(c).resumeVia, 'kubevirt');
  assert.equal(configSummary(c).publishDir, c.libvirt.publishDir);
  const local = loadConfig(['--local', 'd'], {}, '/')!;
  assert.equal(local.libvirt.resumeVia, 'virsh', 'local default');
  assert.equal(local.libvirt.publishDir, undefined);
  assert.equal(loadConfig([], { NODE_NAME: 'n1', VMSEED_RESUME_VIA: 'virsh' }, '/')!.libvirt.resumeVia, 'virsh');
});

test('bad KubeVirt flags: one clear line each', () => {
  const bad: Array<[string[], RegExp]> = [
    [['--node-name', 'n', '--resume-via', 'api'], /--resume-via: 'api' is not one of virsh, kubevirt/],
    [['--node-name', 'n', '--publish-dir', '/pods/{pod}/x'], /--publish-dir: unknown placeholder \{pod\}/],
    [['--node-name', 'n', '--publish-dir', '/x/{basename}'], /--publish-dir: unknown placeholder \{basename\}/],
    [['--local', 'd', '--resume-via', 'kubevirt'], /--resume-via kubevirt needs a cluster/],
  ];
  for (const [argv, re] of bad) {
    assert.throws(() => loadConfig(argv, {}, '/'), (e: unknown) => e instanceof ConfigError && re.test(e.message) && !e.message.includes('\n'), argv.join(' '));
  }
});

test('makeInjector wires --publish-dir, the templates and the resume hook', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'vmseed-cfg-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  const c = loadConfig(
    ['--publish-dir', `${root}/{podUID}/hp`, '--image-path-in-domain', '/var/run/kubevirt/hotplug-disks/{basename}', '--libvirt-uri', 'qemu+unix:///session?socket=/pods/{podUID}/sock'],
    { NODE_NAME: 'n1' },
    '/',
  )!;
  const resumed: string[] = [];
  const lv = new FakeLibvirt();
  lv.domains.set('ns_vm', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const inj = makeInjector(c, async ({ target }) => void resumed.push(target.name), lv)!;
  await mkdir(join(root, 'p1', 'hp'), { recursive: true });
  const image = join(root, 'nocloud.iso');
  await writeFile(image, 'seed');
  const target = { namespace: 'ns', name: 'vm', uid: 'u', datasource: 'nocloud' as const, annotations: { 'vmseed.io/resume-after-seed': 'true' }, launcherPods: ['p1'] };
  const r = await inj.inject(target, image);
  assert.deepEqual([r.action, r.resumed], ['attached', true]);
  assert.deepEqual(resumed, ['vm']);
  assert.ok(lv.uris.every((u) => u === 'qemu+unix:///session?socket=/pods/p1/sock'));
  assert.equal(lv.domains.get('ns_vm')!.live[0]!.sourceFile, '/var/run/kubevirt/hotplug-disks/vmseed-nocloud.iso');
  assert.equal(await readFile(join(root, 'p1', 'hp', 'vmseed-nocloud.iso'), 'utf8'), 'seed');
  assert.equal(makeInjector(loadConfig(['--libvirt', 'off'], { NODE_NAME: 'n1' }, '/')!), undefined);
});
