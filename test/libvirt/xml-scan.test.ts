import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import fc from 'fast-check';
import { XMLParser } from 'fast-xml-parser';
import { walkXml } from '../../src/libvirt/xml-scan.ts';
import { parseDomainXml, type DomainXmlInfo } from '../../src/libvirt/disk-xml.ts';
import { VmseedError } from '../../src/errors.ts';

// A whole fast-xml-parser tree: the oracle the walker must agree with.
const oracleParser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  isArray: (_n, jpath) => jpath === 'domain.devices.disk' || jpath === 'domain.devices.controller',
  parseAttributeValue: false,
  parseTagValue: false,
  processEntities: true,
  trimValues: false,
});
type Node = Record<string, unknown>;
const attr = (n: unknown, k: string) =>
  n !== null && typeof n === 'object' && typeof (n as Node)[`@_${k}`] === 'string'
    ? ((n as Node)[`@_${k}`] as string)
    : undefined;
const text = (n: unknown) =>
  typeof n === 'string'
    ? n
    : n !== null && typeof n === 'object' && typeof (n as Node)['#text'] === 'string'
      ? ((n as Node)['#text'] as string)
      : undefined;
function oracle(xml: string): DomainXmlInfo {
  const domain = (oracleParser.parse(xml) as Node).domain as Node;
  const devices = (domain.devices ?? {}) as Node;
  return {
    name: text(domain.name) ?? '',
    disks: ((devices.disk ?? []) as Node[]).map((d) => ({
      type: attr(d, 'type') ?? 'file',
      device: attr(d, 'device') ?? 'disk',
      bus: attr(d.target, 'bus') ?? '',
      targetDev: attr(d.target, 'dev') ?? '',
      sourceFile: attr(d.source, 'file') ?? attr(d.source, 'dev'),
      alias: attr(d.alias, 'name'),
      serial: text(d.serial),
      readonly: d.readonly !== undefined,
    })),
    scsiControllers: ((devices.controller ?? []) as Node[])
      .filter((c) => attr(c, 'type') === 'scsi')
      .map((c) => ({ index: attr(c, 'index') ?? '0', model: attr(c, 'model') ?? 'default' })),
  };
}

const fixture = (p: string) => readFileSync(new URL(`../${p}`, import.meta.url), 'utf8');

test('real libvirt dumpxml (live, inactive, KubeVirt-shaped, tagged devices): the same disks and controllers as a full parse', () => {
  for (const f of [
    'libvirt/fixtures/dumpxml-paused-live.xml',
    'libvirt/fixtures/dumpxml-paused-inactive.xml',
    'fixtures/kubevirt-sync/old-layout-live.xml',
    'fixtures/kubevirt-sync/new-layout-live.xml',
    'fixtures/libvirt/domain-tagged-devices.xml',
  ]) {
    const xml = fixture(f);
    const got = parseDomainXml(xml);
    assert.deepEqual(got, oracle(xml), f);
    assert.ok(got.disks.length > 0 || f.includes('tagged'), `${f} has disks`);
  }
});

test("not the disk's: a backing chain's <source>, <devices> inside <metadata>, markup in comments; CDATA and entities decoded", () => {
  const xml = `<?xml version="1.0"?>
<!-- <domain><devices><disk> in a comment -->
<domain type='kvm' xmlns:kv='http://kubevirt.io'>
  <name>a&amp;b &#x3b1;&#946;</name>
  <metadata><kubevirt xmlns="http://kubevirt.io"><devices><disk type='file'><target dev='sdx' bus='scsi'/></disk></devices></kubevirt></metadata>
  <devices>
    <disk type='file' device='disk'>
      <source file='/a b/&quot;q&quot; &apos;s&apos; &lt;&gt;.img' index='2'/>
      <backingStore type='file' index='1'><format type='raw'/><source file='/base.img'/><backingStore/></backingStore>
      <target dev="sda" bus="scsi"/>
      <serial><![CDATA[cid<ata]]></serial>
      <alias name='ua-x'/>
      <!-- <readonly/> -->
    </disk>
    <controller type='scsi' index='0' model='virtio-non-transitional'><alias name='scsi0'/></controller>
    <controller type='usb' index='0'/>
  </devices>
</domain>
`;
  const got = parseDomainXml(xml);
  assert.equal(got.name, 'a&b αβ');
  assert.deepEqual(got.disks, [
    {
      type: 'file',
      device: 'disk',
      bus: 'scsi',
      targetDev: 'sda',
      sourceFile: `/a b/"q" 's' <>.img`,
      alias: 'ua-x',
      serial: 'cid<ata',
      readonly: false,
    },
  ]);
  assert.deepEqual(got.scsiControllers, [{ index: '0', model: 'virtio-non-transitional' }]);
});

