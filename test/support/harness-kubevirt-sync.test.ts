// Harness test (of the test fixtures, not of vmseed).
// The KubeVirt launcher-sync double on recorded `virsh dumpxml` fixtures:
// KubeVirt's naming, its three disk loops, and the LIVE|CONFIG semantics that
// make a live-only disk under the hotplug prefix fail every sync.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  KubevirtSync,
  convertVmiDisks,
  diskXml,
  formatDeviceName,
  getAttachedDisks,
  getDetachedDisks,
  getUpdatedDisks,
  hotplugVolumeDisk,
  nextDeviceName,
  parseDomainDisks,
  type KvDisk,
  type VirshPort,
  type VmiDisk,
} from './kubevirt-sync.ts';

const fixture = (name: string) => readFileSync(new URL(`../fixtures/kubevirt-sync/${name}`, import.meta.url), 'utf8');

// The VMI behind the fixtures: containerdisk, a data volume, KubeVirt's cloud-init disk.
const VMI_DISKS: VmiDisk[] = [
  { name: 'containerdisk', kind: 'disk', bus: 'virtio', source: '/var/run/kubevirt/container-disks/disk_0.img' },
  { name: 'datadisk', kind: 'disk', bus: 'virtio', source: '/var/run/kubevirt-private/vmi-disks/datadisk/disk.img' },
  {
    name: 'cloudinitdisk',
    kind: 'cdrom',
    bus: 'sata',
    source: '/var/run/kubevirt-ephemeral-disks/cloud-init-data/team-a/vm1/noCloud.iso',
  },
];

test('harness: formatDeviceName follows sd.c: a..z, aa.., and sdzz is index 701', () => {
  assert.equal(formatDeviceName('sd', 0), 'sda');
  assert.equal(formatDeviceName('vd', 25), 'vdz');
  assert.equal(formatDeviceName('sd', 26), 'sdaa');
  assert.equal(formatDeviceName('sd', 27), 'sdab');
  assert.equal(formatDeviceName('sd', 701), 'sdzz');
  assert.equal(formatDeviceName('sd', 702), 'sdaaa');
});

test('harness: KubeVirt naming: lowest free index per prefix, sata and scsi share sd, scsi unit = index', () => {
  const spec = convertVmiDisks(VMI_DISKS);
  assert.deepEqual(
    spec.map((d) => [d.targetDev, d.bus, d.alias]),
    [
      ['vda', 'virtio', 'ua-containerdisk'],
      ['vdb', 'virtio', 'ua-datadisk'],
      ['sda', 'sata', 'ua-cloudinitdisk'],
    ],
  );
  const scsi = hotplugVolumeDisk(spec, 'data1');
  assert.equal(scsi.targetDev, 'sdb');
  assert.deepEqual(scsi.address, { type: 'drive', controller: '0', bus: '0', unit: '1' });
  assert.equal(scsi.sourceFile, '/var/run/kubevirt/hotplug-disks/data1.img');
  assert.equal(scsi.alias, 'ua-data1');
  // The name vmseed's old pickFreeTarget took first.
  assert.equal(hotplugVolumeDisk(spec, 'data2', 'virtio').targetDev, 'vdc');
  // KubeVirt names from the VMI only: what the live domain holds does not move it.
  assert.equal(nextDeviceName('scsi', ['sda', 'sdzz']).name, 'sdb');
});

test('harness: diskXml and parseDomainDisks round-trip a disk', () => {
  const d = hotplugVolumeDisk(convertVmiDisks(VMI_DISKS), 'data1');
  const back = parseDomainDisks(`<domain><devices>${diskXml(d)}</devices></domain>`);
  assert.deepEqual(back, [d]);
});

