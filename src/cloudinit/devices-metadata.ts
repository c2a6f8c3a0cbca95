// ConfigDrive `devices` metadata: which guest device carries which `tag:` of
// the VMI spec, as KubeVirt's virt-launcher writes it
// (pkg/virt-launcher/virtwrap/manager.go buildDevicesMetadata,
// addToDeviceMetadata; pkg/cloud-init/cloud-init.go DeviceData).
//
// KubeVirt reads the guest addresses from the live domain:
// - given the domain's devices (`DomainDevice`, from its XML; the agent reads
//   them first for VMIs that need them, see devicesNeedingDomain), everything
//   KubeVirt lists is listed from there: interfaces by alias "ua-<name>",
//   SR-IOV interfaces and host devices by their hostdev aliases;
// - without a domain, a tagged interface with `pciAddress` (and
//   `macAddress`) is listed with bus "pci", that address and that MAC, and
//   what needs the domain (an interface without pciAddress, host devices,
//   GPUs) gives a DEVICE_METADATA_INCOMPLETE warning.
// `numaNode` and `alignedCPUs` of a host device (getDeviceNUMACPUAffinity):
// its host NUMA node (`hostNuma`, read from the host's sysfs by the caller)
// when the VMI asks for guestMappingPassthrough, else, with
// dedicatedCpuPlacement, the vCPUs pinned to a CPU of that node.
import type { VmiObject } from '../api/objects.ts';
import type { SeedWarning } from './seed.ts';

export interface DeviceData {
  type: 'nic' | 'hostdev';
  bus: string;
  address: string;
  mac?: string;
  numaNode?: number;
  alignedCPUs?: number[];
  tags: string[];
}

/** One <cputune><vcpupin> of the domain: a guest vCPU and the host cpuset it is pinned to. */
export interface VcpuPin {
  vcpu: number;
  cpuset: string;
}

/** A libvirt PCI <address>, its attributes as the domain XML has them (with or without "0x"). */
export interface PciAddress {
  type: string;
  domain: string;
  bus: string;
  slot: string;
  function: string;
}

/** An interface or host device of the running domain, read from its XML by the caller. */
export interface DomainDevice {
  kind: 'interface' | 'hostdev';
  // The libvirt alias, e.g. "ua-default", "ua-sriov-net1", "ua-hostdevice-dev1", "ua-gpu-gpu1".
  alias?: string;
  address?: PciAddress;
  mac?: string;
  // A hostdev's host PCI address (<source><address>), e.g. "0000:65:10.0".
  hostAddress?: string;
  // Its host NUMA node and that node's CPUs (host-numa.ts), when known.
  hostNuma?: { node: number; cpus?: number[] };
}

interface Tagged {
  name: string;
  tag: string;
  pciAddress?: string;
  macAddress?: string;
}

function tagged(list: unknown, withAddress: boolean): Tagged[] {
  if (!Array.isArray(list)) return [];
  const out: Tagged[] = [];
  for (const d of list) {
    if (d === null || typeof d !== 'object') continue;
    const r = d as Record<string, unknown>;
    if (typeof r.name !== 'string' || typeof r.tag !== 'string' || r.tag === '') continue;
    out.push({
      name: r.name,
      tag: r.tag,
      ...(withAddress && typeof r.pciAddress === 'string' && r.pciAddress !== '' ? { pciAddress: r.pciAddress } : {}),
      ...(withAddress && typeof r.macAddress === 'string' && r.macAddress !== '' ? { macAddress: r.macAddress } : {}),
    });
  }
  return out;
}

// formatPCIAddressStr: the libvirt attributes without their "0x".
function formatPci(a: PciAddress): string {
  const strip = (s: string) => (s.startsWith('0x') ? s.slice(2) : s);
  return `${strip(a.domain)}:${strip(a.bus)}:${strip(a.slot)}.${strip(a.function)}`;
}

// libvirt prints hex in lowercase, so KubeVirt's addresses are lowercase.
const PCI_RE = /^[0-9a-fA-F]{4}:[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7]$/;

const UA = 'ua-';
const SRIOV = 'sriov-';
const HOSTDEV = 'hostdevice-';
const GPU = 'gpu-';

// getDeviceNUMACPUAffinity. KubeVirt's DeviceData has `omitempty` on both,
// so node 0 and an empty CPU list are not written.
function numaAffinity(
  vmi: VmiObject,
  d: DomainDevice,
  vcpuPins: VcpuPin[],
): Pick<DeviceData, 'numaNode' | 'alignedCPUs'> {
  if (!d.hostAddress || !d.hostNuma) return {};
  const cpu = vmi.spec?.domain?.cpu as
    { numa?: { guestMappingPassthrough?: unknown }; dedicatedCpuPlacement?: unknown } | undefined;
  if (cpu?.numa?.guestMappingPassthrough !== undefined && cpu.numa.guestMappingPassthrough !== null) {
    return d.hostNuma.node > 0 ? { numaNode: d.hostNuma.node } : {};
  }
  if (cpu?.dedicatedCpuPlacement === true && d.hostNuma.cpus) {
    // LookupDeviceVCPUAffinity: a vCPU counts when its cpuset is exactly one of the node's CPUs.
    const byCpuset = new Map(vcpuPins.map((p) => [p.cpuset, p.vcpu]));
    const aligned = d.hostNuma.cpus.flatMap((c) => (byCpuset.has(String(c)) ? [byCpuset.get(String(c))!] : []));
    return aligned.length > 0 ? { alignedCPUs: aligned } : {};
  }
  return {};
}

