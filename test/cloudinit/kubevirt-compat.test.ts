// Pieces of the KubeVirt-compatibility work that the parity suite
// (test/parity/) cannot reach through `vmseed build --vmi`: devices metadata
// from a real libvirt domain, the pass-through warnings' statements, the
// empty-data rule's message, and the annotation staying strict.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { buildDevicesMetadata } from '../../src/cloudinit/devices-metadata.ts';
import { domainDevicesFromXml, domainFactsFromXml } from '../../src/libvirt/domain-devices.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import { VmseedError } from '../../src/errors.ts';

// `virsh define` + `virsh dumpxml --inactive` on libvirt 9.0 of a domain with
// KubeVirt-style aliases; libvirt assigned the guest PCI addresses.
const DOMAIN_XML = readFileSync(new URL('../fixtures/libvirt/domain-tagged-devices.xml', import.meta.url), 'utf8');

function vmi(spec: Record<string, unknown>, name = 'vm'): VmiObject {
  return { metadata: { name, namespace: 'ns', uid: 'u' }, spec: spec };
}

const tagged = vmi({
  domain: {
    firmware: { uuid: '5d307ca9-b3ef-428c-8861-06e72d69f223' },
    devices: {
      interfaces: [
        { name: 'default', tag: 'specialNet', masquerade: {} },
        { name: 'second', masquerade: {} },
        { name: 'sriovnet', tag: 'fast', sriov: {} },
      ],
      hostDevices: [{ name: 'dev1', deviceName: 'vendor.com/dev', tag: 'accel' }],
      gpus: [{ name: 'gpu1', deviceName: 'nvidia.com/gpu', tag: 'render' }],
    },
  },
  volumes: [{ name: 'c', cloudInitConfigDrive: { userData: '#cloud-config\n' } }],
});

test('domain XML from libvirt gives each interface and hostdev its alias, guest address and MAC', () => {
  const devices = domainDevicesFromXml(DOMAIN_XML)!;
  assert.deepEqual(
    devices.map((d) => [
      d.kind,
      d.alias,
      d.address && `${d.address.bus}:${d.address.slot}.${d.address.function}`,
      d.mac,
    ]),
    [
      ['interface', 'ua-default', '0x01:0x00.0x0', '02:00:00:84:e9:58'],
      ['interface', 'ua-second', '0x00:0x0a.0x0', '9a:50:e8:6f:f3:fe'],
      ['hostdev', 'ua-hostdevice-dev1', '0x03:0x00.0x0', undefined],
      ['hostdev', 'ua-gpu-gpu1', '0x04:0x00.0x0', undefined],
      ['hostdev', 'ua-sriov-sriovnet', '0x05:0x00.0x0', undefined],
    ],
  );
  assert.equal(domainDevicesFromXml('<notadomain/>'), undefined);
  assert.equal(domainDevicesFromXml('<domain'), undefined);
});

test('domain XML that is not well-formed, has a DOCTYPE or is over 1 MiB gives no devices; references are decoded; a repeated child is absent', () => {
  const iface = (inner: string) => `<domain><devices><interface>${inner}</interface></devices></domain>`;
  for (const bad of [
    `<!DOCTYPE d [<!ENTITY x "y">]>${iface("<alias name='&x;'/>")}`,
    iface("<alias name='&x;'/>"),
    "<domain><devices><interface><alias name='a'/></interface></devices>",
    `${iface('')}<domain/>`,
    iface(`<alias name='${'a'.repeat(1 << 20)}'/>`),
  ])
    assert.equal(domainFactsFromXml(bad), undefined, bad.slice(0, 80));
  assert.deepEqual(domainDevicesFromXml(iface("<alias name='ua-a&amp;b&#x2d;c'/>")), [
    { kind: 'interface', alias: 'ua-a&b-c' },
  ]);
  assert.deepEqual(domainDevicesFromXml(iface("<alias name='a'/><alias name='b'/><mac address='m'/>")), [
    { kind: 'interface', mac: 'm' },
  ]);
});

