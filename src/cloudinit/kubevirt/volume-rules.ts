// KubeVirt's admission rules for cloud-init, applied where vmseed is the only
// reader of the VMI (local mode, plain libvirt, `vmseed build --vmi`): a VMI
// that KubeVirt's webhook would reject must not get a seed that silently picks
// one of two sources or drops keys.
//
// Source: pkg/virt-api/webhooks/validating-webhook/admitters/
// vmi-create-admitter.go, validateVolumes ("Verify exactly one source is set",
// "Verify cloud init data is within size limits"),
// validateAccessCredentials and validateHostNameNotConformingToDNSLabelRules
// (spec.hostname becomes the seed's local-hostname). Messages start with the webhook's own wording
// (field path, then its sentence) so a search finds KubeVirt's docs and
// issues; vmseed adds what to do.
//
// One deliberate difference: the webhook's 2048-byte limit on inline data
// (cloudInitUserMaxLen / cloudInitNetworkMaxLen) exists to keep the VMI object
// small for the API server and its watchers, not because the seed needs it. A
// seed on disk has no such limit, so vmseed warns (KUBEVIRT_INLINE_LIMIT)
// instead of refusing.
import { VmseedError, type ErrorCode } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { AccessCredential, CloudInitSource, VmiObject, VmiVolume } from '../../api/objects.ts';
import type { SeedWarning } from '../seed.ts';

export const CLOUD_INIT_INLINE_MAX = 2048;

const VOLUME_SOURCES = [
  'persistentVolumeClaim',
  'sysprep',
  'cloudInitNoCloud',
  'cloudInitConfigDrive',
  'containerDisk',
  'ephemeral',
  'emptyDisk',
  'hostDisk',
  'dataVolume',
  'configMap',
  'secret',
  'downwardAPI',
  'serviceAccount',
  'downwardMetrics',
  'memoryDump',
  'containerPath',
] as const;

function reject(code: ErrorCode, field: string, webhook: string, hint: string): VmseedError {
  return new VmseedError(code, `${webhook} (KubeVirt's webhook rejects this VMI); ${hint}`, {
    kind: 'terminal',
    field,
  });
}

const set = (v: unknown): boolean => v !== undefined && v !== null;
const nonEmpty = (s: string | undefined): s is string => typeof s === 'string' && s !== '';

function byteLength(s: string): number {
  return Buffer.byteLength(s, 'utf8');
}

// The fields of one data kind (user-data or network data) of a volume.
interface DataFields {
  secretRef: 'secretRef' | 'networkDataSecretRef';
  base64: 'userDataBase64' | 'networkDataBase64';
  inline: 'userData' | 'networkData';
  invalidBase64: ErrorCode;
}

const USER_DATA: DataFields = {
  secretRef: 'secretRef',
  base64: 'userDataBase64',
  inline: 'userData',
  invalidBase64: 'USERDATA_BASE64_INVALID',
};
const NETWORK_DATA: DataFields = {
  secretRef: 'networkDataSecretRef',
  base64: 'networkDataBase64',
  inline: 'networkData',
  invalidBase64: 'NETWORKDATA_BASE64_INVALID',
};

// How many sources of one data kind are set, and the decoded size of the
// inline one (the last set, as the webhook measures it).
function countSources(
  src: CloudInitSource,
  f: DataFields,
  base: string,
  kind: 'cloudInitNoCloud' | 'cloudInitConfigDrive',
): { count: number; length: number } {
  let count = 0;
  let length = 0;
  if (nonEmpty(src[f.secretRef]?.name)) count++;
  const encoded = src[f.base64];
  if (nonEmpty(encoded)) {
    count++;
    const d = decodeBase64Strict(encoded);
    if (!d.ok) {
      throw reject(
        f.invalidBase64,
        `${base}.${f.base64}`,
        `${base}.${f.base64}.${kind}.${f.base64} is not a valid base64 value.`,
        `${d.reason}; encode with "base64 -w0" or use ${f.inline}`,
      );
    }
    length = d.bytes.length;
  }
  const inline = src[f.inline];
  if (nonEmpty(inline)) {
    count++;
    length = byteLength(inline);
  }
  return { count, length };
}

