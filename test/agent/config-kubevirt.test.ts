// --platform kubevirt|libvirt (a preset of the libvirt side) and --pods-dir;
// single flags overriding the preset; and what `makeInjector` builds.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, loadConfig, configSummary } from '../../src/config/config.ts';
import { makeInjector } from '../../src/commands/agent/agent-command.ts';
import { FakeLibvirt } from '../support/fake-libvirt.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';

const POD = '0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01';
const SOCKET = (pods: string) =>
  `qemu+unix:///session?socket=${pods}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`;

test('cluster default: the kubevirt preset (launcher socket, ephemeral-disks/vmseed, scsi, unpause)', () => {
  const c = loadConfig([], { NODE_NAME: 'n1' }, '/')!;
  assert.equal(c.libvirt.platform, 'kubevirt');
  assert.equal(c.libvirt.podsDir, '/pods');
  assert.equal(c.libvirt.uri, SOCKET('/pods'));
  assert.equal(c.libvirt.publishDir, '/pods/{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks/vmseed');
  assert.equal(c.libvirt.imagePathInDomain, '/var/run/kubevirt-ephemeral-disks/vmseed/{basename}');
  assert.equal(c.libvirt.diskBus, 'scsi');
  assert.equal(c.libvirt.resumeVia, 'kubevirt');
  const s = configSummary(c);
  assert.deepEqual([s.platform, s.podsDir, s.resumeVia], ['kubevirt', '/pods', 'kubevirt']);
});

test('--pods-dir moves the socket and the publish directory; values in the URI are encoded', () => {
  const c = loadConfig(['--pods-dir', '/k pods'], { NODE_NAME: 'n1' }, '/')!;
  assert.equal(c.libvirt.uri, SOCKET('/k%20pods'));
  assert.equal(c.libvirt.publishDir, '/k pods/{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks/vmseed');
  assert.equal(loadConfig([], { NODE_NAME: 'n1', VMSEED_PODS_DIR: '/p' }, '/')!.libvirt.uri, SOCKET('/p'));
  // A relative --pods-dir is relative to the working directory.
  assert.equal(loadConfig(['--pods-dir', 'pods'], { NODE_NAME: 'n1' }, '/r')!.libvirt.podsDir, '/r/pods');
});

test('local default: the libvirt preset, as before (qemu:///system, the image in place, virtio, virsh resume)', () => {
  const c = loadConfig(['--local', 'd'], {}, '/')!;
  assert.deepEqual(
    [
      c.libvirt.platform,
      c.libvirt.uri,
      c.libvirt.imagePathInDomain,
      c.libvirt.publishDir,
      c.libvirt.diskBus,
      c.libvirt.resumeVia,
    ],
    ['libvirt', 'qemu:///system', '{path}', undefined, 'virtio', 'virsh'],
  );
  const cluster = loadConfig(['--platform', 'libvirt'], { NODE_NAME: 'n1' }, '/')!;
  assert.deepEqual(
    [cluster.libvirt.uri, cluster.libvirt.publishDir, cluster.libvirt.resumeVia, cluster.libvirt.diskBus],
    ['qemu:///system', undefined, 'virsh', 'virtio'],
  );
  assert.equal(configSummary(cluster).podsDir, undefined);
});

test('single flags override single preset values', () => {
  const c = loadConfig(
    [
      '--libvirt-uri',
      'qemu+unix:///session?socket=/run/{podUID}.sock',
      '--image-path-in-domain',
      '/x/{basename}',
      '--publish-dir',
      '/pods/{podUID}/p',
      '--disk-bus',
      'virtio',
    ],
    { NODE_NAME: 'n1' },
    '/',
  )!;
  assert.deepEqual(
    [
      c.libvirt.platform,
      c.libvirt.uri,
      c.libvirt.imagePathInDomain,
      c.libvirt.publishDir,
      c.libvirt.diskBus,
      c.libvirt.resumeVia,
    ],
    [
      'kubevirt',
      'qemu+unix:///session?socket=/run/{podUID}.sock',
      '/x/{basename}',
      '/pods/{podUID}/p',
      'virtio',
      'kubevirt',
    ],
  );
  assert.equal(
    loadConfig(['--platform', 'libvirt', '--resume-via', 'kubevirt'], { NODE_NAME: 'n1' }, '/')!.libvirt.resumeVia,
    'kubevirt',
  );
});

test('bad combinations: one clear line each', () => {
  const bad: Array<[string[], RegExp]> = [
    [
      ['--node-name', 'n', '--platform', 'kubevirt', '--resume-via', 'virsh'],
      /--resume-via virsh cannot be used with --platform kubevirt/,
    ],
    [['--node-name', 'n', '--resume-via', 'virsh'], /--resume-via virsh cannot be used with --platform kubevirt/],
    [['--node-name', 'n', '--platform', 'kvm'], /--platform: 'kvm' is not one of kubevirt, libvirt/],
    [['--node-name', 'n', '--resume-via', 'api'], /--resume-via: 'api' is not one of virsh, kubevirt/],
    [['--node-name', 'n', '--publish-dir', '/pods/{pod}/x'], /--publish-dir: unknown placeholder \{pod\}/],
    [['--node-name', 'n', '--publish-dir', '/x/{basename}'], /--publish-dir: unknown placeholder \{basename\}/],
    [['--local', 'd', '--resume-via', 'kubevirt'], /--resume-via kubevirt needs a cluster/],
    [['--local', 'd', '--platform', 'kubevirt'], /--platform kubevirt needs a cluster/],
    [
      ['--node-name', 'n', '--pods-dir', '/var/lib/kubelet/pods/a/very/long/mount/point'],
      /socket path \d+ bytes, over the 107/,
    ],
  ];
  for (const [argv, re] of bad) {
    assert.throws(
      () => loadConfig(argv, {}, '/'),
      (e: unknown) => e instanceof ConfigError && re.test(e.message) && !e.message.includes('\n'),
      argv.join(' '),
    );
  }
  // With the socket overridden the long --pods-dir is not the socket's.
  assert.doesNotThrow(() =>
    loadConfig(
      [
        '--node-name',
        'n',
        '--pods-dir',
        '/var/lib/kubelet/pods/a/very/long/mount/point',
        '--libvirt-uri',
        'qemu:///system',
      ],
      {},
      '/',
    ),
  );
});

