// The injector reaching a VM inside its KubeVirt launcher pod: {podUID} from
// status.activePods (UUIDs only), the image published into a `vmseed`
// directory of the pod's ephemeral-disks emptyDir (a temp dir stands for the
// kubelet's pods root), removed on eject.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, readdir, readFile, rm, stat, symlink, writeFile, lstat, chmod } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { ImageStore } from '../../src/disk/store.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { checkLauncherPods, launcherPodsOnNode } from '../../src/libvirt/launcher-pod.ts';
import { DirPublisher, identityPublisher, isPublishedName } from '../../src/libvirt/publish.ts';
import { encodeUriValue, parseTemplate } from '../../src/libvirt/template.ts';
import { VmseedError } from '../../src/errors.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { changeCalls, FakeLibvirt } from '../support/fake-libvirt.ts';

const EPHEMERAL = 'volumes/kubernetes.io~empty-dir/ephemeral-disks';
const POD_A = '0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01';
const POD_B = '5d3f1a9e-2b7c-4e8f-a1d2-3c4b5a6f7e02';
const URI =
  'qemu+unix:///session?socket={root}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock';
const T: InjectionTarget = {
  namespace: 'ns1',
  name: 'vm1',
  uid: 'u-1',
  datasource: 'nocloud',
  annotations: {},
  launcherPods: [POD_B],
};

