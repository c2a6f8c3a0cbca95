import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { buildSeedDiskXml, parseDomainXml, findSeedDisk, pickFreeTarget, SEED_ALIAS } from '../../src/libvirt/disk-xml.ts';
import { VmseedError } from '../../src/errors.ts';

const fixture = (n: string) => readFileSync(new URL(`./fixtures/${n}`, import.meta.url), 'utf8');
const inDomain = (disk: string) => `<domain type='qemu'><name>d</name><devices>${disk}</devices></domain>`;

test('virtio seed disk: file-backed raw read-only disk with serial and ua- alias', () => {
  const xml = buildSeedDiskXml({ sourceFile: '/var/lib/vmseed/ns/vm/nocloud.iso', targetDev: 'vdb', bus: 'virtio' });
  assert.deepEqual(parseDomainXml(inDomain(xml)).disks, [{
    type: 'file', device: 'disk', bus: 'virtio', targetDev: 'vdb',
    sourceFile: '/var/lib/vmseed/ns/vm/nocloud.iso', alias: SEED_ALIAS, serial: 'cidata', readonly: true,
  }]);
  assert.match(xml, /<driver name="qemu" type="raw"\/>/);
});

test('scsi mode: a CD-ROM on bus scsi', () => {
  const xml = buildSeedDiskXml({ sourceFile: '/s.iso', targetDev: 'sda', bus: 'scsi' });
  const [d] = parseDomainXml(inDomain(xml)).disks;
  assert.equal(d.device, 'cdrom');
  assert.equal(d.bus, 'scsi');
  assert.equal(d.targetDev, 'sda');
  assert.equal(d.readonly, true);
});

test('round trip keeps any source path intact (quotes, ampersands, angle brackets, unicode)', () => {
  fc.assert(fc.property(fc.string({ minLength: 1, maxLength: 80 }).filter((s) => !/[\u0000-\u001f\ufffe\uffff]/.test(s) && !/[\ud800-\udfff]/.test(s)), (name) => {
    const path = `/seeds/${name}`;
    const xml = buildSeedDiskXml({ sourceFile: path, targetDev: 'vdc', bus: 'virtio' });
    assert.equal(parseDomainXml(inDomain(xml)).disks[0].sourceFile, path);
  }));
});

test('real virsh dumpxml (live, paused domain): both disks, aliases, virtio-scsi controller', () => {
  const info = parseDomainXml(fixture('dumpxml-paused-live.xml'));
  assert.equal(info.name, 'fixt');
  assert.deepEqual(info.disks, [
    { type: 'file', device: 'disk', bus: 'virtio', targetDev: 'vdb', sourceFile: '/tmp/seedA.img', alias: 'ua-vmseed', serial: 'cidata', readonly: true },
    { type: 'file', device: 'cdrom', bus: 'scsi', targetDev: 'sda', sourceFile: '/tmp/seedA.img', alias: 'ua-vmseed2', serial: undefined, readonly: true },
  ]);
  assert.deepEqual(info.scsiControllers, ['virtio-scsi']);
  assert.equal(findSeedDisk(info.disks)?.targetDev, 'vdb');
});

test('real virsh dumpxml --inactive: only the --config disk, alias kept', () => {
  const info = parseDomainXml(fixture('dumpxml-paused-inactive.xml'));
  assert.equal(info.disks.length, 1);
  assert.equal(findSeedDisk(info.disks)?.sourceFile, '/tmp/seedA.img');
});

test('a domain without devices has no disks', () => {
  assert.deepEqual(parseDomainXml('<domain><name>x</name></domain>').disks, []);
});

test('not a domain: VIRSH_FAILED', () => {
  assert.throws(() => parseDomainXml('<network/>'), (e: unknown) => e instanceof VmseedError && e.code === 'VIRSH_FAILED');
});

test('aliases libvirt would silently replace are refused', () => {
  assert.throws(() => buildSeedDiskXml({ sourceFile: '/s', targetDev: 'vdb', bus: 'virtio', alias: 'vmseed' }), (e: unknown) => e instanceof VmseedError && e.code === 'CONFIG_INVALID');
});

test('free targets: first unused in libvirt order, past vdz into vdaa', () => {
  assert.equal(pickFreeTarget('virtio', []), 'vda');
  assert.equal(pickFreeTarget('virtio', ['vda', 'vdc']), 'vdb');
  assert.equal(pickFreeTarget('scsi', ['sda', 'vdb']), 'sdb');
  const all = Array.from({ length: 26 }, (_, i) => `vd${String.fromCharCode(97 + i)}`);
  assert.equal(pickFreeTarget('virtio', all), 'vdaa');
  assert.throws(() => pickFreeTarget('virtio', [...all, 'vdaa'], 27), (e: unknown) => e instanceof VmseedError && e.code === 'NO_FREE_TARGET');
});