test('harness: new layout: the seed in ephemeral-disks at sdzz is never detached, updated or counted as attached', () => {
  const live = parseDomainDisks(fixture('new-layout-live.xml'));
  const seed = live.find((d) => d.alias === 'ua-vmseed_seed')!;
  assert.equal(seed.targetDev, 'sdzz');
  const spec = convertVmiDisks(VMI_DISKS);
  spec.push(hotplugVolumeDisk(spec, 'data1'));
  assert.deepEqual(getDetachedDisks(live, spec), []);
  assert.deepEqual(getAttachedDisks(live, spec), []);
  assert.deepEqual(getUpdatedDisks(live, spec), []);
  // KubeVirt's next hotplug gets sdc and is attached: nothing of ours is in the way.
  const next = hotplugVolumeDisk(spec, 'data2');
  assert.equal(next.targetDev, 'sdc');
  assert.deepEqual(
    getAttachedDisks(live, [...spec, next]).map((d) => d.targetDev),
    ['sdc'],
  );
});

test("harness: new layout: KubeVirt's own volume leaving the spec is detached (the rule still works)", () => {
  const live = parseDomainDisks(fixture('new-layout-live.xml'));
  const spec = convertVmiDisks(VMI_DISKS);
  assert.deepEqual(
    getDetachedDisks(live, spec).map((d) => d.alias),
    ['ua-data1'],
  );
});

test('harness: old layout: the seed under hotplug-disks at vdc is detached; a cdrom under the prefix that left the spec is detached and ejected', () => {
  const live = parseDomainDisks(fixture('old-layout-live.xml'));
  const spec = convertVmiDisks(VMI_DISKS);
  assert.deepEqual(
    getDetachedDisks(live, spec).map((d) => [d.targetDev, d.alias]),
    [
      ['vdc', 'ua-vmseed'],
      ['sdc', 'ua-isovol'],
    ],
  );
  const updated = getUpdatedDisks(live, spec);
  assert.equal(updated.length, 1);
  assert.equal(updated[0].targetDev, 'sdc');
  assert.equal(updated[0].sourceFile, undefined, 'ejected: no source');
  assert.equal(updated[0].type, 'block');
  assert.equal(updated[0].driver?.type, 'raw');
});

test("harness: old layout: KubeVirt's next virtio hotplug is named vdc, which the seed holds: never attached, and the seed survives by accident", () => {
  const live = parseDomainDisks(fixture('old-layout-live.xml'));
  const spec = convertVmiDisks(VMI_DISKS);
  const stolen = hotplugVolumeDisk(spec, 'data2', 'virtio');
  assert.equal(stolen.targetDev, 'vdc');
  const withVolume = [...spec, stolen];
  assert.deepEqual(getAttachedDisks(live, withVolume), []);
  assert.ok(!getDetachedDisks(live, withVolume).some((d) => d.targetDev === 'vdc'));
});

test('harness: disks outside the prefix, and hotplug disks on other buses, are left alone', () => {
  const mk = (over: Partial<KvDisk>): KvDisk => ({
    type: 'file',
    device: 'disk',
    bus: 'scsi',
    targetDev: 'sdq',
    readonly: true,
    ...over,
  });
  const live = [
    mk({ sourceFile: '/var/run/kubevirt-ephemeral-disks/vmseed/x.iso' }),
    mk({ targetDev: 'sdr', bus: 'sata', sourceFile: '/var/run/kubevirt/hotplug-disks/y.img' }),
    mk({ targetDev: 'sds', device: 'cdrom', sourceFile: '/var/lib/elsewhere.iso' }),
  ];
  assert.deepEqual(getDetachedDisks(live, []), []);
  assert.deepEqual(getUpdatedDisks(live, []), []);
});

