// VMI + referenced objects → Seed. Pure: references come through RefResolver.
import { VmseedError } from '../errors.ts';
import { resolvePublicKeys } from './access-credentials.ts';
import { ANNOTATION, parseAnnotation } from './annotation.ts';
import type { CloudInitSource, RefResolver, VmiObject } from './kube-types.ts';
import { buildMetaData } from './metadata.ts';
import { lintNetworkData } from './network-lint.ts';
import type { Datasource, Seed, SeedWarning } from './seed.ts';
import { hasAnyData, resolveSourceData, type SourcePolicy } from './sources.ts';
import { lintUserData } from './userdata-lint.ts';

export { ANNOTATION } from './annotation.ts';

export interface RenderOptions {
  // 'own': vmseed builds the seed for cloudInitNoCloud/cloudInitConfigDrive
  // volumes (local mode, plain libvirt). 'ignore': virt-launcher builds them.
  kubevirtVolumes: 'own' | 'ignore';
  // Limits on decoded data from any source. KubeVirt's 2048-byte limit is for
  // inline data in the object only (and pushes users to Secrets); a seed on
  // disk has no such constraint.
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
}

export const DEFAULT_RENDER_OPTIONS: RenderOptions = Object.freeze({
  kubevirtVolumes: 'own',
  maxUserDataBytes: 1024 * 1024,
  maxNetworkDataBytes: 64 * 1024,
});

export type RenderOutcome = { kind: 'seed'; seed: Seed } | { kind: 'skip'; reason: string; warning?: SeedWarning };

interface CloudInitVolume {
  index: number;
  name: string;
  datasource: Datasource;
  source: CloudInitSource;
}

// KubeVirt scans volumes in order and uses the first cloud-init one.
export function firstCloudInitVolume(vmi: VmiObject): CloudInitVolume | undefined {
  const volumes = vmi.spec?.volumes ?? [];
  for (let i = 0; i < volumes.length; i++) {
    const v = volumes[i];
    if (v.cloudInitNoCloud) return { index: i, name: v.name, datasource: 'nocloud', source: v.cloudInitNoCloud };
    if (v.cloudInitConfigDrive) return { index: i, name: v.name, datasource: 'configdrive', source: v.cloudInitConfigDrive };
  }
  return undefined;
}

function tooLarge(code: 'USERDATA_TOO_LARGE' | 'NETWORKDATA_TOO_LARGE', field: string, size: number, max: number): VmseedError {
  const what = code === 'USERDATA_TOO_LARGE' ? 'user-data' : 'network data';
  return new VmseedError(
    code,
    `${what} from ${field} is ${size} bytes, over the limit of ${max} bytes; shrink it (gzip is accepted for user-data) ` +
      'or raise the limit in the agent configuration',
    { kind: 'terminal', field },
  );
}

export async function renderSeed(vmi: VmiObject, refs: RefResolver, options: RenderOptions): Promise<RenderOutcome> {
  const annotationText = vmi.metadata.annotations?.[ANNOTATION];
  const hasAnnotation = annotationText !== undefined;
  const volume = firstCloudInitVolume(vmi);

  if (!hasAnnotation && !volume) {
    return { kind: 'skip', reason: `no ${ANNOTATION} annotation and no cloud-init volume` };
  }
  if (hasAnnotation && volume) {
    const field = `spec.volumes[${volume.index}]`;
    const message =
      `VMI has both the ${ANNOTATION} annotation and the cloud-init volume "${volume.name}"; two seed disks make ` +
      'cloud-init pick one at random. Remove the annotation or the volume';
    if (options.kubevirtVolumes === 'ignore') {
      return {
        kind: 'skip',
        reason: 'annotation and KubeVirt cloud-init volume both present; KubeVirt builds the volume',
        warning: { code: 'KUBEVIRT_VOLUME_CONFLICT', message, field },
      };
    }
    throw new VmseedError('KUBEVIRT_VOLUME_CONFLICT', message, { kind: 'terminal', field });
  }
  if (!hasAnnotation && options.kubevirtVolumes === 'ignore') {
    return { kind: 'skip', reason: `cloud-init volume "${volume!.name}" is built by KubeVirt (kubevirt-volumes=ignore)` };
  }

  let datasource: Datasource;
  let source: CloudInitSource;
  let fieldPrefix: string;
  let secretRefField: string;
  let policy: SourcePolicy;
  if (hasAnnotation) {
    const spec = parseAnnotation(annotationText);
    datasource = spec.datasource;
    source = spec.source;
    fieldPrefix = ANNOTATION;
    secretRefField = spec.secretRefField;
    policy = 'single';
  } else {
    const v = volume!;
    datasource = v.datasource;
    source = v.source;
    fieldPrefix = `spec.volumes[${v.index}].${v.datasource === 'nocloud' ? 'cloudInitNoCloud' : 'cloudInitConfigDrive'}`;
    secretRefField = 'secretRef';
    policy = 'kubevirt';
  }

  const namespace = vmi.metadata.namespace ?? 'default';
  const data = await resolveSourceData(source, fieldPrefix, secretRefField, policy, namespace, refs);
  const publicKeys = await resolvePublicKeys(vmi, datasource, refs);

  // KubeVirt requires at least one data field on a volume; through the
  // annotation, SSH keys alone are a useful seed too.
  if (!hasAnyData(source) && (!hasAnnotation || Object.keys(publicKeys).length === 0)) {
    throw new VmseedError(
      'CLOUDINIT_SOURCE_MISSING',
      `${fieldPrefix} sets none of userData, userDataBase64, secretRef, networkData, networkDataBase64, networkDataSecretRef; ` +
        'add user-data or network data',
      { kind: 'terminal', field: fieldPrefix },
    );
  }

  const userData = data.userData ?? new Uint8Array();
  if (userData.length > options.maxUserDataBytes) {
    throw tooLarge('USERDATA_TOO_LARGE', data.userDataField, userData.length, options.maxUserDataBytes);
  }
  const networkData = data.networkData && data.networkData.length > 0 ? data.networkData : undefined;
  if (networkData && networkData.length > options.maxNetworkDataBytes) {
    throw tooLarge('NETWORKDATA_TOO_LARGE', data.networkDataField, networkData.length, options.maxNetworkDataBytes);
  }
  if (networkData) lintNetworkData(networkData, datasource, data.networkDataField);
  const warnings = lintUserData(userData, data.userDataField);

  const seed: Seed = {
    datasource,
    metaData: buildMetaData(vmi, datasource, publicKeys),
    userData,
    ...(networkData ? { networkConfig: networkData } : {}),
    warnings,
  };
  return { kind: 'seed', seed };
}
