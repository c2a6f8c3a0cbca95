// Builds the seed disk's libvirt XML and reads the disks out of a domain's
// XML (`virsh dumpxml`, live or --inactive). Pure: strings in, data out.
import { XMLBuilder, XMLParser } from 'fast-xml-parser';
import { VmseedError } from '../errors.ts';

// libvirt keeps user aliases only when they start with `ua-` (others are
// silently replaced), so this is how we find our disk again.
export const SEED_ALIAS = 'ua-vmseed';
export const SEED_SERIAL = 'cidata';

export type SeedBus = 'virtio' | 'scsi';

export interface SeedDiskSpec {
  sourceFile: string;
  targetDev: string;
  bus: SeedBus;
  alias?: string;
  serial?: string;
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
  // `model` of every `<controller type='scsi'>`.
  scsiControllers: string[];
}

const builder = new XMLBuilder({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  format: true,
  indentBy: '  ',
  suppressEmptyNode: true,
});

// virtio: a read-only virtio disk (PCI hot-plug). scsi: a CD-ROM on a
// virtio-scsi controller, the only hot-pluggable CD-ROM (libvirt
// src/qemu/qemu_hotplug.c qemuDomainAttachDeviceDiskLive; checked on libvirt 9.0).
export function buildSeedDiskXml(spec: SeedDiskSpec): string {
  const alias = spec.alias ?? SEED_ALIAS;
  if (!/^ua-[a-zA-Z0-9_-]+$/.test(alias)) {
    throw new VmseedError('CONFIG_INVALID', `disk alias '${alias}' must start with 'ua-' and use only [a-zA-Z0-9_-]; libvirt drops other aliases`, { field: 'alias' });
  }
  const disk: Record<string, unknown> = {
    '@_type': 'file',
    '@_device': spec.bus === 'scsi' ? 'cdrom' : 'disk',
    driver: { '@_name': 'qemu', '@_type': 'raw' },
    source: { '@_file': spec.sourceFile },
    target: { '@_dev': spec.targetDev, '@_bus': spec.bus },
    readonly: '',
    serial: spec.serial ?? SEED_SERIAL,
    alias: { '@_name': alias },
  };
  return builder.build({ disk }) as string;
}

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  // Elements that may repeat are always arrays, so one disk and many read alike.
  isArray: (name, jpath) => jpath === 'domain.devices.disk' || jpath === 'domain.devices.controller',
  parseAttributeValue: false,
  parseTagValue: false,
  processEntities: true,
  // A source path may end in a space; trimming would make our own disk look
  // like a different seed and trigger a replace on every pass.
  trimValues: false,
});

type Node = Record<string, unknown>;

function attr(node: unknown, name: string): string | undefined {
  if (node === null || typeof node !== 'object') return undefined;
  const v = (node as Node)[`@_${name}`];
  return typeof v === 'string' ? v : undefined;
}

function text(node: unknown): string | undefined {
  if (typeof node === 'string') return node;
  if (node !== null && typeof node === 'object' && typeof (node as Node)['#text'] === 'string') return (node as Node)['#text'] as string;
  return undefined;
}

export function parseDomainXml(xml: string): DomainXmlInfo {
  let doc: Node;
  try {
    doc = parser.parse(xml) as Node;
  } catch (e) {
    throw new VmseedError('VIRSH_FAILED', 'virsh dumpxml returned XML that does not parse; check the libvirt version', { kind: 'retryable', cause: e });
  }
  const domain = doc.domain as Node | undefined;
  if (!domain || typeof domain !== 'object') {
    throw new VmseedError('VIRSH_FAILED', 'virsh dumpxml returned no <domain> element', { kind: 'retryable' });
  }
  const devices = (domain.devices ?? {}) as Node;
  const disks: DomainDisk[] = ((devices.disk ?? []) as Node[]).map((d) => ({
    type: attr(d, 'type') ?? 'file',
    device: attr(d, 'device') ?? 'disk',
    bus: attr(d.target, 'bus') ?? '',
    targetDev: attr(d.target, 'dev') ?? '',
    // file-backed disks use file=, block devices dev=, volumes volume=.
    sourceFile: attr(d.source, 'file') ?? attr(d.source, 'dev'),
    alias: attr(d.alias, 'name'),
    serial: text(d.serial),
    readonly: d.readonly !== undefined,
  }));
  const scsiControllers = ((devices.controller ?? []) as Node[])
    .filter((c) => attr(c, 'type') === 'scsi')
    .map((c) => attr(c, 'model') ?? 'default');
  return { name: text(domain.name) ?? '', disks, scsiControllers };
}

export function findSeedDisk(disks: DomainDisk[], alias: string = SEED_ALIAS): DomainDisk | undefined {
  return disks.find((d) => d.alias === alias);
}

// The first free target on the bus, in libvirt's naming: vda..vdz, vdaa..;
// sda..; skipping every target any disk already uses (live or config).
export function pickFreeTarget(bus: SeedBus, used: Iterable<string>, max = 26 * 27): string {
  const prefix = bus === 'scsi' ? 'sd' : 'vd';
  const taken = new Set(used);
  for (let i = 0; i < max; i++) {
    const name = prefix + indexToSuffix(i);
    if (!taken.has(name)) return name;
  }
  throw new VmseedError('NO_FREE_TARGET', `no free ${bus} disk target (${prefix}*) left on the domain; remove unused disks`, { kind: 'terminal', field: 'bus' });
}

function indexToSuffix(i: number): string {
  let s = '';
  let n = i;
  do {
    s = String.fromCharCode(97 + (n % 26)) + s;
    n = Math.floor(n / 26) - 1;
  } while (n >= 0);
  return s;
}
