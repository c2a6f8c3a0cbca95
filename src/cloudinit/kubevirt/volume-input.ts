// A VMI's own cloudInitNoCloud / cloudInitConfigDrive volume read as
// virt-launcher reads it: KubeVirt's admission rules, its Secret keys, its
// "required" rule, and accessCredentials for the SSH keys. Written as KubeVirt
// writes it, so the composition is lenient where KubeVirt is (strict: false).
import type { SeedInput } from '../compose-seed.ts';
import type { CloudInitSource, RefResolver, VmiObject, Datasource } from '../../api/objects.ts';
import { resolvePublicKeys } from './access-credentials.ts';
import { admitAccessCredentials, admitCloudInitVolumes, admitHostname, volumeDatasources } from './volume-rules.ts';
import { requireSomeData } from './empty-data.ts';
import { hasAnyData, resolveSourceData, sourceMissing } from './sources.ts';

/** A VMI's cloud-init volume: its index in spec.volumes (for field paths), name and datasource. */
export interface CloudInitVolume {
  index: number;
  name: string;
  datasource: Datasource;
  source: CloudInitSource;
}

/** The VMI's cloud-init volume, or undefined: KubeVirt scans volumes in order and uses the first one. */
export function firstCloudInitVolume(vmi: VmiObject): CloudInitVolume | undefined {
  const volumes = vmi.spec?.volumes ?? [];
  for (let i = 0; i < volumes.length; i++) {
    const v = volumes[i];
    if (v.cloudInitNoCloud) return { index: i, name: v.name, datasource: 'nocloud', source: v.cloudInitNoCloud };
    if (v.cloudInitConfigDrive)
      return { index: i, name: v.name, datasource: 'configdrive', source: v.cloudInitConfigDrive };
  }
  return undefined;
}

/**
 * Reads a cloud-init volume into a SeedInput as virt-launcher would (header). Throws VmseedError:
 * what KubeVirt's webhook rejects, CLOUDINIT_DATA_EMPTY, CLOUDINIT_SOURCE_MISSING (terminal), or a
 * missing Secret or key (retryable).
 */
export async function readVolumeInput(vmi: VmiObject, volume: CloudInitVolume, refs: RefResolver): Promise<SeedInput> {
  const kind = volume.datasource === 'nocloud' ? 'cloudInitNoCloud' : 'cloudInitConfigDrive';
  const fieldPrefix = `spec.volumes[${volume.index}].${kind}`;
  // What KubeVirt's webhook would say about the VMI (only warnings get here;
  // a rejection throws).
  const warnings = admitCloudInitVolumes(vmi);
  admitAccessCredentials(vmi, volumeDatasources(vmi));
  admitHostname(vmi);

  const namespace = vmi.metadata.namespace ?? 'default';
  const data = await resolveSourceData(volume.source, fieldPrefix, 'secretRef', 'kubevirt', namespace, refs);
  await requireSomeData(data, volume.source, fieldPrefix, namespace, refs);
  const publicKeys = await resolvePublicKeys(vmi, volume.datasource, refs);
  // KubeVirt requires at least one data field on a volume.
  if (!hasAnyData(volume.source)) throw sourceMissing(fieldPrefix, '');
  return { datasource: volume.datasource, namespace, data, publicKeys, warnings, strict: false };
}
