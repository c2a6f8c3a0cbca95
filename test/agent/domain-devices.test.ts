// ConfigDrive `devices` from the domain in the agent: a tagged device whose
// guest address the spec does not pin is read from the domain's XML before
// the seed is written (KubeVirt's launcher lists it from the running domain);
// until the domain exists the VMI waits with a retryable status. A VMI
// without such devices never reads the domain.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, readFile, rm, stat } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Reconciler } from '../../src/agent/reconciler.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { LogEventRecorder } from '../../src/agent/events.ts';
import type { HostNumaReader } from '../../src/libvirt/host-numa.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';

const DOMAIN = 'default_web';

// As libvirt prints a KubeVirt domain's interface: user alias "ua-<name>".
const INTERFACE_XML = `    <interface type='ethernet'>
      <mac address='02:00:00:84:e9:58'/>
      <model type='virtio-non-transitional'/>
      <alias name='ua-default'/>
      <address type='pci' domain='0x0000' bus='0x01' slot='0x00' function='0x0'/>
    </interface>`;

function vmi(
  interfaces: Array<Record<string, unknown>>,
  datasource: 'cloudInitConfigDrive' | 'cloudInitNoCloud' = 'cloudInitConfigDrive',
): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: { name: 'web', namespace: 'default', uid: '0a3c1a47-3c7c-4a43-9d1e-0f3cfa1b2c01' },
    spec: {
      domain: { firmware: { uuid: '5d307ca9-b3ef-428c-8861-06e72d69f223' }, devices: { interfaces } },
      volumes: [{ name: 'cloudinitdisk', [datasource]: { userData: '#cloud-config\n' } }],
    },
  };
}

function domain(devicesXml?: string): FakeDomain {
  return {
    state: 'paused',
    persistent: true,
    live: [],
    config: [],
    unplugs: true,
    ...(devicesXml ? { devicesXml } : {}),
  };
}