test('with the domain, devices are listed as buildDevicesMetadata does: interfaces, then hostdevs in domain order', () => {
  const { devices, warnings } = buildDevicesMetadata(tagged, domainDevicesFromXml(DOMAIN_XML));
  // Written from manager.go addToDeviceMetadata / formatPCIAddressStr; the
  // GPU row is vmseed's (KubeVirt looks GPU aliases up among host devices).
  assert.deepEqual(devices, [
    { type: 'nic', bus: 'pci', address: '0000:01:00.0', mac: '02:00:00:84:e9:58', tags: ['specialNet'] },
    { type: 'hostdev', bus: 'pci', address: '0000:03:00.0', tags: ['accel'] },
    { type: 'hostdev', bus: 'pci', address: '0000:04:00.0', tags: ['render'] },
    { type: 'nic', bus: 'pci', address: '0000:05:00.0', tags: ['fast'] },
  ]);
  assert.deepEqual(warnings, []);
});

test('without the domain, only pinned interfaces are listed and the rest are named in a warning', () => {
  const pinned = structuredClone(tagged);
  pinned.spec.domain!.devices!.interfaces![0].pciAddress = '0000:0A:00.0';
  const { devices, warnings } = buildDevicesMetadata(pinned);
  assert.deepEqual(devices, [{ type: 'nic', bus: 'pci', address: '0000:0a:00.0', tags: ['specialNet'] }]);
  assert.equal(warnings.length, 1);
  assert.equal(warnings[0].code, 'DEVICE_METADATA_INCOMPLETE');
  assert.match(warnings[0].message, /interfaces\[2\].*hostDevices\[0\].*gpus\[0\]/);
});

test('renderSeed puts the domain devices into meta_data.json when given them', async () => {
  const out = await renderSeed(tagged, new MemoryResolver(), DEFAULT_RENDER_OPTIONS, {
    domainDevices: domainDevicesFromXml(DOMAIN_XML)!,
  });
  assert.equal(out.kind, 'seed');
  if (out.kind !== 'seed') return;
  assert.equal((out.seed.metaData.devices as unknown[]).length, 4);
  assert.equal(out.seed.metaData.name, undefined, 'KubeVirt writes no "name"');
  assert.deepEqual(out.seed.warnings, []);
});

test('pass-through warnings say what cloud-init will do with the bytes', async () => {
  const render = async (kind: 'cloudInitNoCloud' | 'cloudInitConfigDrive', networkData: string) => {
    const out = await renderSeed(
      vmi({ volumes: [{ name: 'c', [kind]: { userData: '#cloud-config\n', networkData } }] }),
      new MemoryResolver(),
      DEFAULT_RENDER_OPTIONS,
    );
    assert.equal(out.kind, 'seed');
    if (out.kind !== 'seed') throw new Error('no seed');
    assert.equal(Buffer.from(out.seed.networkConfig!).toString(), networkData, 'written as given');
    return out.seed.warnings.find((w) => w.code === 'NETWORKDATA_UNPARSED')!;
  };
  assert.match(
    (await render('cloudInitNoCloud', '#Test networkData')).message,
    /fallback \(DHCP on the first NIC\); user-data is still applied/,
  );
  assert.match(
    (await render('cloudInitNoCloud', 'ethernets: {}\n')).message,
    /init-local stage fails on it.*still apply user-data/,
  );
  assert.match(
    (await render('cloudInitConfigDrive', '{"config":"x"}')).message,
    /reads it as JSON.*user-data is still applied/,
  );
  const broken = await render('cloudInitConfigDrive', 'version: 1\n');
  assert.match(broken.message, /rejects the whole drive/);
  assert.equal(broken.field, 'spec.volumes[0].cloudInitConfigDrive.networkData');
  // Never the data itself.
  assert.doesNotMatch((await render('cloudInitNoCloud', 'S3CR3T-MARKER')).message, /S3CR3T/);
});

test('the annotation stays strict: unparseable network data is an error there', async () => {
  const v = vmi({});
  v.metadata.annotations = {
    'vmseed.io/cloud-init': 'userData: "#cloud-config\\n"\nnetworkData: "#Test networkData"\n',
  };
  await assert.rejects(
    renderSeed(v, new MemoryResolver(), DEFAULT_RENDER_OPTIONS),
    (e: unknown) => e instanceof VmseedError && e.code === 'NETWORKDATA_INVALID',
  );
});

