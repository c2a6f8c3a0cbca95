// The injector reaching a VM inside its KubeVirt launcher pod: {podUID} from
// status.activePods, the image published into the pod's hotplug-disks
// directory (a temp dir stands for the kubelet's pods root), removed on eject.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { ImageStore } from '../../src/disk/store.ts';
import { VirshInjector } from '../../src/libvirt/injector.ts';
import { launcherPodsOnNode } from '../../src/libvirt/launcher-pod.ts';
import { DirPublisher, identityPublisher } from '../../src/libvirt/publish.ts';
import { VmseedError } from '../../src/errors.ts';
import type { InjectionTarget } from '../../src/libvirt/types.ts';
import { FakeLibvirt } from '../support/fake-libvirt.ts';

const HOTPLUG = 'volumes/kubernetes.io~empty-dir/hotplug-disks';
const URI = 'qemu+unix:///session?socket={root}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock';
const T: InjectionTarget = { namespace: 'ns1', name: 'vm1', uid: 'u-1', datasource: 'nocloud', annotations: {}, launcherPods: ['pod-b'] };

async function setup(t: { after(fn: () => Promise<void>): void }) {
  const root = await mkdtemp(join(tmpdir(), 'vmseed-pods-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  const lv = new FakeLibvirt();
  lv.domains.set('ns1_vm1', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const inj = new VirshInjector({
    spawner: lv,
    uriTemplate: URI.replace('{root}', root),
    imagePathTemplate: '/var/run/kubevirt/hotplug-disks/{basename}',
    publisher: new DirPublisher({ dirTemplate: `${root}/{podUID}/${HOTPLUG}` }),
    sleep: async () => {},
  });
  const image = join(root, 'state-nocloud.iso');
  await writeFile(image, 'seed one');
  return { root, lv, inj, image, published: join(root, 'pod-b', HOTPLUG, 'vmseed-state-nocloud.iso') };
}

const code = (c: string, kind?: string) => (e: unknown) => e instanceof VmseedError && e.code === c && (kind === undefined || e.kind === kind);

test('active pods: only this node\'s, sorted; anything else is none', () => {
  assert.deepEqual(launcherPodsOnNode({ 'pod-z': 'node-a', 'pod-x': 'node-b', 'pod-a': 'node-a' }, 'node-a'), ['pod-a', 'pod-z']);
  assert.deepEqual(launcherPodsOnNode({ 'pod-x': 'node-b' }, 'node-a'), []);
  assert.deepEqual(launcherPodsOnNode(undefined, 'node-a'), []);
  assert.deepEqual(launcherPodsOnNode('garbage', 'node-a'), []);
});

test('{podUID}: the socket of the launcher on this node, the image copied into its hotplug-disks', async (t) => {
  const { root, lv, inj, image, published } = await setup(t);
  await mkdir(join(root, 'pod-b', HOTPLUG), { recursive: true });
  const r = await inj.inject(T, image);
  assert.equal(r.action, 'attached');
  assert.ok(lv.uris.every((u) => u === `qemu+unix:///session?socket=${root}/pod-b/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`));
  assert.equal(lv.domains.get('ns1_vm1')!.live[0]!.sourceFile, '/var/run/kubevirt/hotplug-disks/vmseed-state-nocloud.iso');
  assert.equal(await readFile(published, 'utf8'), 'seed one');
  assert.equal((await stat(published)).mode & 0o777, 0o640);

  // Again: identical bytes are not copied again (same inode), nothing attached.
  const ino = (await stat(published)).ino;
  assert.equal((await inj.inject(T, image)).action, 'none');
  assert.equal((await stat(published)).ino, ino);

  // New bytes replace the copy atomically; no temporary is left behind.
  await writeFile(image, 'seed two');
  await inj.inject(T, image);
  assert.equal(await readFile(published, 'utf8'), 'seed two');
  assert.notEqual((await stat(published)).ino, ino);
  assert.deepEqual(await readdir(join(root, 'pod-b', HOTPLUG)), ['vmseed-state-nocloud.iso']);

  // Eject: the disk is detached, then the copy removed.
  assert.equal((await inj.eject(T)).action, 'detached');
  assert.deepEqual(lv.domains.get('ns1_vm1')!.live, []);
  assert.deepEqual(await readdir(join(root, 'pod-b', HOTPLUG)), []);
});

test('content-addressed store images: a changed seed is a new published name, the disk is replaced, the older copy removed after', async (t) => {
  const { root, lv, inj } = await setup(t);
  const hotplug = join(root, 'pod-b', HOTPLUG);
  await mkdir(hotplug, { recursive: true });
  const store = new ImageStore({ root: join(root, 'state') });
  const key = { namespace: 'ns1', name: 'vm1', uid: 'u-1' };
  const v1 = await store.write(key, 'nocloud', new TextEncoder().encode('seed one'), { fsync: false });
  assert.equal((await inj.inject(T, v1.path)).action, 'attached');
  const name1 = `vmseed-${basename(v1.path)}`;
  assert.match(name1, /^vmseed-nocloud-[0-9a-f]{16}\.iso$/);
  assert.equal(lv.domains.get('ns1_vm1')!.live[0]!.sourceFile, `/var/run/kubevirt/hotplug-disks/${name1}`);
  // A KubeVirt hot-plugged volume next to ours is never touched.
  await writeFile(join(hotplug, 'datavol.img'), 'not ours');

  const v2 = await store.write(key, 'nocloud', new TextEncoder().encode('seed two'), { fsync: false });
  const ino1 = (await stat(join(hotplug, name1))).ino;
  const r = await inj.inject(T, v2.path);
  assert.equal(r.action, 'replaced');
  const name2 = `vmseed-${basename(v2.path)}`;
  assert.notEqual(name2, name1);
  assert.equal(lv.domains.get('ns1_vm1')!.live[0]!.sourceFile, `/var/run/kubevirt/hotplug-disks/${name2}`);
  assert.equal(await readFile(join(hotplug, name2), 'utf8'), 'seed two');
  assert.deepEqual((await readdir(hotplug)).sort(), ['datavol.img', name2], 'the older copy pruned after the replace');
  assert.notEqual((await stat(join(hotplug, name2))).ino, ino1);

  // The domain missing: nothing pruned (the old copy may still be in use).
  const v3 = await store.write(key, 'nocloud', new TextEncoder().encode('seed three'), { fsync: false });
  lv.domains.delete('ns1_vm1');
  await assert.rejects(inj.inject(T, v3.path), code('DOMAIN_NOT_FOUND'));
  assert.ok((await readdir(hotplug)).includes(name2));
});

test('launcher pod unknown or ambiguous: LAUNCHER_POD_UNKNOWN, retryable, before any virsh call', async (t) => {
  const { lv, inj, image } = await setup(t);
  await assert.rejects(inj.inject({ ...T, launcherPods: [] }, image), (e: unknown) => code('LAUNCHER_POD_UNKNOWN', 'retryable')(e) && /no launcher pod on this node yet/.test((e as Error).message));
  await assert.rejects(inj.inject({ ...T, launcherPods: undefined }, image), code('LAUNCHER_POD_UNKNOWN', 'retryable'));
  await assert.rejects(inj.inject({ ...T, launcherPods: ['pod-a', 'pod-b'] }, image), (e: unknown) => code('LAUNCHER_POD_UNKNOWN')(e) && /2 launcher pods/.test((e as Error).message));
  assert.deepEqual(lv.calls, []);
});

test('the launcher\'s hotplug-disks directory missing: SEED_PUBLISH_FAILED, retryable, nothing attached', async (t) => {
  const { root, lv, inj, image } = await setup(t);
  await assert.rejects(inj.inject(T, image), (e: unknown) => code('SEED_PUBLISH_FAILED', 'retryable')(e) && (e as Error).message.includes(join(root, 'pod-b', HOTPLUG)));
  assert.deepEqual(lv.calls, []);
});

test('eject when the launcher is gone: no launcher pod, or its socket no longer answers → none', async (t) => {
  const { root, lv, inj, image, published } = await setup(t);
  assert.equal((await inj.eject({ ...T, launcherPods: [] })).action, 'none');
  assert.deepEqual(lv.calls, []);
  await mkdir(join(root, 'pod-b', HOTPLUG), { recursive: true });
  await inj.inject(T, image);
  lv.failNext.set('dominfo', `error: failed to connect to the hypervisor\nerror: Failed to connect socket to '${root}/pod-b/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock': No such file or directory\n`);
  assert.equal((await inj.eject(T)).action, 'none');
  await assert.rejects(stat(published), { code: 'ENOENT' });
  // Without {podUID} in the URI an unreachable libvirt stays an error.
  const host = new VirshInjector({ spawner: lv });
  lv.failNext.set('dominfo', 'error: failed to connect to the hypervisor\n');
  await assert.rejects(host.eject(T), code('LIBVIRT_UNREACHABLE'));
});

test('plain libvirt: identity publishing, the image used where it is', async () => {
  assert.equal(await identityPublisher.publish(T, '/var/lib/vmseed/seeds/a.iso'), '/var/lib/vmseed/seeds/a.iso');
  const lv = new FakeLibvirt();
  lv.domains.set('ns1_vm1', { state: 'shut off', persistent: true, live: [], config: [], unplugs: true });
  await new VirshInjector({ spawner: lv }).inject({ ...T, launcherPods: undefined }, '/var/lib/vmseed/seeds/a.iso');
  assert.equal(lv.domains.get('ns1_vm1')!.config[0]!.sourceFile, '/var/lib/vmseed/seeds/a.iso');
  assert.throws(() => new DirPublisher({ dirTemplate: '/pods/{pod}/x' }), code('CONFIG_INVALID'));
});