// A persistent libvirt domain as far as syncDisks touches it: live and config
// device lists and libvirt's LIVE|CONFIG order (the config half is checked
// first; a device missing there fails the whole call).
class FakeDomain {
  state: 'running' | 'paused' = 'running';
  live: KvDisk[];
  config: KvDisk[];
  calls: string[][] = [];
  constructor(live: KvDisk[], config: KvDisk[]) {
    this.live = live;
    this.config = config;
  }
  port: VirshPort = async (args, stdin) => {
    this.calls.push(args);
    const [cmd] = args;
    if (cmd === 'domstate') return `${this.state}\n`;
    if (cmd === 'resume') {
      if (this.state !== 'paused')
        throw new Error('error: Requested operation is not valid: domain is already running');
      this.state = 'running';
      return '';
    }
    if (cmd === 'dumpxml') return `<domain><devices>${this.live.map(diskXml).join('')}</devices></domain>`;
    const [disk] = parseDomainDisks(`<domain><devices>${stdin}</devices></domain>`);
    if (!disk) throw new Error('no disk XML on stdin');
    const flags = new Set(args.slice(3));
    assert.ok(flags.has('--live') && flags.has('--config'), `KubeVirt always uses LIVE|CONFIG: ${args.join(' ')}`);
    if (cmd === 'detach-device') {
      if (!this.config.some((d) => d.targetDev === disk.targetDev))
        throw new Error(`error: device not found: no target device ${disk.targetDev}`);
      this.config = this.config.filter((d) => d.targetDev !== disk.targetDev);
      this.live = this.live.filter((d) => d.targetDev !== disk.targetDev);
      return '';
    }
    if (cmd === 'attach-device') {
      if (this.config.some((d) => d.targetDev === disk.targetDev))
        throw new Error(`error: target ${disk.targetDev} already exists`);
      this.config.push(disk);
      this.live.push(disk);
      return '';
    }
    throw new Error(`unexpected virsh ${args.join(' ')}`);
  };
}

function parsed(name: string): KvDisk[] {
  return parseDomainDisks(fixture(name));
}

test('harness: sync, new layout with a live-only seed: repeated passes do nothing; a hotplug attaches when its file is ready', async () => {
  const live = parsed('new-layout-live.xml').filter((d) => d.alias !== 'ua-data1');
  const dom = new FakeDomain(
    live,
    live.filter((d) => d.alias !== 'ua-vmseed_seed'),
  );
  const ready = new Set<string>();
  const sync = new KubevirtSync({
    domain: 'team-a_vm1',
    virsh: dom.port,
    spec: convertVmiDisks(VMI_DISKS),
    diskReady: async (p) => ready.has(p),
  });
  for (let i = 0; i < 3; i++)
    assert.deepEqual(await sync.sync(), {
      resumed: false,
      detached: [],
      attached: [],
      updated: [],
      skippedNotReady: [],
    });
  const vol = sync.hotplug('data1');
  assert.deepEqual((await sync.sync()).skippedNotReady, ['sdb'], 'virt-handler has not made the file yet');
  ready.add(vol.sourceFile!);
  assert.deepEqual((await sync.sync()).attached, ['sdb']);
  assert.deepEqual(await sync.sync(), { resumed: false, detached: [], attached: [], updated: [], skippedNotReady: [] });
  assert.ok(dom.live.some((d) => d.alias === 'ua-vmseed_seed'));
  assert.deepEqual(sync.errors(), []);
  // What it sent is KubeVirt's disk, lower-cased as manager.go does.
  assert.ok(dom.calls.some((c) => c[0] === 'attach-device'));
});

// SyncVMI converts the VMI it is handed before it reads the domain; a
// hotplug is a new VMI and reaches the launcher as the next SyncVMI. A pass
// already running when hotplug() is called must not pick the volume up: a
// caller that marks history after hotplug() would never see that attach (the
// e2e agent test timed out so, with the volume already live).
test('harness: sync: a pass already running when hotplug() is called works from the spec it started with; the next pass attaches', async () => {
  const live = parsed('new-layout-live.xml').filter((d) => d.alias !== 'ua-data1');
  const dom = new FakeDomain(
    live,
    live.filter((d) => d.alias !== 'ua-vmseed_seed'),
  );
  let releaseDumpxml!: () => void;
  const dumpxmlHeld = new Promise<void>((r) => (releaseDumpxml = r));
  let dumpxmlReached!: () => void;
  const reached = new Promise<void>((r) => (dumpxmlReached = r));
  let hold = true;
  const port: VirshPort = async (args, stdin) => {
    if (args[0] === 'dumpxml' && hold) {
      hold = false;
      dumpxmlReached();
      await dumpxmlHeld;
    }
    return dom.port(args, stdin);
  };
  const sync = new KubevirtSync({
    domain: 'team-a_vm1',
    virsh: port,
    spec: convertVmiDisks(VMI_DISKS),
    diskReady: async () => true,
  });
  const inFlight = sync.sync();
  await reached;
  const vol = sync.hotplug('data1');
  const mark = sync.history.length;
  releaseDumpxml();
  assert.deepEqual((await inFlight).attached, [], 'the pass that started before the hotplug');
  assert.ok(!dom.live.some((d) => d.targetDev === vol.targetDev));
  assert.deepEqual((await sync.sync()).attached, ['sdb']);
  assert.deepEqual(
    sync.history.slice(mark).flatMap((h) => h.attached),
    ['sdb'],
    'the attach is in a pass recorded after the mark',
  );
});

