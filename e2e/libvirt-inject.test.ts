// The injector against the real libvirtd + QEMU (TCG). Domains have no OS:
// enough for attach (any state) and for detach of a config-only disk or a
// SCSI CD-ROM; the virtio live detach runs a real guest (libvirt-guest test).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { e2eInjector } from './support/libvirt-mode.ts';
import { DirPublisher } from '../src/libvirt/publish.ts';
import { VmseedError } from '../src/errors.ts';
import { parseDomainXml, SEED_ALIAS } from '../src/libvirt/disk-xml.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  emptyDomainXml,
  defineDomain,
  domblklist,
  domstate,
  virsh,
} from './support/libvirtd.ts';
import { parseTemplate } from '../src/libvirt/template.ts';

let dir: string;
const domains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-libvirt-'));
});

after(async () => {
  for (const d of domains) await destroyDomain(d);
  rmSync(dir, { recursive: true, force: true });
});

function seedFile(label: string): string {
  const p = join(dir, `${label}.iso`);
  writeFileSync(p, Buffer.alloc(64 * 1024, label));
  return p;
}

function target(name: string, annotations: Record<string, string> = {}): InjectionTarget {
  return { namespace: 'e2e', name, uid: `uid-${name}`, datasource: 'nocloud', annotations };
}

async function newDomain(
  prefix: string,
  opts: { start?: 'running' | 'paused' | 'no'; scsi?: boolean; transient?: boolean } = {},
): Promise<{ name: string; domain: string }> {
  const name = uniqueName(prefix);
  const domain = `e2e_${name}`;
  domains.push(domain);
  const xml = emptyDomainXml({ name: domain, scsiController: opts.scsi });
  if (opts.transient) {
    await defineDomain(xml, 'create');
    if (opts.start === 'paused') await virsh('suspend', domain);
    return { name, domain };
  }
  await defineDomain(xml);
  if (opts.start === 'running') await virsh('start', domain);
  if (opts.start === 'paused') await virsh('start', '--paused', domain);
  return { name, domain };
}

test('running persistent domain: attach --live --config, seeded after boot; second run changes nothing', async () => {
  const { name, domain } = await newDomain('run', { start: 'running' });
  const seed = seedFile(`a-${name}`);
  const inj = e2eInjector();
  const r = await inj.inject(target(name), seed);
  assert.equal(r.action, 'attached');
  assert.equal(r.domain, domain);
  assert.deepEqual(r.flags, ['--live', '--config']);
  assert.equal(r.domainState, 'running');
  assert.equal(r.persistent, true);
  assert.equal(r.seededAfterBoot, true);
  assert.equal(r.resumed, false);
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: r.targetDev, source: seed }]);
  assert.deepEqual(await domblklist(domain, true), [
    { type: 'file', device: 'disk', target: r.targetDev, source: seed },
  ]);
  const xml = await virsh('dumpxml', domain);
  assert.match(xml, /<alias name='ua-vmseed_seed'\/>/);
  assert.match(xml, /<readonly\/>/);

  const again = await inj.inject(target(name), seed);
  assert.equal(again.action, 'none');
  assert.equal(again.targetDev, r.targetDev);
  assert.equal(again.seededAfterBoot, false);
  assert.equal((await domblklist(domain)).length, 1);
  assert.equal((await domblklist(domain, true)).length, 1);
});

test('paused domain with resume-after-seed: attached live, then resumed by the seed gate', async () => {
  const { name, domain } = await newDomain('paused', { start: 'paused' });
  const seed = seedFile(`p-${name}`);
  const r = await e2eInjector().inject(target(name), seed, { resume: true });
  assert.equal(r.action, 'attached');
  assert.equal(r.domainState, 'paused');
  assert.deepEqual(r.flags, ['--live', '--config']);
  assert.equal(r.resumed, true);
  assert.equal(r.seededAfterBoot, false);
  assert.equal(await domstate(domain), 'running');
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.source),
    [seed],
  );
});

