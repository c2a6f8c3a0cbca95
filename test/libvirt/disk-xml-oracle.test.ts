// The seed disk XML read by a reader that is not vmseed's: the fake
// libvirt's XML 1.0 reader (test/support/fake-device-xml.ts), which
// normalises attribute values and line ends as libvirt's libxml2 does and
// refuses what is not well-formed. Whatever path and serial vmseed is given,
// libvirt must read back those very strings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { buildSeedDiskXml } from '../../src/libvirt/disk-xml.ts';
import { parseDiskDevice, parseXml } from '../support/fake-device-xml.ts';

// What XML 1.0 can carry (Char, production [2]), white space and markup
// characters included.
const xmlChar = fc
  .oneof(
    fc.constantFrom('\t', '\n', '\r', '\r\n', ' ', '&', '<', '>', '"', "'", ']]>', '&amp;', '&#9;'),
    fc.string({ unit: 'grapheme', minLength: 1, maxLength: 3 }),
  )
  .filter((s) => !/[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]/.test(s) && s.isWellFormed());
const xmlString = fc.array(xmlChar, { minLength: 1, maxLength: 20 }).map((a) => a.join(''));

test('an independent XML reader gets back every source path and serial vmseed writes, white space included', () => {
  fc.assert(
    fc.property(xmlString, xmlString, fc.constantFrom('virtio', 'scsi'), (name, serial, bus: 'virtio' | 'scsi') => {
      const sourceFile = `/seeds/${name}`;
      const targetDev = bus === 'scsi' ? 'sdzz' : 'vdzz';
      const xml = buildSeedDiskXml({ sourceFile, targetDev, bus, serial });
      assert.deepEqual(parseDiskDevice(xml), {
        type: 'file',
        device: 'disk',
        bus,
        targetDev,
        sourceFile,
        alias: 'ua-vmseed_seed',
        serial,
        readonly: true,
      });
    }),
    { numRuns: 300 },
  );
});

test('the scsi seed sits at the fixed drive address, as libvirt reads it', () => {
  const disk = parseXml(buildSeedDiskXml({ sourceFile: '/s.iso', targetDev: 'sdzz', bus: 'scsi' }));
  const address = disk.children.find((c) => c.name === 'address');
  assert.deepEqual(Object.fromEntries(address?.attrs ?? []), {
    type: 'drive',
    controller: '0',
    bus: '0',
    target: '7',
    unit: '0',
  });
});

test('the reader is strict where libxml2 is: what it refuses and how it normalises', () => {
  const refused = [
    '<disk type="file"device="disk"><target dev="vda"/></disk>',
    '<disk type="file" type="block"><target dev="vda"/></disk>',
    '<disk><target dev="a&b"/></disk>',
    '<disk><target dev="vda"/></disc>',
    '<disk><target dev="vda"/>',
    '<disk><target dev=vda/></disk>',
    '<disk><!-- a -- b --><target dev="vda"/></disk>',
    '<disk><target dev="vda"/></disk><disk/>',
  ];
  for (const xml of refused) assert.throws(() => parseXml(xml), /offset/, xml);
  const tabbed = parseDiskDevice('<disk><source file="/a\tb\r\nc&#9;d"/><target dev="vda"/></disk>');
  assert.equal(tabbed.sourceFile, '/a b c\td');
  // libvirt 9.0's answers to a file disk's path in `dev`, and to no target.
  assert.throws(
    () => parseDiskDevice('<disk type="file"><source dev="/x"/><target dev="sdzz"/></disk>'),
    /^Error: missing source information for device sdzz$/,
  );
  assert.throws(
    () => parseDiskDevice('<disk><source file="/x"/></disk>'),
    /^Error: missing target information for device \/x$/,
  );
  assert.equal(parseDiskDevice('<disk device="cdrom"><target dev="sda"/></disk>').sourceFile, undefined);
});