test('an attribute value may hold ">" and "/>": the tag ends after it', () => {
  const got = parseDomainXml(
    `<domain><name>d</name><devices><disk type="file"><source file='/x>y/>'/><target dev='vdzz' bus='virtio'/></disk></devices></domain>`,
  );
  assert.equal(got.disks[0].sourceFile, '/x>y/>');
  assert.equal(got.disks[0].targetDev, 'vdzz');
});

test('not well-formed XML is DOMAIN_XML_REFUSED (retryable), never a partial answer', () => {
  const bad = [
    '',
    'plain text',
    '<domain><devices></domain>',
    '<domain><devices><disk></devices></disk></domain>',
    '<domain>',
    '<domain></domain><domain></domain>',
    '<domain></domain>trailing',
    '<!DOCTYPE d [<!ENTITY x "y">]><domain>&x;</domain>',
    '<domain><name>&bogus;</name></domain>',
    '<domain><name>&#xD800;</name></domain>',
    '<domain><name>a & b</name></domain>',
    '<domain a="1" a="2"></domain>',
    '<domain a=1></domain>',
    '<domain a="<"></domain>',
    '<domain a="x></domain>',
    '<domain a></domain>',
    '<domain><!-- unterminated </domain>',
    '<domain><![CDATA[ x </domain>',
    '<domain></ domain>',
    '<domain/ >',
  ];
  for (const xml of bad) {
    assert.throws(
      () => parseDomainXml(xml),
      (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_XML_REFUSED' && e.kind === 'retryable',
      JSON.stringify(xml),
    );
  }
  // Not a domain at all: parses, but says so.
  assert.throws(() => parseDomainXml('<network/>'), /no <domain> element/);
});

test('walkXml reports elements, depths, attributes and text in document order', () => {
  const events: string[] = [];
  walkXml(`<?xml version='1.0'?><a x='1'><b y="2"/>t&lt;<c>u</c></a>`, {
    open: (n, d, a, s) => events.push(`open ${n} ${d} ${JSON.stringify(a)}${s ? ' /' : ''}`),
    close: (n, d) => events.push(`close ${n} ${d}`),
    text: (t, d) => events.push(`text ${JSON.stringify(t)} ${d}`),
  });
  assert.deepEqual(events, [
    'open a 0 {"x":"1"}',
    'open b 1 {"y":"2"} /',
    'close b 1',
    'text "t<" 1',
    'open c 1 {}',
    'text "u" 2',
    'close c 1',
    'close a 0',
  ]);
});

// Domain XML built from random parts, with libvirt's escaping: the walker
// and the full parse agree on every one.
const safeText = fc.string({
  unit: fc.constantFrom('a', 'Z', '0', ' ', '/', '.', '-', '_', '&', '<', '>', '"', "'", 'é', '\u03b1'),
  maxLength: 12,
});
const esc = (s: string) =>
  s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/>/g, '&gt;').replace(/"/g, '&quot;').replace(/'/g, '&apos;');
const attrXml = (k: string, v: string, dq: boolean) => (dq ? ` ${k}="${esc(v)}"` : ` ${k}='${esc(v)}'`);
const diskArb = fc.record({
  type: fc.option(fc.constantFrom('file', 'block', 'network'), { nil: undefined }),
  device: fc.option(fc.constantFrom('disk', 'cdrom', 'lun'), { nil: undefined }),
  target: fc.option(
    fc.record({
      dev: fc.option(safeText, { nil: undefined }),
      bus: fc.option(fc.constantFrom('scsi', 'virtio', 'sata'), { nil: undefined }),
    }),
    { nil: undefined },
  ),
  source: fc.option(
    fc.record({ file: fc.option(safeText, { nil: undefined }), dev: fc.option(safeText, { nil: undefined }) }),
    { nil: undefined },
  ),
  alias: fc.option(safeText, { nil: undefined }),
  serial: fc.option(
    safeText.filter((s) => s.trim() !== ''),
    { nil: undefined },
  ),
  readonly: fc.boolean(),
  backing: fc.boolean(),
  comment: fc.boolean(),
  dq: fc.boolean(),
  order: fc.integer({ min: 0, max: 5 }),
});
const controllerArb = fc.record({
  type: fc.constantFrom('scsi', 'usb', 'pci'),
  index: fc.option(fc.constantFrom('0', '1'), { nil: undefined }),
  model: fc.option(fc.constantFrom('virtio-scsi', 'virtio-non-transitional', 'lsilogic'), { nil: undefined }),
});

function diskXml(d: typeof diskArb extends fc.Arbitrary<infer T> ? T : never): string {
  const parts: string[] = [];
  if (d.target)
    parts.push(
      `<target${d.target.dev !== undefined ? attrXml('dev', d.target.dev, d.dq) : ''}${d.target.bus ? attrXml('bus', d.target.bus, !d.dq) : ''}/>`,
    );
  if (d.source)
    parts.push(
      `<source${d.source.file !== undefined ? attrXml('file', d.source.file, d.dq) : ''}${d.source.dev !== undefined ? attrXml('dev', d.source.dev, d.dq) : ''}/>`,
    );
  if (d.backing) parts.push(`<backingStore type='file'><source file='/nested/base'/><backingStore/></backingStore>`);
  if (d.alias !== undefined) parts.push(`<alias${attrXml('name', d.alias, d.dq)}/>`);
  if (d.serial !== undefined) parts.push(`<serial>${esc(d.serial)}</serial>`);
  if (d.readonly) parts.push('<readonly/>');
  if (d.comment) parts.push('<!-- <source file="/in/a/comment"/> -->');
  const rotated = [...parts.slice(d.order % (parts.length || 1)), ...parts.slice(0, d.order % (parts.length || 1))];
  return `<disk${d.type ? attrXml('type', d.type, d.dq) : ''}${d.device ? attrXml('device', d.device, d.dq) : ''}>\n      ${rotated.join('\n      ')}\n    </disk>`;
}

test('property: on libvirt-shaped domain XML the walker reads exactly what a full parse reads', () => {
  fc.assert(
    fc.property(
      safeText.filter((s) => s.trim() !== ''),
      fc.array(
        fc.oneof(
          diskArb.map((d) => diskXml(d)),
          controllerArb.map(
            (c) =>
              `<controller${attrXml('type', c.type, true)}${c.index ? attrXml('index', c.index, false) : ''}${c.model ? attrXml('model', c.model, true) : ''}/>`,
          ),
          fc.constant("<interface type='ethernet'><alias name='ua-net'/><source dev='tap0'/></interface>"),
        ),
        { maxLength: 8 },
      ),
      fc.boolean(),
      (name, devices, metadata) => {
        const xml = `<domain type='kvm' id='3'>\n  <name>${esc(name)}</name>\n${metadata ? "  <metadata><kubevirt xmlns='http://kubevirt.io'><uid>x</uid></kubevirt></metadata>\n" : ''}  <devices>\n    ${devices.join('\n    ')}\n  </devices>\n</domain>\n`;
        assert.deepEqual(parseDomainXml(xml), oracle(xml));
      },
    ),
    { numRuns: 400 },
  );
});
