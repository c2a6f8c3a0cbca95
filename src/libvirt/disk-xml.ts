// Builds the seed disk's libvirt XML and reads the disks out of a domain's
// XML (`virsh dumpxml`, live or --inactive). Pure: strings in, data out.
import { VmseedError } from '../errors.ts';
import { walkXml, type XmlVisitor } from './xml-scan.ts';

// libvirt keeps user aliases only when they start with `ua-` (others are
// silently replaced), so this is how we find our disk again. KubeVirt names
// its disks `ua-<disk name>` with DNS-1123 names (kubevirt
// pkg/virt-launcher/virtwrap/converter), which never hold an underscore:
// `ua-vmseed_seed` cannot be a KubeVirt disk, where `ua-vmseed` could.
export const SEED_ALIAS = 'ua-vmseed_seed';
export const SEED_SERIAL = 'cidata';

// Fixed targets far from the start. KubeVirt names disks by the lowest free
// index per prefix (`vd` virtio; `sd` shared by sata, scsi and usb;
// pkg/virt-launcher/virtwrap/converter/storage/disk.go): a seed on the first
// free name takes the one KubeVirt's next hot-plugged volume gets. Index 701.
export const SEED_TARGETS = { scsi: 'sdzz', virtio: 'vdzz' } as const;
// KubeVirt's SCSI disks sit on controller 0, bus 0, target 0, unit = their
// index; target 7 is never one of theirs.
export const SEED_SCSI_ADDRESS = { controller: '0', bus: '0', target: '7', unit: '0' } as const;

export type SeedBus = 'virtio' | 'scsi';

export interface SeedDiskSpec {
  sourceFile: string;
  targetDev: string;
  bus: SeedBus;
  alias?: string;
  serial?: string;
  // scsi: the drive address (default SEED_SCSI_ADDRESS); null: libvirt picks.
  address?: { controller: string; bus: string; target: string; unit: string } | null;
}

export interface DomainDisk {
  type: string;
  device: string;
  bus: string;
  targetDev: string;
  sourceFile: string | undefined;
  alias: string | undefined;
  serial: string | undefined;
  readonly: boolean;
}

export interface DomainXmlInfo {
  name: string;
  disks: DomainDisk[];
  // Every `<controller type='scsi'>`: its index and model.
  scsiControllers: Array<{ index: string; model: string }>;
}

