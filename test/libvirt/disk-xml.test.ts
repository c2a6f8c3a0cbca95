import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import {
  buildSeedDiskXml,
  parseDomainXml,
  findSeedDisk,
  seedBusFor,
  SEED_ALIAS,
  SEED_TARGETS,
} from '../../src/libvirt/disk-xml.ts';
import { VmseedError } from '../../src/errors.ts';

const fixture = (n: string) => readFileSync(new URL(`./fixtures/${n}`, import.meta.url), 'utf8');
const inDomain = (disk: string) => `<domain type='qemu'><name>d</name><devices>${disk}</devices></domain>`;

test('virtio seed disk: file-backed raw read-only disk with serial and ua- alias', () => {
  const xml = buildSeedDiskXml({ sourceFile: '/var/lib/vmseed/ns/vm/nocloud.iso', targetDev: 'vdb', bus: 'virtio' });
  assert.deepEqual(parseDomainXml(inDomain(xml)).disks, [
    {
      type: 'file',
      device: 'disk',
      bus: 'virtio',
      targetDev: 'vdb',
      sourceFile: '/var/lib/vmseed/ns/vm/nocloud.iso',
      alias: SEED_ALIAS,
      serial: 'cidata',
      readonly: true,
    },
  ]);
  assert.match(xml, /<driver name="qemu" type="raw"\/>/);
});

test("scsi mode: a read-only disk at drive address 0:0:7:0 (KubeVirt's SCSI disks use target 0)", () => {
  const xml = buildSeedDiskXml({ sourceFile: '/s.iso', targetDev: 'sdzz', bus: 'scsi' });
  const [d] = parseDomainXml(inDomain(xml)).disks;
  assert.deepEqual(
    [d.device, d.bus, d.targetDev, d.readonly, d.alias],
    ['disk', 'scsi', 'sdzz', true, 'ua-vmseed_seed'],
  );
  assert.match(xml, /<address type="drive" controller="0" bus="0" target="7" unit="0"\/>/);
  // A detach names the disk by its target: no address needed.
  assert.doesNotMatch(
    buildSeedDiskXml({ sourceFile: '/s.iso', targetDev: 'sdzz', bus: 'scsi', address: null }),
    /<address/,
  );
  assert.doesNotMatch(buildSeedDiskXml({ sourceFile: '/s.iso', targetDev: 'vdzz', bus: 'virtio' }), /<address/);
});

test("our alias cannot be a KubeVirt disk's (ua-<DNS-1123 name>); the fixed targets are far from the first free ones", () => {
  assert.equal(SEED_ALIAS, 'ua-vmseed_seed');
  const dns1123 = /^[a-z0-9]([-a-z0-9]*[a-z0-9])?$/;
  assert.equal(dns1123.test(SEED_ALIAS.slice('ua-'.length)), false);
  assert.equal(dns1123.test('vmseed'), true, 'ua-vmseed could be a VMI disk named vmseed');
  assert.deepEqual(SEED_TARGETS, { scsi: 'sdzz', virtio: 'vdzz' });
});

test('bus: scsi only on a domain with virtio-scsi controller 0, else virtio; virtio stays virtio', () => {
  assert.equal(seedBusFor('scsi', [{ index: '0', model: 'virtio-scsi' }]), 'scsi');
  // KubeVirt's x86 and arm domains: the model is the virtio variant's name.
  assert.equal(seedBusFor('scsi', [{ index: '0', model: 'virtio-non-transitional' }]), 'scsi');
  assert.equal(seedBusFor('scsi', [{ index: '0', model: 'virtio-transitional' }]), 'scsi');
  assert.equal(seedBusFor('scsi', []), 'virtio');
  assert.equal(seedBusFor('scsi', [{ index: '0', model: 'lsilogic' }]), 'virtio');
  assert.equal(seedBusFor('scsi', [{ index: '1', model: 'virtio-scsi' }]), 'virtio');
  assert.equal(seedBusFor('virtio', [{ index: '0', model: 'virtio-scsi' }]), 'virtio');
});

test('round trip keeps any source path intact (quotes, ampersands, angle brackets, unicode)', () => {
  fc.assert(
    fc.property(
      fc
        .string({ minLength: 1, maxLength: 80 })
        .filter((s) => !/[\u0000-\u001f\ufffe\uffff]/.test(s) && !/[\ud800-\udfff]/.test(s)),
      (name) => {
        const path = `/seeds/${name}`;
        const xml = buildSeedDiskXml({ sourceFile: path, targetDev: 'vdc', bus: 'virtio' });
        assert.equal(parseDomainXml(inDomain(xml)).disks[0].sourceFile, path);
      },
    ),
  );
});

test('real virsh dumpxml (live, paused domain): both disks, aliases, virtio-scsi controller', () => {
  const info = parseDomainXml(fixture('dumpxml-paused-live.xml'));
  assert.equal(info.name, 'fixt');
  assert.deepEqual(info.disks, [
    {
      type: 'file',
      device: 'disk',
      bus: 'virtio',
      targetDev: 'vdb',
      sourceFile: '/tmp/seedA.img',
      alias: 'ua-vmseed',
      serial: 'cidata',
      readonly: true,
    },
    {
      type: 'file',
      device: 'cdrom',
      bus: 'scsi',
      targetDev: 'sda',
      sourceFile: '/tmp/seedA.img',
      alias: 'ua-vmseed2',
      serial: undefined,
      readonly: true,
    },
  ]);
  assert.deepEqual(info.scsiControllers, [{ index: '0', model: 'virtio-scsi' }]);
  assert.equal(findSeedDisk(info.disks, 'ua-vmseed')?.targetDev, 'vdb');
  assert.equal(findSeedDisk(info.disks), undefined);
});

test('real virsh dumpxml --inactive: only the --config disk, alias kept', () => {
  const info = parseDomainXml(fixture('dumpxml-paused-inactive.xml'));
  assert.equal(info.disks.length, 1);
  assert.equal(findSeedDisk(info.disks, 'ua-vmseed')?.sourceFile, '/tmp/seedA.img');
});

test('a domain without devices has no disks', () => {
  assert.deepEqual(parseDomainXml('<domain><name>x</name></domain>').disks, []);
});

test('not a domain: DOMAIN_XML_REFUSED', () => {
  assert.throws(
    () => parseDomainXml('<network/>'),
    (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_XML_REFUSED',
  );
});

test('aliases libvirt would silently replace are refused', () => {
  assert.throws(
    () => buildSeedDiskXml({ sourceFile: '/s', targetDev: 'vdb', bus: 'virtio', alias: 'vmseed' }),
    (e: unknown) => e instanceof VmseedError && e.code === 'CONFIG_INVALID',
  );
});