function checkCloudInitVolume(
  volume: VmiVolume,
  path: string,
  kind: 'cloudInitNoCloud' | 'cloudInitConfigDrive',
  warnings: SeedWarning[],
): void {
  const src = volume[kind] ?? {};
  const base = `${path}.${kind}`;
  const user = countSources(src, USER_DATA, base, kind);
  if (user.count > 1) {
    throw reject(
      'USERDATA_SOURCE_CONFLICT',
      base,
      `${base} must have only one userdatasource set.`,
      'keep one of userData, userDataBase64, secretRef',
    );
  }
  const net = countSources(src, NETWORK_DATA, base, kind);
  if (net.count > 1) {
    throw reject(
      'NETWORKDATA_SOURCE_CONFLICT',
      base,
      `${base} must have only one networkdata source set.`,
      'keep one of networkData, networkDataBase64, networkDataSecretRef',
    );
  }
  if (user.count === 0 && net.count === 0) {
    throw reject(
      'CLOUDINIT_SOURCE_MISSING',
      base,
      `${base} must have at least one userdatasource or one networkdatasource set.`,
      'add userData, userDataBase64, secretRef, networkData, networkDataBase64 or networkDataSecretRef',
    );
  }
  if (user.length > CLOUD_INIT_INLINE_MAX) {
    warnings.push(inlineLimitWarning(base, 'userdata', 'UserDataSecretRef', 'secretRef', user.length));
  }
  if (net.length > CLOUD_INIT_INLINE_MAX) {
    warnings.push(inlineLimitWarning(base, 'networkdata', 'NetworkDataSecretRef', 'networkDataSecretRef', net.length));
  }
}

function inlineLimitWarning(base: string, what: string, goRef: string, ref: string, length: number): SeedWarning {
  return {
    code: 'KUBEVIRT_INLINE_LIMIT',
    field: base,
    message:
      `${base} ${what} exceeds ${CLOUD_INIT_INLINE_MAX} byte limit. Should use ${goRef} for larger data. ` +
      `vmseed writes it (${length} bytes), but KubeVirt's webhook would reject this VMI; move it to a Secret (${ref}) to run it under KubeVirt`,
  };
}

// validateVolumes' cloud-init part, for every volume (the webhook checks all
// of them, not only the first cloud-init one). Returns the warnings.
export function admitCloudInitVolumes(vmi: VmiObject): SeedWarning[] {
  const warnings: SeedWarning[] = [];
  const volumes = vmi.spec?.volumes ?? [];
  volumes.forEach((volume, i) => {
    const path = `spec.volumes[${i}]`;
    const hasCloudInit = set(volume.cloudInitNoCloud) || set(volume.cloudInitConfigDrive);
    if (!hasCloudInit) return;
    const sources = VOLUME_SOURCES.filter((k) => set(volume[k]));
    if (sources.length !== 1) {
      throw reject(
        'VOLUME_SOURCE_CONFLICT',
        path,
        `${path} must have exactly one source type set`,
        `it sets ${sources.join(' and ')}; split them into separate volumes`,
      );
    }
    checkCloudInitVolume(
      volume,
      path,
      set(volume.cloudInitNoCloud) ? 'cloudInitNoCloud' : 'cloudInitConfigDrive',
      warnings,
    );
  });
  return warnings;
}

/**
 * KubeVirt's validateAccessCredentials: throws terminal ACCESS_CREDENTIAL_INVALID where its webhook
 * rejects the VMI. `has` says which datasources the VMI has: its volumes, plus the vmseed
 * annotation's datasource when it carries the seed.
 */
export function admitAccessCredentials(vmi: VmiObject, has: Datasources): void {
  const creds = vmi.spec?.accessCredentials ?? [];
  creds.forEach((cred, i) => {
    const path = `spec.accessCredentials[${i}]`;
    let count = 0;
    const ssh = cred?.sshPublicKey;
    if (set(ssh)) {
      count++;
      checkSshPublicKey(ssh!, path, has);
    }
    const pw = cred?.userPassword as
      { source?: { secret?: unknown }; propagationMethod?: { qemuGuestAgent?: unknown } } | undefined;
    if (set(pw)) {
      count++;
      checkUserPassword(pw!, path);
    }
    if (count !== 1) {
      throw reject(
        'ACCESS_CREDENTIAL_INVALID',
        path,
        `${path} must have exactly one access credential type set`,
        'set either sshPublicKey or userPassword',
      );
    }
  });
}

type Datasources = { nocloud: boolean; configdrive: boolean };

function checkSshPublicKey(ssh: NonNullable<AccessCredential['sshPublicKey']>, path: string, has: Datasources): void {
  const methods = propagationMethods(ssh.propagationMethod ?? {}, path, has);
  if (!set(ssh.source?.secret)) {
    throw reject(
      'ACCESS_CREDENTIAL_INVALID',
      `${path}.sshPublicKey.source`,
      `${path} must have exactly one source set`,
      'set source.secret.secretName',
    );
  }
  if (methods !== 1) {
    throw reject(
      'ACCESS_CREDENTIAL_INVALID',
      `${path}.sshPublicKey.propagationMethod`,
      `${path} must have exactly one propagationMethod set`,
      'set one of noCloud, configDrive, qemuGuestAgent',
    );
  }
}