async function setup(t: { after(fn: () => Promise<void>): void }) {
  const root = await mkdtemp(join(tmpdir(), 'vmseed-pods-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  const lv = new FakeLibvirt();
  lv.domains.set('ns1_vm1', { state: 'paused', persistent: false, live: [], config: [], unplugs: true, scsi: true });
  const inj = new LibvirtInjector({
    spawner: lv,
    uriTemplate: parseTemplate('uri', URI.replace('{root}', root)),
    imagePathTemplate: parseTemplate('image-path', '/var/run/kubevirt-ephemeral-disks/vmseed/{basename}'),
    publisher: new DirPublisher({
      dirTemplate: parseTemplate('publish-dir', `${root}/{podUID}/${EPHEMERAL}`),
      subdir: 'vmseed',
    }),
    bus: 'scsi',
    liveOnly: true,
    sleep: async () => {},
  });
  const image = join(root, 'nocloud-0123456789abcdef.iso');
  await writeFile(image, 'seed one');
  const ephemeral = join(root, POD_B, EPHEMERAL);
  return {
    root,
    lv,
    inj,
    image,
    ephemeral,
    published: join(ephemeral, 'vmseed', 'vmseed-nocloud-0123456789abcdef.iso'),
  };
}

const code = (c: string, kind?: string) => (e: unknown) =>
  e instanceof VmseedError && e.code === c && (kind === undefined || e.kind === kind);

test("active pods: only this node's, sorted; anything else is none", () => {
  assert.deepEqual(launcherPodsOnNode({ [POD_B]: 'node-a', 'pod-x': 'node-b', [POD_A]: 'node-a' }, 'node-a'), [
    POD_A,
    POD_B,
  ]);
  assert.deepEqual(launcherPodsOnNode({ 'pod-x': 'node-b' }, 'node-a'), []);
  assert.deepEqual(launcherPodsOnNode(undefined, 'node-a'), []);
  assert.deepEqual(launcherPodsOnNode('garbage', 'node-a'), []);
});

test('the attempt before the domain exists leaves the copy in the pod: when the domain starts, inject() only reads and attaches', async (t) => {
  const { lv, inj, image, ephemeral, published } = await setup(t);
  await mkdir(ephemeral, { recursive: true });
  const domain = lv.domains.get('ns1_vm1')!;
  lv.domains.delete('ns1_vm1');
  // The agent's first pass: the launcher pod is up, its domain not yet.
  await assert.rejects(inj.inject(T, image), code('DOMAIN_NOT_FOUND', 'retryable'));
  assert.equal(await readFile(published, 'utf8'), 'seed one', 'copied while the domain was being looked up');
  const { ino, mtimeMs } = await stat(published);
  // The domain appears (started paused): the copy is there already.
  lv.domains.set('ns1_vm1', domain);
  assert.equal((await inj.inject(T, image)).action, 'attached');
  const after = await stat(published);
  assert.deepEqual([after.ino, after.mtimeMs], [ino, mtimeMs], 'not written again');
  assert.deepEqual(
    domain.live.map((d) => d.sourceFile),
    ['/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-nocloud-0123456789abcdef.iso'],
  );
});

test("{podUID}: the launcher's socket; the image copied into ephemeral-disks/vmseed (created), seen at /var/run/kubevirt-ephemeral-disks/vmseed", async (t) => {
  const { root, lv, inj, image, ephemeral, published } = await setup(t);
  await mkdir(ephemeral, { recursive: true });
  // The kubelet's emptyDir: 2777 (setgid, world-writable).
  await chmod(ephemeral, 0o2777);
  const r = await inj.inject(T, image);
  assert.deepEqual([r.action, r.flags, r.targetDev, r.bus], ['attached', ['--live'], 'sdzz', 'scsi']);
  assert.ok(
    lv.uris.every(
      (u) =>
        u ===
        `qemu+unix:///session?socket=${root}/${POD_B}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`,
    ),
  );
  const disk = lv.domains.get('ns1_vm1')!.live[0];
  assert.deepEqual(
    [disk.sourceFile, disk.alias],
    ['/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-nocloud-0123456789abcdef.iso', 'ua-vmseed_seed'],
  );
  assert.equal(await readFile(published, 'utf8'), 'seed one');
  assert.equal((await stat(published)).mode & 0o777, 0o640);
  const dir = await lstat(join(ephemeral, 'vmseed'));
  assert.ok(dir.isDirectory());
  assert.equal(
    dir.mode & 0o7777,
    0o2750,
    "owner and group (107 in a launcher) only; setgid keeps the emptyDir's group",
  );

  // Again: identical bytes are not copied again (same inode), nothing attached.
  const ino = (await stat(published)).ino;
  assert.equal((await inj.inject(T, image)).action, 'none');
  assert.equal((await stat(published)).ino, ino);

  // New bytes replace the copy atomically; no temporary is left behind.
  await writeFile(image, 'seed two');
  await inj.inject(T, image);
  assert.equal(await readFile(published, 'utf8'), 'seed two');
  assert.notEqual((await stat(published)).ino, ino);
  assert.deepEqual(await readdir(join(ephemeral, 'vmseed')), ['vmseed-nocloud-0123456789abcdef.iso']);

  // Eject: the disk is detached, then the copy removed (the directory stays).
  assert.equal((await inj.eject(T)).action, 'detached');
  assert.deepEqual(lv.domains.get('ns1_vm1')!.live, []);
  assert.deepEqual(await readdir(join(ephemeral, 'vmseed')), []);
});

test("content-addressed store images: a changed seed is a new published name, the disk is replaced, the older copy removed after; KubeVirt's files untouched", async (t) => {
  const { root, lv, inj, ephemeral } = await setup(t);
  const ours = join(ephemeral, 'vmseed');
  await mkdir(join(ephemeral, 'cloud-init-data', 'ns1', 'vm1'), { recursive: true });
  await writeFile(join(ephemeral, 'cloud-init-data', 'ns1', 'vm1', 'noCloud.iso'), "KubeVirt's own");
  const store = new ImageStore({ root: join(root, 'state') });
  const key = { namespace: 'ns1', name: 'vm1', uid: 'u-1' };
  const v1 = await store.write(key, 'nocloud', new TextEncoder().encode('seed one'), { fsync: false });
  assert.equal((await inj.inject(T, v1.path)).action, 'attached');
  const name1 = `vmseed-${basename(v1.path)}`;
  assert.match(name1, /^vmseed-nocloud-[0-9a-f]{16}\.iso$/);
  assert.equal(lv.domains.get('ns1_vm1')!.live[0].sourceFile, `/var/run/kubevirt-ephemeral-disks/vmseed/${name1}`);
  // Something else someone put into our directory is never touched.
  await writeFile(join(ours, 'notes.txt'), 'not ours');

  const v2 = await store.write(key, 'nocloud', new TextEncoder().encode('seed two'), { fsync: false });
  const r = await inj.inject(T, v2.path);
  assert.equal(r.action, 'replaced');
  const name2 = `vmseed-${basename(v2.path)}`;
  assert.notEqual(name2, name1);
  assert.equal(lv.domains.get('ns1_vm1')!.live[0].sourceFile, `/var/run/kubevirt-ephemeral-disks/vmseed/${name2}`);
  // Pruned after inject() answered, before anything else on the domain.
  assert.equal(await inj.idle(), true);
  assert.deepEqual((await readdir(ours)).sort(), ['notes.txt', name2], 'the older copy pruned after the replace');
  assert.equal(
    await readFile(join(ephemeral, 'cloud-init-data', 'ns1', 'vm1', 'noCloud.iso'), 'utf8'),
    "KubeVirt's own",
  );

  // The domain missing: nothing pruned (the old copy may still be in use).
  const v3 = await store.write(key, 'nocloud', new TextEncoder().encode('seed three'), { fsync: false });
  lv.domains.delete('ns1_vm1');
  await assert.rejects(inj.inject(T, v3.path), code('DOMAIN_NOT_FOUND'));
  assert.ok((await readdir(ours)).includes(name2));
});

test('launcher pod unknown or ambiguous: LAUNCHER_POD_UNKNOWN, retryable, before any virsh call', async (t) => {
  const { lv, inj, image } = await setup(t);
  await assert.rejects(
    inj.inject({ ...T, launcherPods: [] }, image),
    (e: unknown) =>
      code('LAUNCHER_POD_UNKNOWN', 'retryable')(e) && /no launcher pod on this node yet/.test((e as Error).message),
  );
  await assert.rejects(inj.inject({ ...T, launcherPods: undefined }, image), code('LAUNCHER_POD_UNKNOWN', 'retryable'));
  await assert.rejects(
    inj.inject({ ...T, launcherPods: [POD_A, POD_B] }, image),
    (e: unknown) => code('LAUNCHER_POD_UNKNOWN')(e) && /2 launcher pods/.test((e as Error).message),
  );
  assert.deepEqual(lv.calls, []);
});

test('a launcher pod UID that is not a UUID: LAUNCHER_POD_INVALID, terminal, naming status.activePods; nothing written, no virsh call', async (t) => {
  const { root, lv, inj, image } = await setup(t);
  for (const bad of ['../../etc', 'pod-b', `${POD_B}/x`, `${POD_B}&socket=/tmp/evil`, '']) {
    await assert.rejects(
      inj.inject({ ...T, launcherPods: [bad] }, image),
      (e: unknown) =>
        code('LAUNCHER_POD_INVALID', 'terminal')(e) &&
        (e as VmseedError).field === 'status.activePods' &&
        /status\.activePods/.test((e as Error).message),
      bad,
    );
  }
  assert.throws(
    () =>
      checkLauncherPods(
        T,
        Array.from({ length: 17 }, () => POD_A),
      ),
    code('LAUNCHER_POD_INVALID'),
  );
  assert.doesNotThrow(() => checkLauncherPods(T, [POD_A, POD_B.toUpperCase()]));
  // Eject (the VMI gone): such a UID was never used, so there is nothing to clean behind it.
  assert.deepEqual(await inj.eject({ ...T, launcherPods: ['../../etc'] }), { action: 'none', domain: 'ns1_vm1' });
  assert.deepEqual(lv.calls, []);
  assert.deepEqual(await readdir(root), ['nocloud-0123456789abcdef.iso']);
});

test('values in the socket URI are percent-encoded: a pods directory with spaces or & cannot add URI parameters', async (t) => {
  const { lv } = await setup(t);
  assert.equal(encodeUriValue('/pods dir/a&b=c?d#e%f/~x_y.z-1'), '/pods%20dir/a%26b%3Dc%3Fd%23e%25f/~x_y.z-1');
  assert.equal(encodeUriValue('/é'), '/%C3%A9');
  const inj = new LibvirtInjector({
    spawner: lv,
    uriTemplate: parseTemplate('uri', 'qemu+unix:///session?socket=/pods/{podUID}/{namespace}/sock'),
  });
  lv.domains.set('a&b_vm1', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  assert.equal(inj.uri({ ...T, namespace: 'a&b' }), `qemu+unix:///session?socket=/pods/${POD_B}/a%26b/sock`);
});

test("the launcher's ephemeral-disks directory missing: SEED_PUBLISH_FAILED, retryable, nothing created or attached", async (t) => {
  const { root, lv, inj, image } = await setup(t);
  await assert.rejects(
    inj.inject(T, image),
    (e: unknown) =>
      code('SEED_PUBLISH_FAILED', 'retryable')(e) && (e as Error).message.includes(join(root, POD_B, EPHEMERAL)),
  );
  assert.deepEqual(changeCalls(lv), []);
  assert.deepEqual(await readdir(root), ['nocloud-0123456789abcdef.iso']);
});

test('publish never follows a symlink: vmseed/ a symlink or a file → STORE_UNSAFE_PATH, nothing written through it; eject leaves it alone', async (t) => {
  const { root, lv, inj, image, ephemeral } = await setup(t);
  await mkdir(ephemeral, { recursive: true });
  const elsewhere = join(root, 'elsewhere');
  await mkdir(elsewhere);
  await writeFile(join(elsewhere, 'vmseed-nocloud-0123456789abcdef.iso'), 'victim');
  await symlink(elsewhere, join(ephemeral, 'vmseed'));
  await assert.rejects(
    inj.inject(T, image),
    (e: unknown) => code('STORE_UNSAFE_PATH', 'terminal')(e) && /symlink/.test((e as Error).message),
  );
  assert.deepEqual(await readdir(elsewhere), ['vmseed-nocloud-0123456789abcdef.iso']);
  assert.deepEqual(changeCalls(lv), []);
  await inj.eject(T);
  assert.equal(
    await readFile(join(elsewhere, 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'),
    'victim',
    'unpublish did not delete through the link',
  );

  await rm(join(ephemeral, 'vmseed'));
  await writeFile(join(ephemeral, 'vmseed'), 'a file');
  await assert.rejects(inj.inject(T, image), code('STORE_UNSAFE_PATH'));
  // The volume itself a symlink (to another pod's volume).
  await rm(ephemeral, { recursive: true });
  await mkdir(join(root, 'other'), { recursive: true });
  await symlink(join(root, 'other'), ephemeral);
  await assert.rejects(inj.inject(T, image), code('STORE_UNSAFE_PATH'));
  assert.deepEqual(await readdir(join(root, 'other')), []);
});

test('inside vmseed/: a symlink or FIFO under our file name is replaced, never followed or read; only our names are deleted', async (t) => {
  const { root, inj, image, ephemeral } = await setup(t);
  const ours = join(ephemeral, 'vmseed');
  await mkdir(ours, { recursive: true });
  await writeFile(join(root, 'victim'), 'victim');
  await symlink(join(root, 'victim'), join(ours, 'vmseed-nocloud-0123456789abcdef.iso'));
  await inj.inject(T, image);
  assert.equal(await readFile(join(root, 'victim'), 'utf8'), 'victim');
  assert.ok((await lstat(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'))).isFile());
  await inj.eject(T);

  // A FIFO where our copy goes: opening it for reading would block forever.
  execFileSync('mkfifo', [join(ours, 'vmseed-nocloud-0123456789abcdef.iso')]);
  await inj.inject(T, image);
  assert.equal(await readFile(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'), 'seed one');

  // A file of another size under our name (the launcher can write there):
  // not read, replaced; so is one of the same size with other bytes.
  await inj.eject(T);
  await writeFile(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), Buffer.alloc(64 * 1024 * 1024, 1));
  await inj.inject(T, image);
  assert.equal(await readFile(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'), 'seed one');
  await inj.eject(T);
  await writeFile(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), 'seed 0ne');
  await inj.inject(T, image);
  assert.equal(await readFile(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'), 'seed one');

  // A directory under our file name: refused, not retried forever.
  await inj.eject(T);
  await mkdir(join(ours, 'vmseed-nocloud-0123456789abcdef.iso', 'x'), { recursive: true });
  await assert.rejects(inj.inject(T, image), code('STORE_UNSAFE_PATH', 'terminal'));
  await rm(join(ours, 'vmseed-nocloud-0123456789abcdef.iso'), { recursive: true });
  await inj.inject(T, image);

  // Names like ours but not ours: kept.
  for (const n of [
    'vmseed-nocloud-0123456789abcdef.iso.bak',
    'vmseed-other.iso',
    'xvmseed-nocloud-0123456789abcdef.iso',
  ])
    await writeFile(join(ours, n), 'x');
  await inj.eject(T);
  assert.deepEqual((await readdir(ours)).sort(), [
    'vmseed-nocloud-0123456789abcdef.iso.bak',
    'vmseed-other.iso',
    'xvmseed-nocloud-0123456789abcdef.iso',
  ]);
  assert.equal(isPublishedName('vmseed-configdrive-0123456789abcdef.iso'), true);
  assert.equal(isPublishedName('.vmseed-nocloud-0123456789abcdef.iso.vmseed-tmp-0123456789ab'), true);
  assert.equal(isPublishedName('vmseed-nocloud-0123456789abcdef.iso/..'), false);
  // Only the store's content-addressed names are ours.
  assert.equal(isPublishedName('vmseed-nocloud.iso'), false);
});

test('the source image: a FIFO or an oversized file is never read whole', async (t) => {
  const { root, ephemeral } = await setup(t);
  await mkdir(ephemeral, { recursive: true });
  const pub = new DirPublisher({
    dirTemplate: parseTemplate('publish-dir', `${root}/{podUID}/${EPHEMERAL}`),
    subdir: 'vmseed',
    maxBytes: 4,
  });
  await writeFile(join(root, 'configdrive-0123456789abcdef.iso'), 'too large');
  await assert.rejects(
    pub.publish(T, join(root, 'configdrive-0123456789abcdef.iso')),
    code('SEED_PUBLISH_FAILED', 'terminal'),
  );
  execFileSync('mkfifo', [join(root, 'nocloud-fedcba9876543210.iso')]);
  await assert.rejects(pub.publish(T, join(root, 'nocloud-fedcba9876543210.iso')), code('SEED_PUBLISH_FAILED'));
  await assert.rejects(pub.publish(T, join(root, 'other.iso')), code('INTERNAL'));
});

test('eject when the launcher is gone: no launcher pod, or its socket no longer answers → none', async (t) => {
  const { root, lv, inj, image, published, ephemeral } = await setup(t);
  assert.equal((await inj.eject({ ...T, launcherPods: [] })).action, 'none');
  assert.deepEqual(lv.calls, []);
  await mkdir(ephemeral, { recursive: true });
  await inj.inject(T, image);
  lv.failNext.set(
    'dominfo',
    `error: failed to connect to the hypervisor\nerror: Failed to connect socket to '${root}/${POD_B}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock': No such file or directory\n`,
  );
  assert.equal((await inj.eject(T)).action, 'none');
  await assert.rejects(stat(published), { code: 'ENOENT' });
  // Without {podUID} in the URI an unreachable libvirt stays an error.
  const host = new LibvirtInjector({ spawner: lv });
  lv.failNext.set('dominfo', 'error: failed to connect to the hypervisor\n');
  await assert.rejects(host.eject(T), code('LIBVIRT_UNREACHABLE'));
});

test("stage and unstage: a migration target's pod gets the file at the same name, no virsh call; eject over two pods cleans both", async (t) => {
  const { root, lv, inj, image } = await setup(t);
  for (const p of [POD_A, POD_B]) await mkdir(join(root, p, EPHEMERAL), { recursive: true });
  await inj.inject({ ...T, launcherPods: [POD_B] }, image);
  const calls = lv.calls.length;
  assert.equal(
    await inj.stage({ ...T, launcherPods: [POD_A] }, image),
    '/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-nocloud-0123456789abcdef.iso',
  );
  assert.equal(lv.calls.length, calls);
  assert.equal(
    await readFile(join(root, POD_A, EPHEMERAL, 'vmseed', 'vmseed-nocloud-0123456789abcdef.iso'), 'utf8'),
    'seed one',
  );
  await inj.eject({ ...T, launcherPods: [POD_A, POD_B] });
  for (const p of [POD_A, POD_B]) assert.deepEqual(await readdir(join(root, p, EPHEMERAL, 'vmseed')), []);
  await inj.stage({ ...T, launcherPods: [POD_A] }, image);
  await inj.unstage({ ...T, launcherPods: [POD_A] });
  assert.deepEqual(await readdir(join(root, POD_A, EPHEMERAL, 'vmseed')), []);
});

test('plain libvirt: identity publishing, the image used where it is', async () => {
  assert.equal(await identityPublisher.publish(T, '/var/lib/vmseed/seeds/a.iso'), '/var/lib/vmseed/seeds/a.iso');
  const lv = new FakeLibvirt();
  lv.domains.set('ns1_vm1', { state: 'shut off', persistent: true, live: [], config: [], unplugs: true });
  await new LibvirtInjector({ spawner: lv }).inject({ ...T, launcherPods: undefined }, '/var/lib/vmseed/seeds/a.iso');
  assert.equal(lv.domains.get('ns1_vm1')!.config[0].sourceFile, '/var/lib/vmseed/seeds/a.iso');
  assert.throws(
    () => new DirPublisher({ dirTemplate: parseTemplate('publish-dir', '/pods/{podUID}/x'), subdir: '../y' }),
    code('CONFIG_INVALID'),
  );
});