// An attribute value or text as XML 1.0 carries it: the five markup
// characters, and the whitespace a parser normalises in an attribute
// (libvirt's libxml2 turns a literal tab or newline there into a space), as
// references. Characters XML 1.0 cannot hold at all (other C0 controls,
// U+FFFE/U+FFFF, lone surrogates) are refused rather than sent to libvirt.
const ESCAPES: Record<string, string> = {
  '&': '&amp;',
  '<': '&lt;',
  '>': '&gt;',
  '"': '&quot;',
  "'": '&apos;',
  '\t': '&#9;',
  '\n': '&#10;',
  '\r': '&#13;',
};
function xmlValue(field: string, value: string): string {
  // The characters XML 1.0 cannot carry.
  if (/[\u0000-\u0008\u000b\u000c\u000e-\u001f\ufffe\uffff]/.test(value) || !value.isWellFormed()) {
    throw new VmseedError(
      'CONFIG_INVALID',
      `seed disk ${field} holds a character XML cannot carry (a control character or a lone surrogate)${field === 'sourceFile' ? '; it is made of --state-dir, --publish-dir and --image-path-in-domain: keep them to plain paths' : ''}`,
      { field },
    );
  }
  return value.replace(/[&<>"'\t\n\r]/g, (c) => ESCAPES[c]);
}

// virtio: a read-only virtio disk (PCI hot-plug). scsi: a read-only disk at
// a fixed drive address on the virtio-scsi controller: it takes no PCIe port
// (KubeVirt reserves few for its own hot-plug) and detaches at once, also
// from a paused guest (a virtio unplug waits for the guest).
export function buildSeedDiskXml(spec: SeedDiskSpec): string {
  const alias = spec.alias ?? SEED_ALIAS;
  if (!/^ua-[a-zA-Z0-9_-]+$/.test(alias)) {
    throw new VmseedError(
      'CONFIG_INVALID',
      `disk alias '${alias}' must start with 'ua-' and use only [a-zA-Z0-9_-]; libvirt drops other aliases`,
      { field: 'alias' },
    );
  }
  // Built as a string: this runs on every injection, where a general XML
  // builder's first calls cost a paused VM milliseconds.
  const lines = [
    '<disk type="file" device="disk">',
    '  <driver name="qemu" type="raw"/>',
    `  <source file="${xmlValue('sourceFile', spec.sourceFile)}"/>`,
    `  <target dev="${xmlValue('targetDev', spec.targetDev)}" bus="${xmlValue('bus', spec.bus)}"/>`,
    '  <readonly/>',
    `  <serial>${xmlValue('serial', spec.serial ?? SEED_SERIAL)}</serial>`,
    `  <alias name="${alias}"/>`,
  ];
  const address = spec.address === undefined ? SEED_SCSI_ADDRESS : spec.address;
  if (spec.bus === 'scsi' && address !== null) {
    const at = (v: string) => xmlValue('address', v);
    lines.push(
      `  <address type="drive" controller="${at(address.controller)}" bus="${at(address.bus)}" target="${at(address.target)}" unit="${at(address.unit)}"/>`,
    );
  }
  lines.push('</disk>', '');
  return lines.join('\n');
}

// Only what the injector uses: `<domain><name>`, and the direct children of
// `<domain><devices>` that are `<disk>` (their own `<target>`, `<source>`,
// `<alias>`, `<serial>`, `<readonly>`; a backing chain's nested `<source>`
// is not the disk's) and `<controller type='scsi'>`.
export function parseDomainXml(xml: string): DomainXmlInfo {
  const reader = new DomainXmlReader();
  try {
    walkXml(xml, reader);
  } catch (e) {
    if (e instanceof VmseedError) throw e;
    throw new VmseedError(
      'DOMAIN_XML_REFUSED',
      'libvirt returned domain XML that does not parse; check the libvirt version',
      {
        kind: 'retryable',
        cause: e,
      },
    );
  }
  if (!reader.rootIsDomain) {
    throw new VmseedError('DOMAIN_XML_REFUSED', 'libvirt returned XML with no <domain> element', { kind: 'retryable' });
  }
  return { name: reader.name ?? '', disks: reader.disks, scsiControllers: reader.scsiControllers };
}

// parseDomainXml's visitor: the element path down to depth 3, as far as it
// matters.
class DomainXmlReader implements XmlVisitor {
  readonly disks: DomainDisk[] = [];
  readonly scsiControllers: DomainXmlInfo['scsiControllers'] = [];
  name: string | undefined;
  rootIsDomain = false;
  #inDevices = false;
  #disk: DomainDisk | undefined;
  #child: string | undefined; // a disk's child (depth 3) or domain's <name>
  #seen: Set<string> | undefined; // a disk's children met so far

  open(el: string, depth: number, a: Record<string, string>): void {
    if (depth === 0) this.rootIsDomain = el === 'domain';
    else if (!this.rootIsDomain) return;
    else if (depth === 1) this.#openTop(el);
    else if (depth === 2 && this.#inDevices) this.#openDevice(el, a);
    else if (depth === 3 && this.#disk) this.#openDiskChild(this.#disk, el, a);
  }

  text(t: string, depth: number): void {
    if (this.#child === 'name' && depth === 2 && this.name !== undefined) this.name += t;
    else if (this.#child === 'serial' && depth === 4 && this.#disk?.serial !== undefined) this.#disk.serial += t;
  }

  close(_el: string, depth: number): void {
    if (depth === 1) {
      this.#inDevices = false;
      if (this.#child === 'name') this.#child = undefined;
    } else if (depth === 2) {
      this.#disk = undefined;
    } else if (depth === 3) {
      this.#child = undefined;
    }
  }

  #openTop(el: string): void {
    this.#inDevices = el === 'devices';
    if (el === 'name' && this.name === undefined) {
      this.#child = 'name';
      this.name = '';
    }
  }

  #openDevice(el: string, a: Record<string, string>): void {
    if (el === 'disk') {
      this.#disk = {
        type: a.type ?? 'file',
        device: a.device ?? 'disk',
        bus: '',
        targetDev: '',
        sourceFile: undefined,
        alias: undefined,
        serial: undefined,
        readonly: false,
      };
      this.#seen = new Set();
      this.disks.push(this.#disk);
    } else if (el === 'controller' && a.type === 'scsi') {
      this.scsiControllers.push({ index: a.index ?? '0', model: a.model ?? 'default' });
    }
  }

  // A repeated child (never from libvirt) leaves the field unset, as an
  // ambiguous answer should.
  #openDiskChild(disk: DomainDisk, el: string, a: Record<string, string>): void {
    const again = this.#seen!.has(el);
    this.#seen!.add(el);
    this.#child = el;
    if (el === 'target') {
      disk.bus = again ? '' : (a.bus ?? '');
      disk.targetDev = again ? '' : (a.dev ?? '');
    } else if (el === 'source') {
      // file-backed disks use file=, block devices dev=.
      disk.sourceFile = again ? undefined : (a.file ?? a.dev);
    } else if (el === 'alias') {
      disk.alias = again ? undefined : a.name;
    } else if (el === 'readonly') {
      disk.readonly = true;
    } else if (el === 'serial') {
      disk.serial = again ? undefined : '';
      if (again) this.#child = undefined;
    }
  }
}

export function findSeedDisk(disks: DomainDisk[], alias: string = SEED_ALIAS): DomainDisk | undefined {
  return disks.find((d) => d.alias === alias);
}

// The seed's bus on this domain: SCSI where a virtio-scsi controller 0 takes
// the fixed drive address (KubeVirt adds one unless disableHotplug is set and
// no disk uses scsi), else virtio. KubeVirt's converter names the model
// virtio-non-transitional (virtio-transitional with useVirtioTransitional) on
// amd64 and arm64, virtio-scsi on s390x; libvirt keeps the name it was given.
const VIRTIO_SCSI_MODELS = new Set(['virtio-scsi', 'virtio-non-transitional', 'virtio-transitional']);
export function seedBusFor(wanted: SeedBus, controllers: DomainXmlInfo['scsiControllers']): SeedBus {
  if (wanted === 'virtio') return 'virtio';
  return controllers.some((c) => c.index === '0' && VIRTIO_SCSI_MODELS.has(c.model)) ? 'scsi' : 'virtio';
}