test('makeInjector, kubevirt preset: the launcher socket, vmseed/ created in ephemeral-disks, scsi sdzz live only, KubeVirt resumes', async (t) => {
  const root = await mkdtemp(join(tmpdir(), 'vmseed-cfg-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  // The socket path must fit a sun_path (a temp root would not): the preset
  // with /pods, its publish directory moved under the temp root.
  // --libvirt virsh: the fake below is a virsh (rpc is the default).
  const preset = loadConfig(['--libvirt', 'virsh'], { NODE_NAME: 'n1' }, '/')!;
  const c = {
    ...preset,
    libvirt: {
      ...preset.libvirt,
      publishDir: parseTemplate('publish-dir', preset.libvirt.publishDir!.replace(/^\/pods/, root)),
    },
  };
  const resumed: string[] = [];
  const lv = new FakeLibvirt();
  lv.domains.set('ns_vm', { state: 'paused', persistent: true, live: [], config: [], unplugs: true, scsi: true });
  const inj = makeInjector(c, async ({ target }) => void resumed.push(target.name), lv)!;
  const ephemeral = join(root, POD, 'volumes/kubernetes.io~empty-dir/ephemeral-disks');
  await mkdir(ephemeral, { recursive: true });
  const image = join(root, 'nocloud-0123456789abcdef.iso');
  await writeFile(image, 'seed');
  const target = {
    namespace: 'ns',
    name: 'vm',
    uid: 'u',
    datasource: 'nocloud' as const,
    annotations: { 'vmseed.io/resume-after-seed': 'true' },
    launcherPods: [POD],
  };
  const r = await inj.inject(target, image, { resume: true });
  assert.deepEqual([r.action, r.resumed, r.flags, r.targetDev, r.bus], ['attached', true, ['--live'], 'sdzz', 'scsi']);
  assert.deepEqual(resumed, ['vm']);
  assert.ok(
    lv.uris.every(
      (u) =>
        u === `qemu+unix:///session?socket=/pods/${POD}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`,
    ),
  );
  assert.deepEqual(lv.domains.get('ns_vm')!.config, [], 'never --config on KubeVirt');
  const disk = lv.domains.get('ns_vm')!.live[0];
  assert.deepEqual(
    [disk.sourceFile, disk.alias],
    ['/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-nocloud-0123456789abcdef.iso', 'ua-vmseed_seed'],
  );
  assert.equal(await readFile(join(ephemeral, 'vmseed', 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'), 'seed');
  assert.equal(
    lv.calls.some((c) => c[0] === 'resume'),
    false,
  );
  assert.equal(makeInjector(loadConfig(['--libvirt', 'off'], { NODE_NAME: 'n1' }, '/')!), undefined);
  // Built without KubeVirt's unpause, the kubevirt platform still never runs virsh resume.
  lv.domains.set('ns_vm2', { state: 'paused', persistent: true, live: [], config: [], unplugs: true, scsi: true });
  await assert.rejects(
    makeInjector(c, undefined, lv)!.inject({ ...target, name: 'vm2' }, image, { resume: true }),
    (e: unknown) => e instanceof Error && /unpause API only/.test(e.message),
  );
  assert.equal(
    lv.calls.some((c) => c[0] === 'resume'),
    false,
  );
});

test('makeInjector, libvirt preset: live and config, virtio vdzz', async () => {
  const c = loadConfig(['--platform', 'libvirt', '--libvirt', 'virsh'], { NODE_NAME: 'n1' }, '/')!;
  const lv = new FakeLibvirt();
  lv.domains.set('ns_vm', { state: 'running', persistent: true, live: [], config: [], unplugs: true });
  const inj = makeInjector(c, undefined, lv)!;
  const r = await inj.inject(
    { namespace: 'ns', name: 'vm', uid: 'u', datasource: 'nocloud', annotations: {} },
    '/var/lib/vmseed/seeds/nocloud.iso',
  );
  assert.deepEqual([r.action, r.flags, r.targetDev], ['attached', ['--live', '--config'], 'vdzz']);
  for (const view of [lv.domains.get('ns_vm')!.live, lv.domains.get('ns_vm')!.config]) {
    assert.deepEqual(
      view.map((d) => [d.alias, d.targetDev, d.sourceFile]),
      [['ua-vmseed_seed', 'vdzz', '/var/lib/vmseed/seeds/nocloud.iso']],
    );
  }
});