test('harness: sync, old layout live+config: the seed is detached at the first pass (the fight starts)', async () => {
  const live = parsed('old-layout-live.xml').filter((d) => d.alias !== 'ua-isovol');
  const dom = new FakeDomain(live, structuredClone(live));
  const sync = new KubevirtSync({
    domain: 'team-a_vm1',
    virsh: dom.port,
    spec: convertVmiDisks(VMI_DISKS),
    diskReady: async () => true,
  });
  const r = await sync.sync();
  assert.deepEqual(r.detached, ['vdc']);
  assert.equal(r.error, undefined);
  assert.ok(!dom.live.some((d) => d.alias === 'ua-vmseed'));
  assert.ok(!dom.config.some((d) => d.alias === 'ua-vmseed'));
});

test('harness: sync, old layout live-only: every pass fails on the config half and the seed stays', async () => {
  const live = parsed('old-layout-live.xml').filter((d) => d.alias !== 'ua-isovol');
  const dom = new FakeDomain(
    live,
    live.filter((d) => d.alias !== 'ua-vmseed'),
  );
  const sync = new KubevirtSync({
    domain: 'team-a_vm1',
    virsh: dom.port,
    spec: convertVmiDisks(VMI_DISKS),
    diskReady: async () => true,
  });
  sync.hotplug('data1');
  for (let i = 0; i < 2; i++) {
    const r = await sync.sync();
    assert.match(r.error ?? '', /no target device vdc/);
    // syncDisks returns at the first error: KubeVirt's own hotplug never runs.
    assert.deepEqual(r.attached, []);
  }
  assert.ok(dom.live.some((d) => d.alias === 'ua-vmseed'));
  assert.equal(sync.errors().length, 2);
});

// A domain paused at start, as a VMI with startStrategy: Paused has it.
function startPausedDomain(): { dom: FakeDomain; sync: KubevirtSync } {
  const dom = new FakeDomain([], []);
  dom.state = 'paused';
  const sync = new KubevirtSync({
    domain: 'd',
    virsh: dom.port,
    spec: [],
    diskReady: async () => true,
    startPaused: true,
  });
  return { dom, sync };
}

test('harness: pause rule: a start-paused VMI stays paused until unpause; a pause KubeVirt did not order is resumed', async () => {
  const { dom, sync } = startPausedDomain();
  assert.equal((await sync.sync()).resumed, false);
  assert.equal(dom.state, 'paused');
  await sync.unpause();
  assert.equal(dom.state, 'running');
  // Someone else pauses it (a virsh suspend gate): the next sync undoes it.
  dom.state = 'paused';
  assert.equal((await sync.sync()).resumed, true);
  assert.equal(dom.state, 'running');
});

test('harness: an unpause racing a sync pass: one resume, no failed pass (the launcher serialises them)', async () => {
  for (let i = 0; i < 20; i++) {
    const { dom, sync } = startPausedDomain();
    const [pass] = await Promise.all([sync.sync(), sync.unpause()]);
    assert.equal(pass.error, undefined);
    assert.equal(dom.state, 'running');
    assert.equal(dom.calls.filter((c) => c[0] === 'resume').length, 1);
    // An unpause of a domain already running is a no-op, as UnpauseVMI's state check makes it.
    await sync.unpause();
    assert.equal(dom.calls.filter((c) => c[0] === 'resume').length, 1);
  }
});
