// A libvirt domain's interfaces and host devices, as ConfigDrive `devices`
// metadata needs them (cloudinit/devices-metadata.ts): alias, guest PCI address, MAC.
// The element and attribute names are libvirt's (docs/formatdomain.rst,
// "Network interfaces", "Host device assignment", "Device Addresses"), the
// ones KubeVirt's api.Interface / api.HostDevice read.
import { XMLParser } from 'fast-xml-parser';
import type { DomainDevice, PciAddress, VcpuPin } from '../cloudinit/devices-metadata.ts';

// Domain XML from `virsh dumpxml` is small; this bounds a hostile file.
export const MAX_DOMAIN_XML_BYTES = 1 << 20;

const parser = new XMLParser({
  ignoreAttributes: false,
  attributeNamePrefix: '@_',
  isArray: (_name, jpath) =>
    jpath === 'domain.devices.interface' || jpath === 'domain.devices.hostdev' || jpath === 'domain.cputune.vcpupin',
  parseAttributeValue: false,
  parseTagValue: false,
  processEntities: false,
});

type Node = Record<string, unknown>;

function attr(node: unknown, name: string): string | undefined {
  if (node === null || typeof node !== 'object') return undefined;
  const v = (node as Node)[`@_${name}`];
  return typeof v === 'string' ? v : undefined;
}

function address(node: unknown): PciAddress | undefined {
  const type = attr(node, 'type');
  const domain = attr(node, 'domain');
  const bus = attr(node, 'bus');
  const slot = attr(node, 'slot');
  const fn = attr(node, 'function');
  if (type === undefined || domain === undefined || bus === undefined || slot === undefined || fn === undefined)
    return undefined;
  return { type, domain, bus, slot, function: fn };
}

// The host-side address of a PCI hostdev: <source><address> has no type.
function hostAddress(node: unknown): string | undefined {
  const parts = ['domain', 'bus', 'slot', 'function'].map((n) => attr(node, n));
  if (parts.some((p) => p === undefined)) return undefined;
  const [d, b, s, f] = parts.map((p) => (p!.startsWith('0x') ? p!.slice(2) : p!));
  return `${d}:${b}:${s}.${f}`;
}

export interface DomainFacts {
  devices: DomainDevice[];
  // <cputune><vcpupin vcpu= cpuset=>: which host CPUs each vCPU is pinned to.
  vcpuPins: VcpuPin[];
}

// Devices in document order, interfaces and hostdevs each. Returns undefined
// when the text is not a domain (the caller then renders from the spec).
export function domainDevicesFromXml(xml: string): DomainDevice[] | undefined {
  return domainFactsFromXml(xml)?.devices;
}

export function domainFactsFromXml(xml: string): DomainFacts | undefined {
  if (Buffer.byteLength(xml) > MAX_DOMAIN_XML_BYTES) return undefined;
  let doc: Node;
  try {
    doc = parser.parse(xml) as Node;
  } catch {
    return undefined;
  }
  const domain = doc.domain as Node | undefined;
  if (!domain || typeof domain !== 'object') return undefined;
  const devices = (domain.devices ?? {}) as Node;
  const out: DomainDevice[] = [];
  for (const i of (devices.interface ?? []) as Node[]) {
    const alias = attr(i.alias, 'name');
    const addr = address(i.address);
    const mac = attr(i.mac, 'address');
    out.push({
      kind: 'interface',
      ...(alias ? { alias } : {}),
      ...(addr ? { address: addr } : {}),
      ...(mac ? { mac } : {}),
    });
  }
  for (const h of (devices.hostdev ?? []) as Node[]) {
    const alias = attr(h.alias, 'name');
    // The guest-side address is the hostdev's own <address>; <source><address>
    // is the host's.
    const addr = address(h.address);
    const host = hostAddress((h.source as Node | undefined)?.address);
    out.push({
      kind: 'hostdev',
      ...(alias ? { alias } : {}),
      ...(addr ? { address: addr } : {}),
      ...(host ? { hostAddress: host } : {}),
    });
  }
  const vcpuPins: VcpuPin[] = [];
  const cputune = domain.cputune as Node | undefined;
  for (const p of (cputune && typeof cputune === 'object' ? (cputune.vcpupin ?? []) : []) as Node[]) {
    const vcpu = Number(attr(p, 'vcpu'));
    const cpuset = attr(p, 'cpuset');
    if (Number.isInteger(vcpu) && vcpu >= 0 && cpuset !== undefined) vcpuPins.push({ vcpu, cpuset });
  }
  return { devices: out, vcpuPins };
}