async function setup(
  t: { after(fn: () => Promise<void>): void },
  objects: Map<string, VmiObject>,
  hostNuma?: HostNumaReader,
) {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-domdev-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const { logger } = captureLogger();
  const status = new StatusStore({
    version: 't',
    nodeName: 'laptop',
    stateDir: dir,
    config: {},
    watch: () => ({ mode: 'local', synced: true }) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  const lv = new FakeLibvirt();
  const r = new Reconciler({
    nodeName: 'laptop',
    cache: { get: (k) => objects.get(k) },
    refs: new MemoryResolver(),
    render: renderSeed,
    build: buildSeedImage,
    store: new ImageStore({ root: dir }),
    injector: new LibvirtInjector({ spawner: lv }),
    events: new LogEventRecorder(logger),
    status,
    records: status.records,
    logger,
    renderOptions: DEFAULT_RENDER_OPTIONS,
    fsync: false,
    ...(hostNuma ? { hostNuma } : {}),
  });
  return { r, status, lv };
}

async function metaData(status: StatusStore, key: string): Promise<Record<string, unknown>> {
  const path = status.get(key)!.imagePath!;
  const iso = readIso(new Uint8Array(await readFile(path)));
  return JSON.parse(Buffer.from(iso.read('openstack/latest/meta_data.json')!).toString('utf8')) as Record<
    string,
    unknown
  >;
}

test('a tagged interface without pciAddress: the seed waits for the domain, then lists its address and MAC from the domain XML', async (t) => {
  const objects = new Map([['default/web', vmi([{ name: 'default', tag: 'mynic', masquerade: {} }])]]);
  const { r, status, lv } = await setup(t, objects);

  // No domain yet: retried, nothing written, the status says why.
  assert.equal(await r.reconcile('default/web'), 'retry');
  const waiting = status.get('default/web')!;
  assert.equal(waiting.state, 'pending');
  assert.equal(waiting.lastError?.code, 'DOMAIN_NOT_FOUND');
  assert.equal(waiting.lastError?.kind, 'retryable');
  assert.match(
    waiting.lastError.message,
    /^waiting for the domain to read tagged devices' addresses \(spec\.domain\.devices\.interfaces\[0\]/,
  );
  assert.equal(waiting.imagePath, undefined);
  assert.deepEqual(
    lv.calls.map((c) => c[0]),
    ['dumpxml'],
    'only the domain read; no attach without a seed',
  );

  lv.domains.set(DOMAIN, domain(INTERFACE_XML));
  assert.equal(await r.reconcile('default/web'), 'success');
  const rec = status.get('default/web')!;
  assert.equal(rec.state, 'ready', JSON.stringify(rec.warnings));
  assert.deepEqual((await metaData(status, 'default/web')).devices, [
    { type: 'nic', bus: 'pci', address: '0000:01:00.0', mac: '02:00:00:84:e9:58', tags: ['mynic'] },
  ]);
  assert.equal(lv.domains.get(DOMAIN)!.live.length, 1, 'the seed is attached');
  assert.equal(rec.imageBytes, (await stat(rec.imagePath!)).size, 'the size of the image on disk');

  // Level-based: the same domain gives the same seed, nothing is replaced.
  const sha = rec.contentHash;
  const attaches = lv.calls.filter((c) => c[0] === 'attach-device').length;
  assert.equal(await r.reconcile('default/web'), 'success');
  assert.equal(status.get('default/web')!.contentHash, sha);
  assert.equal(lv.calls.filter((c) => c[0] === 'attach-device').length, attaches);

  // The domain's devices change under the running guest (a hot-plug): the
  // devices were read once for this VMI, so its seed stays.
  lv.domains.get(DOMAIN)!.devicesXml = INTERFACE_XML.replace("bus='0x01'", "bus='0x07'");
  assert.equal(await r.reconcile('default/web'), 'success');
  assert.equal(status.get('default/web')!.contentHash, sha);
  assert.equal(lv.calls.filter((c) => c[0] === 'attach-device').length, attaches);
});

test('a VMI without tags, with pinned addresses, or NoCloud never reads the domain before rendering', async (t) => {
  for (const v of [
    vmi([{ name: 'default', masquerade: {} }]),
    vmi([{ name: 'default', tag: 'pinned', pciAddress: '0000:81:01.0', macAddress: 'de:ad:00:00:be:af' }]),
    vmi([{ name: 'default', tag: 'mynic' }], 'cloudInitNoCloud'),
  ]) {
    const objects = new Map([['default/web', v]]);
    const { r, status, lv } = await setup(t, objects);
    lv.domains.set(DOMAIN, domain(INTERFACE_XML));
    assert.equal(await r.reconcile('default/web'), 'success');
    // The injector's own view (dominfo, then dumpxml of the paused domain)
    // comes first; no dumpxml precedes it.
    assert.equal(
      lv.calls[0]?.[0],
      'dominfo',
      `first call for ${JSON.stringify(v.spec.domain?.devices)}: ${JSON.stringify(lv.calls)}`,
    );
    if (v.spec.volumes![0].cloudInitConfigDrive) {
      const devices = (await metaData(status, 'default/web')).devices;
      if (v.spec.domain!.devices!.interfaces![0].tag === 'pinned') {
        assert.deepEqual(devices, [
          { type: 'nic', bus: 'pci', address: '0000:81:01.0', mac: 'de:ad:00:00:be:af', tags: ['pinned'] },
        ]);
      } else {
        assert.equal(devices, undefined);
      }
    }
  }
});

test('without libvirt the seed is rendered at once from the spec, with the DEVICE_METADATA_INCOMPLETE warning', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-domdev-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const { logger } = captureLogger();
  const status = new StatusStore({
    version: 't',
    nodeName: 'laptop',
    stateDir: dir,
    config: {},
    watch: () => ({ mode: 'local', synced: true }) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  const objects = new Map([['default/web', vmi([{ name: 'default', tag: 'mynic' }])]]);
  const r = new Reconciler({
    nodeName: 'laptop',
    cache: { get: (k) => objects.get(k) },
    refs: new MemoryResolver(),
    render: renderSeed,
    build: buildSeedImage,
    store: new ImageStore({ root: dir }),
    events: new LogEventRecorder(logger),
    status,
    records: status.records,
    logger,
    renderOptions: DEFAULT_RENDER_OPTIONS,
    fsync: false,
  });
  assert.equal(await r.reconcile('default/web'), 'success');
  assert.deepEqual(
    status.get('default/web')!.warnings.map((w) => w.code),
    ['DEVICE_METADATA_INCOMPLETE'],
  );
});

// A KubeVirt host device as libvirt prints it: host address in <source>,
// the guest's in the hostdev's own <address>.
const HOSTDEV_XML = `    <hostdev mode='subsystem' type='pci' managed='no'>
      <source>
        <address domain='0x0000' bus='0x65' slot='0x10' function='0x0'/>
      </source>
      <alias name='ua-hostdevice-dev1'/>
      <address type='pci' domain='0x0000' bus='0x03' slot='0x00' function='0x0'/>
    </hostdev>`;
const CPUTUNE_XML = `  <cputune>
    <vcpupin vcpu='0' cpuset='4'/>
    <vcpupin vcpu='1' cpuset='5'/>
    <vcpupin vcpu='2' cpuset='12'/>
  </cputune>`;

test('a tagged host device gets its host NUMA node (guestMappingPassthrough) or aligned vCPUs (dedicated CPUs) through the reader', async (t) => {
  const asked: string[] = [];
  const reader = {
    async deviceNumaNode(addr: string) {
      asked.push(addr);
      return addr === '0000:65:10.0' ? 1 : undefined;
    },
    // Host CPUs 4-7 are node 1: vCPUs 0 and 1 are pinned there, vCPU 2 is not.
    async nodeCpus(node: number) {
      return node === 1 ? [4, 5, 6, 7] : undefined;
    },
  };
  const withCpu = (cpu: Record<string, unknown>): VmiObject => {
    const v = vmi([]);
    (v.spec.domain as Record<string, unknown>).cpu = cpu;
    (v.spec.domain!.devices as Record<string, unknown>).hostDevices = [
      { name: 'dev1', deviceName: 'vendor.com/dev', tag: 'accel' },
    ];
    return v;
  };
  const cases: Array<[Record<string, unknown>, Record<string, unknown>]> = [
    [{ dedicatedCpuPlacement: true, numa: { guestMappingPassthrough: {} } }, { numaNode: 1 }],
    [{ dedicatedCpuPlacement: true }, { alignedCPUs: [0, 1] }],
    [{ cores: 2 }, {}],
  ];
  for (const [cpu, numa] of cases) {
    const objects = new Map([['default/web', withCpu(cpu)]]);
    const { r, status, lv } = await setup(t, objects, reader);
    lv.domains.set(DOMAIN, { ...domain(HOSTDEV_XML), domainXml: CPUTUNE_XML });
    assert.equal(await r.reconcile('default/web'), 'success');
    assert.deepEqual(
      (await metaData(status, 'default/web')).devices,
      [{ type: 'hostdev', bus: 'pci', address: '0000:03:00.0', ...numa, tags: ['accel'] }],
      JSON.stringify(cpu),
    );
  }
  assert.ok(
    asked.every((a) => a === '0000:65:10.0'),
    'the host address from <source>, not the guest address',
  );
});

test('per launcher pod (KubeVirt): the devices come from the pod whose libvirt has the domain', async (t) => {
  const POD_A = '6f1d3c1e-0a61-4c1b-9a55-7b1b2c3d4e01';
  const POD_B = '6f1d3c1e-0a61-4c1b-9a55-7b1b2c3d4e02';
  const v = vmi([{ name: 'default', tag: 'mynic', masquerade: {} }]);
  v.status = { nodeName: 'laptop', phase: 'Running', activePods: { [POD_A]: 'laptop', [POD_B]: 'laptop' } };
  const objects = new Map([['default/web', v]]);
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-domdev-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const { logger } = captureLogger();
  const status = new StatusStore({
    version: 't',
    nodeName: 'laptop',
    stateDir: dir,
    config: {},
    watch: () => ({ mode: 'local', synced: true }) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  const lv = new FakeLibvirt();
  // Pod A's libvirt has no domain (yet); pod B's has it.
  lv.daemons.set(POD_A, new Map());
  lv.daemons.set(POD_B, new Map([[DOMAIN, domain(INTERFACE_XML)]]));
  const injector = new LibvirtInjector({
    spawner: lv,
    uriTemplate: parseTemplate('uri', 'qemu+unix:///session?socket=/pods/{podUID}/virtqemud-sock'),
  });
  assert.equal(injector.perPod, true);
  const r = new Reconciler({
    nodeName: 'laptop',
    cache: { get: (k) => objects.get(k) },
    refs: new MemoryResolver(),
    render: renderSeed,
    build: buildSeedImage,
    store: new ImageStore({ root: dir }),
    injector,
    events: new LogEventRecorder(logger),
    status,
    records: status.records,
    logger,
    renderOptions: DEFAULT_RENDER_OPTIONS,
    fsync: false,
  });
  await r.reconcile('default/web');
  const reads = lv.calls.map((c, i) => [c[0], lv.uris[i]] as const).filter(([cmd]) => cmd === 'dumpxml');
  assert.ok(reads.length >= 2 && reads[0][1].includes(POD_A) && reads[1][1].includes(POD_B), JSON.stringify(reads));
  assert.deepEqual((await metaData(status, 'default/web')).devices, [
    { type: 'nic', bus: 'pci', address: '0000:01:00.0', mac: '02:00:00:84:e9:58', tags: ['mynic'] },
  ]);
});