test('an empty first Secret key fails like KubeVirt and names the key that shadows the other', async () => {
  const v = vmi({ volumes: [{ name: 'c', cloudInitNoCloud: { secretRef: { name: 's' } } }] });
  const refs = new MemoryResolver({
    secrets: [{ metadata: { name: 's', namespace: 'ns' }, stringData: { userdata: '', userData: '#cloud-config\n' } }],
  });
  await assert.rejects(renderSeed(v, refs, DEFAULT_RENDER_OPTIONS), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'CLOUDINIT_DATA_EMPTY');
    assert.equal(e.field, 'spec.volumes[0].cloudInitNoCloud.secretRef');
    assert.match(e.message, /key "userdata" is empty.*"userData" is not read/);
    assert.match(
      e.message,
      /^userDataBase64, userData, networkDataBase64 or networkData is required for a cloud-init data source/,
    );
    return true;
  });
});

test('with the annotation, SSH keys propagated to the other datasource are refused, not dropped', async () => {
  const v = vmi({
    accessCredentials: [
      { sshPublicKey: { source: { secret: { secretName: 'keys' } }, propagationMethod: { configDrive: {} } } },
    ],
  });
  v.metadata.annotations = { 'vmseed.io/cloud-init': 'userData: "#cloud-config\\n"\n' };
  const refs = new MemoryResolver({
    secrets: [{ metadata: { name: 'keys', namespace: 'ns' }, stringData: { k: 'ssh-ed25519 AAAA k' } }],
  });
  await assert.rejects(renderSeed(v, refs, DEFAULT_RENDER_OPTIONS), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'ACCESS_CREDENTIAL_INVALID');
    assert.equal(e.field, 'spec.accessCredentials[0].sshPublicKey.propagationMethod');
    assert.match(
      e.message,
      /^spec\.accessCredentials\[0\] requires a configDrive volume to exist when the configDrive propagationMethod is in use\./,
    );
    return true;
  });
  // The matching datasource keeps the keys.
  v.metadata.annotations = { 'vmseed.io/cloud-init': 'datasource: configdrive\nuserData: "#cloud-config\\n"\n' };
  const out = await renderSeed(v, refs, DEFAULT_RENDER_OPTIONS);
  assert.ok(out.kind === 'seed');
  assert.deepEqual(out.seed.metaData.public_keys, { 0: 'ssh-ed25519 AAAA k' });
});

test('v2 that has no network_data.json form, on a ConfigDrive volume: written as given with NETWORK_CONVERSION_UNSUPPORTED', async () => {
  const net =
    'version: 2\nethernets:\n  eth0: {match: {macaddress: "52:54:00:00:00:01"}}\n  eth1: {match: {macaddress: "52:54:00:00:00:02"}}\n' +
    'bonds:\n  bond0: {interfaces: [eth0, eth1], dhcp4: true}\n';
  const v = vmi({ volumes: [{ name: 'c', cloudInitConfigDrive: { userData: '#cloud-config\n', networkData: net } }] });
  const out = await renderSeed(v, new MemoryResolver(), DEFAULT_RENDER_OPTIONS);
  assert.ok(out.kind === 'seed');
  assert.equal(Buffer.from(out.seed.networkConfig!).toString(), net);
  const w = out.seed.warnings.find((x) => x.code === 'NETWORK_CONVERSION_UNSUPPORTED');
  assert.ok(w, JSON.stringify(out.seed.warnings));
  assert.equal(w.field, 'spec.volumes[0].cloudInitConfigDrive.networkData');
  // YAML is not JSON: cloud-init's ConfigDrive reader would reject the drive.
  assert.match(w.message, /rejects the whole drive/);
  // The same data through the annotation is refused.
  const a = vmi({});
  a.metadata.annotations = {
    'vmseed.io/cloud-init': `datasource: configdrive\nuserData: "#cloud-config\\n"\nnetworkData: ${JSON.stringify(net)}\n`,
  };
  await assert.rejects(
    renderSeed(a, new MemoryResolver(), DEFAULT_RENDER_OPTIONS),
    (e: unknown) => e instanceof VmseedError && e.code === 'NETWORK_CONVERSION_UNSUPPORTED',
  );
});