// How many propagation methods an SSH key credential sets; one the VMI has
// no datasource for is refused.
function propagationMethods(method: Record<string, unknown>, path: string, has: Datasources): number {
  let methods = 0;
  for (const [key, volume, other] of [
    ['noCloud', 'nocloud', 'configDrive'],
    ['configDrive', 'configdrive', 'noCloud'],
  ] as const) {
    if (!set(method[key])) continue;
    methods++;
    if (!has[volume]) {
      const kind = key === 'noCloud' ? 'cloudInitNoCloud' : 'cloudInitConfigDrive';
      throw reject(
        'ACCESS_CREDENTIAL_INVALID',
        `${path}.sshPublicKey.propagationMethod`,
        `${path} requires a ${key} volume to exist when the ${key} propagationMethod is in use.`,
        `add a ${kind} volume or use propagationMethod ${other} to match the seed; otherwise the keys would not reach the guest`,
      );
    }
  }
  if (set(method.qemuGuestAgent)) {
    const users = (method.qemuGuestAgent as { users?: unknown[] }).users;
    if (!Array.isArray(users) || users.length === 0) {
      throw reject(
        'ACCESS_CREDENTIAL_INVALID',
        `${path}.sshPublicKey.propagationMethod.qemuGuestAgent.users`,
        `${path} requires at least one user to be present in the users list`,
        'name the guest users whose keys the agent manages',
      );
    }
    methods++;
  }
  return methods;
}

function checkUserPassword(
  pw: { source?: { secret?: unknown }; propagationMethod?: { qemuGuestAgent?: unknown } },
  path: string,
): void {
  if (!set(pw.source?.secret)) {
    throw reject(
      'ACCESS_CREDENTIAL_INVALID',
      `${path}.userPassword.source`,
      `${path} must have exactly one source set`,
      'set source.secret.secretName',
    );
  }
  if (!set(pw.propagationMethod?.qemuGuestAgent)) {
    throw reject(
      'ACCESS_CREDENTIAL_INVALID',
      `${path}.userPassword.propagationMethod`,
      `${path} must have exactly one propagationMethod set`,
      'set propagationMethod.qemuGuestAgent',
    );
  }
}

export function volumeDatasources(vmi: VmiObject): Datasources {
  const volumes = vmi.spec?.volumes ?? [];
  return {
    nocloud: volumes.some((v) => set(v.cloudInitNoCloud)),
    configdrive: volumes.some((v) => set(v.cloudInitConfigDrive)),
  };
}

// k8s.io/apimachinery/pkg/util/validation IsDNS1123Label, as the webhook
// calls it for a non-empty spec.hostname. Go's len() counts bytes.
const DNS1123_LABEL_FMT = '[a-z0-9]([-a-z0-9]*[a-z0-9])?';
const DNS1123_LABEL_RE = new RegExp(`^${DNS1123_LABEL_FMT}$`);
const DNS1123_SUBDOMAIN_RE = new RegExp(`^${DNS1123_LABEL_FMT}(\\.${DNS1123_LABEL_FMT})*$`);
const DNS1123_LABEL_MAX = 63;

function dns1123LabelErrors(value: string): string[] {
  const errs: string[] = [];
  if (byteLength(value) > DNS1123_LABEL_MAX) errs.push(`must be no more than ${DNS1123_LABEL_MAX} characters`);
  if (!DNS1123_LABEL_RE.test(value)) {
    errs.push(
      DNS1123_SUBDOMAIN_RE.test(value)
        ? 'must not contain dots'
        : "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an " +
            `alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '${DNS1123_LABEL_FMT}')`,
    );
  }
  return errs;
}

/**
 * KubeVirt's validateHostNameNotConformingToDNSLabelRules: throws terminal HOSTNAME_INVALID for a
 * spec.hostname that cloud-init and DNS would not accept as one label.
 */
export function admitHostname(vmi: VmiObject): void {
  const h = vmi.spec?.hostname;
  if (typeof h !== 'string' || h === '') return;
  const errs = dns1123LabelErrors(h);
  if (errs.length === 0) return;
  throw reject(
    'HOSTNAME_INVALID',
    'spec.hostname',
    `spec.hostname does not conform to the kubernetes DNS_LABEL rules : ${errs.join(', ')}`,
    'use at most 63 lower-case letters, digits and "-", starting and ending with a letter or digit (a domain goes in spec.subdomain)',
  );
}