test('paused domain without the annotation stays paused', async () => {
  const { name, domain } = await newDomain('nogate', { start: 'paused' });
  const r = await e2eInjector().inject(target(name), seedFile(`n-${name}`), { resume: false });
  assert.equal(r.action, 'attached');
  assert.equal(r.resumed, false);
  assert.equal(await domstate(domain), 'paused');
});

test('shut-off persistent domain: --config only, the disk is there at the next start', async () => {
  const { name, domain } = await newDomain('off');
  const seed = seedFile(`o-${name}`);
  const inj = e2eInjector();
  const r = await inj.inject(target(name), seed);
  assert.equal(r.action, 'attached');
  assert.deepEqual(r.flags, ['--config']);
  assert.equal(r.domainState, 'shutoff');
  assert.equal(r.seededAfterBoot, false);
  assert.deepEqual(
    (await domblklist(domain, true)).map((b) => b.source),
    [seed],
  );
  await virsh('start', '--paused', domain);
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: r.targetDev, source: seed }]);
  // Started from a config that already has it: nothing left to do.
  assert.equal((await inj.inject(target(name), seed)).action, 'none');
});

test('shut-off domain: seed changed → source replaced; eject → gone from the config', async () => {
  const { name, domain } = await newDomain('chg');
  const inj = e2eInjector();
  const first = seedFile(`c1-${name}`);
  const second = seedFile(`c2-${name}`);
  await inj.inject(target(name), first);
  const r = await inj.inject(target(name), second);
  assert.equal(r.action, 'replaced');
  assert.deepEqual(await domblklist(domain, true), [
    { type: 'file', device: 'disk', target: r.targetDev, source: second },
  ]);
  const e = await inj.eject(target(name));
  assert.equal(e.action, 'detached');
  assert.deepEqual(await domblklist(domain, true), []);
  assert.equal((await inj.eject(target(name))).action, 'none');
});

test('a fixed far target (vdzz) next to an existing disk, never the next free one', async () => {
  const name = uniqueName('busy');
  const domain = `e2e_${name}`;
  domains.push(domain);
  const other = seedFile(`other-${name}`);
  await defineDomain(
    emptyDomainXml({
      name: domain,
      extraDevices: `<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='${other}'/><target dev='vda' bus='virtio'/></disk>`,
    }),
  );
  const r = await e2eInjector().inject(target(name), seedFile(`b-${name}`));
  assert.equal(r.targetDev, 'vdzz');
  assert.deepEqual(
    (await domblklist(domain, true)).map((b) => b.target),
    ['vda', 'vdzz'],
  );
});

test('transient running domain: --live only, never --config', async () => {
  const { name, domain } = await newDomain('trans', { transient: true });
  const seed = seedFile(`t-${name}`);
  const r = await e2eInjector().inject(target(name), seed);
  assert.equal(r.persistent, false);
  assert.deepEqual(r.flags, ['--live']);
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.source),
    [seed],
  );
});

test('a seed path with a tab, quotes, an ampersand and angle brackets: libvirt and QEMU open exactly that file', async () => {
  const { name, domain } = await newDomain('path', { transient: true });
  const seed = join(dir, `we"ir'd &<\t>-${name}.iso`);
  writeFileSync(seed, Buffer.alloc(64 * 1024, 'p'));
  const r = await e2eInjector().inject(target(name), seed);
  assert.equal(r.action, 'attached');
  const live = parseDomainXml(await virsh('dumpxml', domain));
  assert.deepEqual(
    live.disks.filter((d) => d.alias === SEED_ALIAS).map((d) => d.sourceFile),
    [seed],
  );
});