test('spec.hostname that is not one DNS label is refused as the webhook does, for volumes and the annotation alike', async () => {
  for (const v of [
    vmi({ hostname: 'test+bad', volumes: [{ name: 'c', cloudInitNoCloud: { userData: '#cloud-config\n' } }] }),
    {
      ...vmi({ hostname: 'my.host' }),
      metadata: {
        name: 'vm',
        namespace: 'ns',
        uid: 'u',
        annotations: { 'vmseed.io/cloud-init': 'userData: "#cloud-config\\n"' },
      },
    },
  ]) {
    await assert.rejects(renderSeed(v, new MemoryResolver(), DEFAULT_RENDER_OPTIONS), (e: unknown) => {
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'HOSTNAME_INVALID');
      assert.equal(e.kind, 'terminal');
      assert.equal(e.field, 'spec.hostname');
      assert.match(e.message, /^spec\.hostname does not conform to the kubernetes DNS_LABEL rules : /);
      return true;
    });
  }
  const ok = await renderSeed(
    vmi({ hostname: 'web-1', volumes: [{ name: 'c', cloudInitNoCloud: { userData: '#cloud-config\n' } }] }),
    new MemoryResolver(),
    DEFAULT_RENDER_OPTIONS,
  );
  assert.equal(ok.kind, 'seed');
});

test("domain XML: a hostdev's host address comes from <source>, and <cputune> gives the vCPU pins", () => {
  const facts = domainFactsFromXml(DOMAIN_XML)!;
  assert.deepEqual(
    facts.devices.filter((d) => d.kind === 'hostdev').map((d) => d.hostAddress),
    ['0000:65:10.0', '0000:66:00.0', '0000:67:00.1'],
  );
  assert.deepEqual(facts.vcpuPins, []);
  const pinned = domainFactsFromXml(
    "<domain><cputune><vcpupin vcpu='0' cpuset='4'/><vcpupin vcpu='1' cpuset='5-6'/></cputune><devices/></domain>",
  )!;
  assert.deepEqual(pinned.vcpuPins, [
    { vcpu: 0, cpuset: '4' },
    { vcpu: 1, cpuset: '5-6' },
  ]);
});

test('numaNode / alignedCPUs follow getDeviceNUMACPUAffinity: only host devices with a host address; node 0 and no aligned vCPU are left out (omitempty)', () => {
  const withCpu = (cpu: Record<string, unknown>): VmiObject => {
    const v = structuredClone(tagged);
    (v.spec.domain as Record<string, unknown>).cpu = cpu;
    return v;
  };
  const dev = (node: number, hostAddress: string | null = '0000:65:10.0') => [
    {
      kind: 'hostdev' as const,
      alias: 'ua-hostdevice-dev1',
      address: { type: 'pci', domain: '0x0000', bus: '0x03', slot: '0x00', function: '0x0' },
      ...(hostAddress ? { hostAddress } : {}),
      hostNuma: { node, cpus: [2, 3] },
    },
  ];
  const passthrough = withCpu({ numa: { guestMappingPassthrough: {} }, dedicatedCpuPlacement: true });
  assert.equal(buildDevicesMetadata(passthrough, dev(1)).devices[0].numaNode, 1);
  assert.equal('numaNode' in buildDevicesMetadata(passthrough, dev(0)).devices[0], false);
  assert.equal('numaNode' in buildDevicesMetadata(passthrough, dev(1, null)).devices[0], false);
  const dedicated = withCpu({ dedicatedCpuPlacement: true });
  assert.deepEqual(
    buildDevicesMetadata(dedicated, dev(0), [
      { vcpu: 0, cpuset: '3' },
      { vcpu: 1, cpuset: '2-3' },
    ]).devices[0].alignedCPUs,
    [0],
  );
  assert.equal('alignedCPUs' in buildDevicesMetadata(dedicated, dev(0), [{ vcpu: 0, cpuset: '9' }]).devices[0], false);
  assert.equal(
    'alignedCPUs' in buildDevicesMetadata(withCpu({}), dev(1), [{ vcpu: 0, cpuset: '3' }]).devices[0],
    false,
  );
});
