// A libvirt domain's interfaces and host devices, as ConfigDrive `devices`
// metadata needs them (cloudinit/devices-metadata.ts): alias, guest PCI address, MAC.
// The element and attribute names are libvirt's (docs/formatdomain.rst,
// "Network interfaces", "Host device assignment", "Device Addresses"), the
// ones KubeVirt's api.Interface / api.HostDevice read.
//
// Read with the injector's strict scanner (libvirt/xml-scan.ts: no DTD, no
// entity expansion), keeping only the elements below; nothing else of the
// document is built.
import { walkXml } from './xml-scan.ts';
import type { DomainDevice, PciAddress, VcpuPin } from '../cloudinit/devices-metadata.ts';

// Domain XML from `virsh dumpxml` is small; this bounds a hostile file.
export const MAX_DOMAIN_XML_BYTES = 1 << 20;

// Absent attributes read as undefined.
type Attrs = Record<string, string | undefined>;

function address(a: Attrs | undefined): PciAddress | undefined {
  if (!a) return undefined;
  const { type, domain, bus, slot, function: fn } = a;
  if (type === undefined || domain === undefined || bus === undefined || slot === undefined || fn === undefined)
    return undefined;
  return { type, domain, bus, slot, function: fn };
}

// The host-side address of a PCI hostdev: <source><address> has no type.
function hostAddress(a: Attrs | undefined): string | undefined {
  if (!a) return undefined;
  const parts = [a.domain, a.bus, a.slot, a.function];
  if (parts.some((p) => p === undefined)) return undefined;
  const [d, b, s, f] = parts.map((p) => (p!.startsWith('0x') ? p!.slice(2) : p!));
  return `${d}:${b}:${s}.${f}`;
}

/** What the ConfigDrive `devices` metadata reads of a domain's XML. */
export interface DomainFacts {
  devices: DomainDevice[];
  // <cputune><vcpupin vcpu= cpuset=>: which host CPUs each vCPU is pinned to.
  vcpuPins: VcpuPin[];
}

// One <interface> or <hostdev>: the attributes of its children that matter.
// A child that appears twice (never from libvirt) is ambiguous and read as
// absent.
class DeviceReader {
  readonly kind: DomainDevice['kind'];
  readonly #children = new Map<string, Attrs | null>();
  #sourceAddress: Attrs | null | undefined;

  constructor(kind: DomainDevice['kind']) {
    this.kind = kind;
  }

  child(name: string, a: Attrs): void {
    this.#children.set(name, this.#children.has(name) ? null : a);
  }

  // <source><address>, only for the first <source>.
  sourceAddress(a: Attrs): void {
    if (this.#children.get('source') === null) return;
    this.#sourceAddress = this.#sourceAddress === undefined ? a : null;
  }

  #get(name: string): Attrs | undefined {
    return this.#children.get(name) ?? undefined;
  }

  device(): DomainDevice {
    const alias = this.#get('alias')?.name;
    const addr = address(this.#get('address'));
    if (this.kind === 'interface') {
      const mac = this.#get('mac')?.address;
      return {
        kind: 'interface',
        ...(alias ? { alias } : {}),
        ...(addr ? { address: addr } : {}),
        ...(mac ? { mac } : {}),
      };
    }
    // The guest-side address is the hostdev's own <address>; <source><address>
    // is the host's.
    const source = this.#children.get('source') === null ? undefined : (this.#sourceAddress ?? undefined);
    const host = hostAddress(source);
    return {
      kind: 'hostdev',
      ...(alias ? { alias } : {}),
      ...(addr ? { address: addr } : {}),
      ...(host ? { hostAddress: host } : {}),
    };
  }
}

/**
 * Devices in document order, interfaces and hostdevs each. Returns undefined
 * when the text is not a domain, or is over 1 MiB or malformed (the caller
 * then renders from the spec); never throws.
 */
export function domainDevicesFromXml(xml: string): DomainDevice[] | undefined {
  return domainFactsFromXml(xml)?.devices;
}

export function domainFactsFromXml(xml: string): DomainFacts | undefined {
  if (Buffer.byteLength(xml) > MAX_DOMAIN_XML_BYTES) return undefined;
  let rootIsDomain = false;
  // Which of <devices> / <cputune> (depth 1) the walk is in, and how many
  // of each the domain has: a repeated one is ambiguous and yields nothing.
  let section: 'devices' | 'cputune' | undefined;
  const seen = { devices: 0, cputune: 0 };
  const interfaces: DeviceReader[] = [];
  const hostdevs: DeviceReader[] = [];
  const pins: VcpuPin[] = [];
  let device: DeviceReader | undefined;
  let inSource = false;
  try {
    walkXml(xml, {
      open(el, depth, a) {
        if (depth === 0) rootIsDomain = el === 'domain';
        else if (!rootIsDomain) return;
        else if (depth === 1) {
          section = el === 'devices' || el === 'cputune' ? el : undefined;
          if (section) seen[section]++;
        } else if (depth === 2 && section === 'devices' && (el === 'interface' || el === 'hostdev')) {
          device = new DeviceReader(el);
          (el === 'interface' ? interfaces : hostdevs).push(device);
        } else if (depth === 2 && section === 'cputune' && el === 'vcpupin') {
          const vcpu = Number(a.vcpu);
          if (Number.isInteger(vcpu) && vcpu >= 0 && a.cpuset !== undefined) pins.push({ vcpu, cpuset: a.cpuset });
        } else if (depth === 3 && device) {
          device.child(el, a);
          inSource = el === 'source';
        } else if (depth === 4 && device && inSource && el === 'address') {
          device.sourceAddress(a);
        }
      },
      close(_el, depth) {
        if (depth === 1) section = undefined;
        else if (depth === 2) device = undefined;
        else if (depth === 3) inSource = false;
      },
    });
  } catch {
    return undefined;
  }
  if (!rootIsDomain) return undefined;
  const devices = seen.devices === 1 ? [...interfaces, ...hostdevs].map((d) => d.device()) : [];
  return { devices, vcpuPins: seen.cputune === 1 ? pins : [] };
}
