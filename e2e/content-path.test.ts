// The stale-inode bug against real libvirtd + QEMU (TCG). A running QEMU
// keeps the inode of the image it opened: replacing the file in place under
// a stable name leaves the domain (and a guest rebooted in the same QEMU
// process) on the old seed, and the injector, seeing the same source path,
// did nothing. With the store's content-addressed names a changed seed is a
// new path, so the injector replaces the disk, and QEMU opens the new file.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { ImageStore } from '../src/disk/store.ts';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { e2eInjector } from './support/libvirt-mode.ts';
import { DirPublisher } from '../src/libvirt/publish.ts';
import type { Seed } from '../src/cloudinit/seed.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  emptyDomainXml,
  defineDomain,
  domblklist,
  virsh,
} from './support/libvirtd.ts';
import { parseTemplate } from '../src/libvirt/template.ts';

let dir: string;
const domains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-content-'));
});

after(async () => {
  for (const d of domains) await destroyDomain(d);
  rmSync(dir, { recursive: true, force: true });
});

function seed(hostname: string): Seed {
  return {
    datasource: 'nocloud',
    metaData: { 'instance-id': 'iid-e2e', 'local-hostname': hostname },
    userData: new TextEncoder().encode(`#cloud-config\nhostname: ${hostname}\n`),
    warnings: [],
  };
}

async function runningScsiDomain(prefix: string): Promise<{ name: string; domain: string }> {
  const name = uniqueName(prefix);
  const domain = `e2e_${name}`;
  domains.push(domain);
  await defineDomain(emptyDomainXml({ name: domain, scsiController: true }));
  await virsh('start', domain);
  return { name, domain };
}

// What QEMU itself has open for the seed CD-ROM (not only libvirt's XML).
async function qemuOpens(domain: string, path: string): Promise<boolean> {
  return (await virsh('qemu-monitor-command', domain, '--hmp', 'info block')).includes(path);
}

test('running domain, seed changed through the store and the injector: the disk source is replaced, QEMU opens the new file, the old one is pruned after', async () => {
  const { name, domain } = await runningScsiDomain('cas');
  const store = new ImageStore({ root: join(dir, 'store') });
  const key = { namespace: 'e2e', name, uid: `uid-${name}` };
  const target: InjectionTarget = { ...key, datasource: 'nocloud', annotations: {} };
  const inj = e2eInjector({ bus: 'scsi' });
  const ts = new Date(0);

  const img1 = buildSeedImage(seed('one'), ts);
  const v1 = await store.write(key, 'nocloud', img1.bytes, { sha256: img1.sha256, fsync: false });
  assert.equal(basename(v1.path), `nocloud-${img1.sha256.slice(0, 16)}.iso`);
  assert.equal((await inj.inject(target, v1.path)).action, 'attached');
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: 'sdzz', source: v1.path }]);
  assert.ok(await qemuOpens(domain, v1.path));

  // The same seed again: same path, nothing to do.
  assert.deepEqual(await store.write(key, 'nocloud', img1.bytes, { fsync: false }), { path: v1.path, written: false });
  assert.equal((await inj.inject(target, v1.path)).action, 'none');

  const img2 = buildSeedImage(seed('two'), ts);
  const v2 = await store.write(key, 'nocloud', img2.bytes, { sha256: img2.sha256, fsync: false });
  assert.notEqual(v2.path, v1.path, 'a changed seed is a new path');
  assert.ok(existsSync(v1.path), 'the file QEMU has open stays until the replace');
  const r = await inj.inject(target, v2.path);
  assert.equal(r.action, 'replaced');
  assert.deepEqual(r.flags, ['--live', '--config']);
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: 'sdzz', source: v2.path }]);
  assert.deepEqual(await domblklist(domain, true), [{ type: 'file', device: 'disk', target: 'sdzz', source: v2.path }]);
  assert.ok(await qemuOpens(domain, v2.path), 'QEMU opened the new image');
  assert.equal(await qemuOpens(domain, v1.path), false, 'and let go of the old one');

  assert.deepEqual(await store.prune(key, v2.path), [v1.path]);
  assert.deepEqual(readdirSync(store.dirFor(key)), [basename(v2.path)]);
  assert.equal((await inj.eject(target)).action, 'detached');
  await store.remove(key);
});

test("published into a launcher pod's ephemeral-disks/vmseed: the copy carries the content suffix, a changed seed replaces it, the older copy is removed after the replace", async () => {
  const { name, domain } = await runningScsiDomain('caspub');
  const store = new ImageStore({ root: join(dir, 'store') });
  const key = { namespace: 'e2e', name, uid: `uid-${name}` };
  const pod = '9e9e9e9e-9e9e-4e9e-8e9e-9e9e9e9e9e9e';
  const ephemeral = join(dir, 'pods', pod, 'volumes/kubernetes.io~empty-dir/ephemeral-disks');
  mkdirSync(ephemeral, { recursive: true });
  const hotplug = join(ephemeral, 'vmseed');
  const inj = e2eInjector({
    bus: 'scsi',
    publisher: new DirPublisher({
      dirTemplate: parseTemplate(
        'publish-dir',
        join(dir, 'pods/{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks'),
      ),
      subdir: 'vmseed',
    }),
  });
  const target: InjectionTarget = { ...key, datasource: 'nocloud', annotations: {}, launcherPods: [pod] };
  const ts = new Date(0);

  const img1 = buildSeedImage(seed('one'), ts);
  const v1 = await store.write(key, 'nocloud', img1.bytes, { fsync: false });
  await inj.inject(target, v1.path);
  const copy1 = join(hotplug, `vmseed-nocloud-${img1.sha256.slice(0, 16)}.iso`);
  assert.deepEqual(readFileSync(copy1), readFileSync(v1.path));
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.source),
    [copy1],
  );

  const img2 = buildSeedImage(seed('two'), ts);
  const v2 = await store.write(key, 'nocloud', img2.bytes, { fsync: false });
  assert.equal((await inj.inject(target, v2.path)).action, 'replaced');
  const copy2 = join(hotplug, `vmseed-nocloud-${img2.sha256.slice(0, 16)}.iso`);
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.source),
    [copy2],
  );
  assert.ok(await qemuOpens(domain, copy2));
  assert.deepEqual(readdirSync(hotplug), [basename(copy2)], 'the older published copy is gone');

  assert.equal((await inj.eject(target)).action, 'detached');
  assert.deepEqual(readdirSync(hotplug), []);
});