function devicesFromDomain(vmi: VmiObject, domain: DomainDevice[], vcpuPins: VcpuPin[]): DeviceData[] {
  const devices = vmi.spec?.domain?.devices as Record<string, unknown> | undefined;
  const ifaces = new Map(tagged(devices?.interfaces, false).map((t) => [t.name, t]));
  const hostDevs = new Map(tagged(devices?.hostDevices, false).map((t) => [t.name, t]));
  const gpus = new Map(tagged(devices?.gpus, false).map((t) => [t.name, t]));
  const out: DeviceData[] = [];
  const add = (type: DeviceData['type'], d: DomainDevice, tag: string, mac?: string) => {
    if (!d.address) return;
    out.push({
      type,
      bus: d.address.type,
      address: formatPci(d.address),
      ...(mac ? { mac } : {}),
      ...(d.kind === 'hostdev' ? numaAffinity(vmi, d, vcpuPins) : {}),
      tags: [tag],
    });
  };
  // Interfaces first, then host devices, each in domain order, as KubeVirt.
  for (const d of domain) {
    if (d.kind !== 'interface' || !d.alias?.startsWith(UA)) continue;
    const t = ifaces.get(d.alias.slice(UA.length));
    if (t) add('nic', d, t.tag, d.mac);
  }
  for (const d of domain) {
    if (d.kind !== 'hostdev' || !d.alias?.startsWith(UA)) continue;
    const name = d.alias.slice(UA.length);
    const sriov = name.startsWith(SRIOV) ? ifaces.get(name.slice(SRIOV.length)) : undefined;
    if (sriov) add('nic', d, sriov.tag);
    const hd = name.startsWith(HOSTDEV) ? hostDevs.get(name.slice(HOSTDEV.length)) : undefined;
    if (hd) add('hostdev', d, hd.tag);
    // KubeVirt looks GPU aliases up among host devices (a slip in
    // buildDevicesMetadata), so a tagged GPU is missing from its list; vmseed
    // lists it, as the API documents for `tag`.
    const gpu = name.startsWith(GPU) ? gpus.get(name.slice(GPU.length)) : undefined;
    if (gpu) add('hostdev', d, gpu.tag);
  }
  return out;
}

// The spec's tagged devices whose guest address only the domain knows (an
// interface without a valid pciAddress, every tagged host device and GPU),
// as field paths, and the listing of the pinned ones.
function fromSpec(vmi: VmiObject): { devices: DeviceData[]; missing: string[] } {
  const devices = vmi.spec?.domain?.devices as Record<string, unknown> | undefined;
  const out: DeviceData[] = [];
  const missing: string[] = [];
  const ifaces = Array.isArray(devices?.interfaces) ? devices.interfaces : [];
  ifaces.forEach((raw, i) => {
    const t = tagged([raw], true)[0];
    if (!t) return;
    if (t.pciAddress && PCI_RE.test(t.pciAddress)) {
      out.push({
        type: 'nic',
        bus: 'pci',
        address: t.pciAddress.toLowerCase(),
        ...(t.macAddress ? { mac: t.macAddress } : {}),
        tags: [t.tag],
      });
    } else {
      missing.push(`spec.domain.devices.interfaces[${i}]`);
    }
  });
  for (const [key, list] of [
    ['hostDevices', devices?.hostDevices],
    ['gpus', devices?.gpus],
  ] as const) {
    if (!Array.isArray(list)) continue;
    list.forEach((raw, i) => {
      if (tagged([raw], false).length > 0) missing.push(`spec.domain.devices.${key}[${i}]`);
    });
  }
  return { devices: out, missing };
}

/**
 * Field paths of the tagged devices whose address needs the domain's XML; empty when the spec
 * alone gives KubeVirt's `devices` list (the agent then never reads the domain before rendering).
 */
export function devicesNeedingDomain(vmi: VmiObject): string[] {
  return fromSpec(vmi).missing;
}

export function buildDevicesMetadata(
  vmi: VmiObject,
  domain?: DomainDevice[],
  vcpuPins: VcpuPin[] = [],
): { devices: DeviceData[]; warnings: SeedWarning[] } {
  if (domain) return { devices: devicesFromDomain(vmi, domain, vcpuPins), warnings: [] };
  const { devices: out, missing } = fromSpec(vmi);
  const warnings: SeedWarning[] =
    missing.length === 0
      ? []
      : [
          {
            code: 'DEVICE_METADATA_INCOMPLETE',
            field: missing[0],
            message:
              `${missing.join(', ')} set a tag, but the guest address is not in the spec (an interface without pciAddress, ` +
              'a host device or a GPU); KubeVirt reads it from the running domain. meta_data.json "devices" lists only the tagged ' +
              'interfaces with pciAddress; pin pciAddress on the interface to have it listed',
          },
        ];
  return { devices: out, warnings };
}