test('SCSI mode on a virtio-scsi controller: a read-only disk on sdzz at drive address target 7, replaced and detached on a running domain', async () => {
  const { name, domain } = await newDomain('scsi', { start: 'running', scsi: true });
  const inj = e2eInjector({ bus: 'scsi' });
  const first = seedFile(`s1-${name}`);
  const r = await inj.inject(target(name), first);
  assert.deepEqual([r.action, r.bus, r.targetDev], ['attached', 'scsi', 'sdzz']);
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: 'sdzz', source: first }]);
  assert.match(
    await virsh('dumpxml', domain),
    /<disk type='file' device='disk'>[\s\S]*<target dev='sdzz' bus='scsi'\/>[\s\S]*<alias name='ua-vmseed_seed'\/>\s*<address type='drive' controller='0' bus='0' target='7' unit='0'\/>/,
  );

  const second = seedFile(`s2-${name}`);
  const r2 = await inj.inject(target(name), second);
  assert.equal(r2.action, 'replaced');
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: 'sdzz', source: second }]);

  assert.equal((await inj.eject(target(name))).action, 'detached');
  assert.deepEqual(await domblklist(domain), []);
  assert.deepEqual(await domblklist(domain, true), []);
});

// KubeVirt's layout in miniature: the image is published into a `vmseed`
// directory of the launcher pod's ephemeral-disks (under a temp "pods" root;
// here QEMU shares the agent's mount namespace, so the domain path is the
// published path) and QEMU really opens that copy; eject detaches it and
// removes the copy.
test("publish into a launcher pod's ephemeral-disks/vmseed ({podUID}): QEMU opens the copy; eject removes it", async () => {
  const { name, domain } = await newDomain('pub', { start: 'running', scsi: true });
  const pod = '7e7e7e7e-7e7e-4e7e-8e7e-7e7e7e7e7e7e';
  const ephemeral = join(dir, 'pods', pod, 'volumes/kubernetes.io~empty-dir/ephemeral-disks');
  mkdirSync(ephemeral, { recursive: true });
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
  const t = { ...target(name), launcherPods: [pod] };
  const seed = join(mkdtempSync(join(dir, 'store-')), 'nocloud-0123456789abcdef.iso');
  writeFileSync(seed, Buffer.alloc(64 * 1024, name));
  const r = await inj.inject(t, seed);
  assert.equal(r.action, 'attached');
  const copy = join(ephemeral, 'vmseed', 'vmseed-nocloud-0123456789abcdef.iso');
  assert.deepEqual(readFileSync(copy), readFileSync(seed));
  assert.deepEqual(await domblklist(domain), [{ type: 'file', device: 'disk', target: 'sdzz', source: copy }]);
  // QEMU itself holds the copy open (its block node names the file).
  assert.match(
    await virsh('qemu-monitor-command', domain, '--hmp', 'info block'),
    new RegExp(copy.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')),
  );
  assert.equal((await inj.inject(t, seed)).action, 'none');

  assert.equal((await inj.eject(t)).action, 'detached');
  assert.deepEqual(await domblklist(domain), []);
  assert.equal(existsSync(copy), false);
});

test('domain missing: DOMAIN_NOT_FOUND, retryable; eject of a missing domain is a no-op', async () => {
  const name = uniqueName('missing');
  const inj = e2eInjector();
  await assert.rejects(inj.inject(target(name), seedFile(`m-${name}`)), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'DOMAIN_NOT_FOUND');
    assert.equal(e.retryable, true);
    return true;
  });
  assert.equal((await inj.eject(target(name))).action, 'none');
});

test('seed file missing: SEED_FILE_NOT_ACCESSIBLE with the image path template applied', async () => {
  const { name } = await newDomain('nofile', { start: 'paused' });
  const inj = e2eInjector({
    imagePathTemplate: parseTemplate('image-path', '/nonexistent/vmseed/{namespace}/{name}/{basename}'),
  });
  await assert.rejects(inj.inject(target(name), seedFile(`x-${name}`)), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'SEED_FILE_NOT_ACCESSIBLE');
    assert.match(e.message, new RegExp(`/nonexistent/vmseed/e2e/${name}/x-${name}\\.iso`));
    return true;
  });
});
