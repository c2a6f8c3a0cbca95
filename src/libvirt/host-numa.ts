// The host NUMA facts KubeVirt's launcher puts into ConfigDrive `devices` for
// host devices (pkg/util/hardware/hw_utils.go GetDeviceNumaNode,
// GetNumaNodeCPUList): the device's /sys/bus/pci/devices/<addr>/numa_node and
// that node's /sys/bus/node/devices/node<N>/cpulist. A container sees the
// host's sysfs read-only by default, so a node agent reads the same files.
// The paths go through the kernel's own sysfs links (nothing a user can
// plant); the address is checked before it becomes a path.
import { open } from 'node:fs/promises';
import { join } from 'node:path';
import type { DomainDevice } from '../cloudinit/devices-metadata.ts';

/** The host's NUMA facts for PCI devices; undefined for anything unknown or unreadable. */
export interface HostNumaReader {
  // undefined: no such device, unreadable, or no NUMA affinity (-1).
  deviceNumaNode(pciAddress: string): Promise<number | undefined>;
  nodeCpus(node: number): Promise<number[] | undefined>;
}

const PCI_ADDR = /^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$/;
// sysfs attributes are one page; a cpulist of 4096 CPUs in the worst layout
// ("0,2,4,…") stays under 32 KiB.
const MAX_FILE_BYTES = 32 * 1024;
const MAX_CPUS = 8192;

async function readSmall(path: string): Promise<string | undefined> {
  let fh;
  try {
    fh = await open(path, 'r');
    const buf = Buffer.alloc(MAX_FILE_BYTES);
    const { bytesRead } = await fh.read(buf, 0, buf.length, 0);
    return bytesRead === buf.length ? undefined : buf.subarray(0, bytesRead).toString('latin1').trim();
  } catch {
    return undefined;
  } finally {
    await fh?.close();
  }
}

// The kernel's cpulist format ("0-3,8,10-11"); undefined when malformed.
export function parseCpuList(text: string): number[] | undefined {
  if (text === '') return [];
  const out: number[] = [];
  for (const part of text.split(',')) {
    const m = /^(\d+)(?:-(\d+))?$/.exec(part);
    if (!m) return undefined;
    const lo = Number(m[1]);
    const hi = m[2] === undefined ? lo : Number(m[2]);
    if (hi < lo || out.length + (hi - lo + 1) > MAX_CPUS) return undefined;
    for (let c = lo; c <= hi; c++) out.push(c);
  }
  return out;
}

/** The HostNumaReader over sysfs at `sysRoot` (`/sys`, or a fake tree in tests). */
export function sysfsNumaReader(sysRoot = '/sys'): HostNumaReader {
  return {
    async deviceNumaNode(pciAddress) {
      const addr = pciAddress.toLowerCase();
      if (!PCI_ADDR.test(addr)) return undefined;
      const text = await readSmall(join(sysRoot, 'bus/pci/devices', addr, 'numa_node'));
      if (text === undefined || !/^-?\d+$/.test(text)) return undefined;
      const n = Number(text);
      return n >= 0 && n < 1024 ? n : undefined;
    },
    async nodeCpus(node) {
      if (!Number.isInteger(node) || node < 0 || node >= 1024) return undefined;
      const text = await readSmall(join(sysRoot, 'bus/node/devices', `node${node}`, 'cpulist'));
      return text === undefined ? undefined : parseCpuList(text);
    },
  };
}

/**
 * Host devices with a host address get their NUMA node and its CPUs; the
 * rest are returned as they are. Unknown facts stay unset (KubeVirt then
 * writes neither key).
 */
export async function withHostNuma(devices: DomainDevice[], reader: HostNumaReader): Promise<DomainDevice[]> {
  const out: DomainDevice[] = [];
  for (const d of devices) {
    if (d.kind !== 'hostdev' || !d.hostAddress) {
      out.push(d);
      continue;
    }
    const node = await reader.deviceNumaNode(d.hostAddress);
    if (node === undefined) {
      out.push(d);
      continue;
    }
    const cpus = await reader.nodeCpus(node);
    out.push({ ...d, hostNuma: { node, ...(cpus ? { cpus } : {}) } });
  }
  return out;
}
