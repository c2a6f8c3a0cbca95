// instance-id must be stable for the life of a VM: a new id makes cloud-init
// treat the next boot as a first boot (per-instance modules re-run, SSH host
// keys regenerated; KubeVirt #6305). So it is derived, never random.
import { createHash } from 'node:crypto';
import type { VmiObject } from '../../api/objects.ts';

/** KubeVirt's namespace for stable firmware UUIDs (pkg/virt-controller/watch/vm firmware `magicUUID`). */
export const KUBEVIRT_FIRMWARE_UUID_NAMESPACE = '6a1a24a1-4061-4607-8bf4-a3963d0c5895';

/** RFC 4122 §4.3 name-based UUID, SHA-1 (version 5). Throws TypeError when `namespace` is no UUID. */
export function uuidV5(namespace: string, name: string): string {
  const ns = Buffer.from(namespace.replace(/-/g, ''), 'hex');
  if (ns.length !== 16) throw new TypeError('namespace must be a UUID');
  const hash = createHash('sha1').update(ns).update(Buffer.from(name, 'utf8')).digest();
  const b = hash.subarray(0, 16);
  b[6] = (b[6] & 0x0f) | 0x50;
  b[8] = (b[8] & 0x3f) | 0x80;
  const h = b.toString('hex');
  return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20)}`;
}

/**
 * What virt-controller sets as firmware.uuid for a VM-owned VMI (from the name only), for when a
 * VirtualMachine manifest is turned into a VMI locally.
 */
export function kubevirtFirmwareUuid(vmName: string): string {
  return uuidV5(KUBEVIRT_FIRMWARE_UUID_NAMESPACE, vmName);
}

/**
 * The VMI's instance-id: firmware.uuid when set (cloud-init's ConfigDrive compares it with the
 * SMBIOS UUID), else UUIDv5 over "<namespace>/<name>". KubeVirt hashes the name only, but a bare
 * VMI has no VM to pin it and names repeat across namespaces.
 */
export function instanceId(vmi: VmiObject): string {
  const fw = vmi.spec?.domain?.firmware?.uuid;
  // Verbatim, as KubeVirt writes it: a seed built by KubeVirt before keeps its id.
  if (typeof fw === 'string' && fw.trim() !== '') return fw.trim();
  const ns = vmi.metadata.namespace ?? 'default';
  return uuidV5(KUBEVIRT_FIRMWARE_UUID_NAMESPACE, `${ns}/${vmi.metadata.name}`);
}
