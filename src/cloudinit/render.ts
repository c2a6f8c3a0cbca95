// VMI + referenced objects → Seed. Pure: references come through RefResolver.
import { VmseedError } from '../errors.ts';
import { resolvePublicKeys } from './access-credentials.ts';
import { ANNOTATION } from './annotation.ts';
import type { CloudInitSource, RefResolver, VmiObject } from './kube-types.ts';
import { buildMetaData } from './metadata.ts';
import type { Datasource, Seed, SeedWarning } from './seed.ts';
import { hasAnyData, resolveSourceData, type SourcePolicy } from './sources.ts';
import type { AnnotationExtras } from './annotation-extras.ts';
import { filesToWriteFiles } from './files.ts';
import { compileInit, type CompiledInit } from './init/compile.ts';
import { parseInit } from './init/parse.ts';
import { instanceId } from './instance-id.ts';
import { readObject } from './object-refs.ts';
import { deriveSalt, type SaltProvider } from './password-salt.ts';
import { appendSshKeys } from './ssh-keys.ts';
import { resolveVendorData, vendorDataFile, type VendorDataRef } from './vendor-data.ts';
import { virtletMerge } from './virtlet-merge.ts';
import { buildDevicesMetadata, type DeviceData, type DomainDevice, type VcpuPin } from './devices-metadata.ts';
import {
  admitAccessCredentials,
  admitCloudInitVolumes,
  admitHostname,
  volumeDatasources,
} from './kubevirt-admission.ts';
import { isPassableNetworkError, passThroughWarning } from './network-passthrough.ts';
import { requireSomeData } from './empty-data.ts';
import { DEFAULT_MAX_USER_DATA_BYTES, SeedBudget, yieldToLoop } from './limits.ts';
import { memoize } from './memo-resolver.ts';
import { INLINE_OFFLOAD, type Offload } from './pure-ops.ts';
import { mergeMetaData } from './metadata-merge.ts';
import { measureExpanded } from './yaml.ts';
import { isImdsEnabled, renderImdsSeed } from './imds-annotations.ts';

export interface RenderOptions {
  // 'own': vmseed builds the seed for cloudInitNoCloud/cloudInitConfigDrive
  // volumes (local mode, plain libvirt). 'ignore': virt-launcher builds them.
  kubevirtVolumes: 'own' | 'ignore';
  // Limits on decoded data from any source. KubeVirt's 2048-byte limit is for
  // inline data in the object only (and pushes users to Secrets); a seed on
  // disk has no such constraint.
  maxUserDataBytes: number;
  maxNetworkDataBytes: number;
  // Operator-wide vendor-data (`--vendor-data-from namespace/name`): a
  // ConfigMap whose key (default "vendor-data") goes to every seed whose VMI
  // sets no vendorData/vendorDataFrom of its own.
  defaultVendorData?: VendorDataRef;
  // Salt for the SHA-512 crypt of init.users[].passwordFrom. Default:
  // deriveSalt (from VMI uid and user name; see password-salt.ts for why).
  passwordSalt?: SaltProvider;
  // Bound on all seed files together (default: see SeedBudget).
  maxSeedBytes?: number;
  // Where the YAML parse/merge/serialise steps run (pure-ops.ts); default:
  // this thread. The agent gives its worker pool (src/agent/render-pool.ts).
  offload?: Offload;
  // Aborted when the agent stops: a step on a worker is ended (CANCELLED).
  signal?: AbortSignal;
}

export const DEFAULT_RENDER_OPTIONS: RenderOptions = Object.freeze({
  kubevirtVolumes: 'own',
  maxUserDataBytes: DEFAULT_MAX_USER_DATA_BYTES,
  maxNetworkDataBytes: 64 * 1024,
});

// Per-VMI facts from outside the objects, when the caller has them.
export interface RenderContext {
  // The running domain's interfaces and host devices (from its XML), for the
  // ConfigDrive `devices` metadata; without it only what the spec pins is listed.
  domainDevices?: DomainDevice[];
  // The domain's <cputune><vcpupin>s, for host devices' `alignedCPUs`.
  vcpuPins?: VcpuPin[];
}

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
    if (v.cloudInitConfigDrive)
      return { index: i, name: v.name, datasource: 'configdrive', source: v.cloudInitConfigDrive };
  }
  return undefined;
}

function tooLarge(
  code: 'USERDATA_TOO_LARGE' | 'NETWORKDATA_TOO_LARGE',
  field: string,
  size: number,
  max: number,
): VmseedError {
  const what = code === 'USERDATA_TOO_LARGE' ? 'user-data' : 'network data';
  return new VmseedError(
    code,
    `${what} from ${field} is ${size} bytes, over the limit of ${max} bytes; shrink it (gzip is accepted for user-data) ` +
      'or raise the limit in the agent configuration',
    { kind: 'terminal', field },
  );
}

export async function renderSeed(
  vmi: VmiObject,
  resolver: RefResolver,
  options: RenderOptions,
  context: RenderContext = {},
): Promise<RenderOutcome> {
  // Budgets and a per-render memo of referenced objects (limits.ts, memo-resolver.ts).
  const refs = memoize(resolver);
  const budget = new SeedBudget(options);
  const offload = options.offload ?? INLINE_OFFLOAD;
  const annotationText = vmi.metadata.annotations?.[ANNOTATION];
  const hasAnnotation = annotationText !== undefined;
  const volume = firstCloudInitVolume(vmi);

  // KubeVirt IMDS's annotations; a volume KubeVirt builds coexists with
  // them as it does with IMDS's sidecar.
  if (!hasAnnotation && isImdsEnabled(vmi) && (!volume || options.kubevirtVolumes === 'ignore')) {
    return { kind: 'seed', seed: await renderImdsSeed(vmi, refs, options) };
  }
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
    return {
      kind: 'skip',
      reason: `cloud-init volume "${volume!.name}" is built by KubeVirt (kubevirt-volumes=ignore)`,
    };
  }

  let datasource: Datasource;
  let source: CloudInitSource;
  let fieldPrefix: string;
  let secretRefField: string;
  let policy: SourcePolicy;
  let extras: AnnotationExtras | undefined;
  // What KubeVirt's webhook would say about the VMI (only warnings get here;
  // a rejection throws).
  const admissionWarnings: SeedWarning[] = [];
  if (hasAnnotation) {
    const spec = await offload.run('parseAnnotation', [annotationText], annotationText.length, options.signal);
    await yieldToLoop();
    extras = spec.extras;
    datasource = spec.datasource;
    source = spec.source;
    fieldPrefix = ANNOTATION;
    secretRefField = spec.secretRefField;
    policy = 'single';
    admitAccessCredentials(vmi, { nocloud: datasource === 'nocloud', configdrive: datasource === 'configdrive' });
  } else {
    const v = volume!;
    datasource = v.datasource;
    source = v.source;
    fieldPrefix = `spec.volumes[${v.index}].${v.datasource === 'nocloud' ? 'cloudInitNoCloud' : 'cloudInitConfigDrive'}`;
    secretRefField = 'secretRef';
    policy = 'kubevirt';
    admissionWarnings.push(...admitCloudInitVolumes(vmi));
    admitAccessCredentials(vmi, volumeDatasources(vmi));
  }
  admitHostname(vmi);

  const namespace = vmi.metadata.namespace ?? 'default';
  const data = await resolveSourceData(source, fieldPrefix, secretRefField, policy, namespace, refs);
  if (!hasAnnotation) await requireSomeData(data, source, fieldPrefix, namespace, refs);
  let publicKeys = await resolvePublicKeys(vmi, datasource, refs);
  if (extras)
    publicKeys = await appendSshKeys(publicKeys, extras.sshKeys, extras.sshKeysFrom, namespace, refs, ANNOTATION);

  // KubeVirt requires at least one data field on a volume; through the
  // annotation, SSH keys alone (or any vmseed field) are a useful seed too.
  if (!hasAnyData(source) && (!hasAnnotation || (Object.keys(publicKeys).length === 0 && !extrasProduceData(extras)))) {
    throw new VmseedError(
      'CLOUDINIT_SOURCE_MISSING',
      `${fieldPrefix} sets none of userData, userDataBase64, secretRef, networkData, networkDataBase64, networkDataSecretRef` +
        (hasAnnotation ? ' nor any vmseed field (init, files, metaData, sshKeys, vendorData…)' : '') +
        '; add user-data or network data',
      { kind: 'terminal', field: fieldPrefix },
    );
  }

  let init: CompiledInit | undefined;
  if (extras?.init) {
    const prefix = `${ANNOTATION}.init`;
    init = await compileInit(parseInit(extras.init, prefix), {
      namespace,
      vmiUid: vmi.metadata.uid || instanceId(vmi),
      refs,
      salt: options.passwordSalt ?? deriveSalt,
      prefix,
    });
  }
  let generated: Record<string, unknown> = init?.cloudConfig ?? {};
  if (extras && extras.files.length > 0) {
    const writeFiles = await filesToWriteFiles(extras.files, namespace, refs, ANNOTATION, budget);
    generated = virtletMerge(generated, { write_files: writeFiles }) as Record<string, unknown>;
  }
  const fromField = `${ANNOTATION}.userDataFrom`;
  const from = extras?.userDataFrom
    ? {
        spec: extras.userDataFrom,
        entries: await readObject(refs, namespace, extras.userDataFrom, fromField),
        field: fromField,
      }
    : undefined;
  const inline =
    data.userData && data.userData.length > 0 ? { bytes: data.userData, field: data.userDataField } : undefined;
  // Only a merge (two parts or more, or userDataFrom's keys) parses and
  // serialises; one part passes through as it is.
  const parts = (Object.keys(generated).length > 0 ? 1 : 0) + (from ? 1 : 0) + (inline ? 1 : 0);
  const merges =
    extras?.userDataScript === undefined && (parts > 1 || (from !== undefined && from.spec.key === undefined));
  const mergeBytes = merges
    ? budget.snapshot().userData +
      (inline?.bytes.length ?? 0) +
      (from?.entries.reduce((n, e) => n + e.bytes.length, 0) ?? 0)
    : 0;
  const { composed, budget: charged } = await offload.run(
    'composeUserData',
    [
      {
        generated,
        ...(from ? { from } : {}),
        ...(inline ? { inline } : {}),
        ...(extras?.userDataScript !== undefined
          ? { script: { text: extras.userDataScript, field: `${ANNOTATION}.userDataScript` } }
          : {}),
        mode: extras?.userDataMerge ?? 'merge',
      },
      budget.snapshot(),
    ],
    mergeBytes,
    options.signal,
  );
  budget.adopt(charged);
  const userData = composed?.bytes ?? new Uint8Array();
  const userDataField = composed?.field ?? data.userDataField;
  if (userData.length > options.maxUserDataBytes) {
    throw tooLarge('USERDATA_TOO_LARGE', userDataField, userData.length, options.maxUserDataBytes);
  }
  budget.seed(userData.length, userDataField);
  await yieldToLoop();
  const warnings = [
    ...admissionWarnings,
    ...(composed?.merged
      ? []
      : await lintVolumeUserData(offload, userData, userDataField, hasAnnotation, options.signal)),
  ];
  await yieldToLoop();

  const givenNetwork = data.networkData && data.networkData.length > 0 ? data.networkData : undefined;
  if (givenNetwork && givenNetwork.length > options.maxNetworkDataBytes) {
    throw tooLarge('NETWORKDATA_TOO_LARGE', data.networkDataField, givenNetwork.length, options.maxNetworkDataBytes);
  }
  if (givenNetwork) budget.seed(givenNetwork.length, data.networkDataField);
  let networkConfig: Uint8Array | undefined;
  try {
    networkConfig = await offload.run(
      'chooseNetworkConfig',
      [
        {
          vmi,
          datasource,
          prefix: ANNOTATION,
          forceDHCP: extras?.forceDHCP ?? false,
          ...(init?.network ? { initNetwork: init.network } : {}),
          ...(givenNetwork ? { given: { bytes: givenNetwork, field: data.networkDataField } } : {}),
        },
      ],
      givenNetwork?.length ?? 0,
      options.signal,
    );
  } catch (e) {
    // KubeVirt writes a volume's network data as given, whatever it is; the
    // annotation (vmseed's own API) stays strict.
    if (hasAnnotation || !givenNetwork || !isPassableNetworkError(e)) throw e;
    networkConfig = givenNetwork;
    warnings.push(passThroughWarning(e, givenNetwork, datasource, data.networkDataField));
  }

  const vendor = await resolveVendorData(extras, options.defaultVendorData, namespace, refs, ANNOTATION);
  let vendorData: Uint8Array | undefined;
  if (vendor) {
    budget.seed(vendor.bytes.length, vendor.field);
    warnings.push(
      ...(await offload.run(
        'lintVendorData',
        [vendor.bytes, vendor.field, options.maxUserDataBytes],
        vendor.bytes.length,
        options.signal,
      )),
    );
    vendorData = vendorDataFile(vendor.bytes, datasource, vendor.field);
  }

  let devices: DeviceData[] | undefined;
  if (datasource === 'configdrive') {
    const d = buildDevicesMetadata(vmi, context.domainDevices, context.vcpuPins);
    devices = d.devices;
    warnings.push(...d.warnings);
  }
  // Merged here: its inputs are in this thread, and cloning a 15,000-key
  // mapping to a worker and back costs more than the merge (bench:hostile).
  const metaData = mergeMetaData(
    buildMetaData(vmi, datasource, publicKeys, devices),
    extras?.metaData,
    datasource,
    `${ANNOTATION}.metaData`,
  );
  budget.seed(metaDataSize(metaData, budget.seedRemaining), `${ANNOTATION}.metaData`);
  const seed: Seed = {
    datasource,
    metaData,
    userData,
    ...(networkConfig ? { networkConfig } : {}),
    ...(vendorData && vendorData.length > 0 ? { vendorData } : {}),
    warnings,
  };
  return { kind: 'seed', seed };
}

function extrasProduceData(extras: AnnotationExtras | undefined): boolean {
  if (!extras) return false;
  return !!(
    extras.metaData ||
    extras.userDataFrom ||
    extras.userDataScript !== undefined ||
    extras.files.length > 0 ||
    extras.forceDHCP ||
    extras.init ||
    extras.vendorData ||
    extras.vendorDataFrom
  );
}

// The annotation is vmseed's API and refuses cloud-config cloud-init cannot
// load. A volume's user-data is KubeVirt's: it writes it as given, and the
// guest still gets the SSH keys and network config of the seed, so vmseed
// warns instead of withholding the whole seed.
async function lintVolumeUserData(
  offload: Offload,
  userData: Uint8Array,
  field: string,
  strict: boolean,
  signal: AbortSignal | undefined,
): Promise<SeedWarning[]> {
  try {
    return await offload.run('lintUserData', [userData, field], userData.length, signal);
  } catch (e) {
    if (strict || !(e instanceof VmseedError) || e.code !== 'USERDATA_CLOUDCONFIG_INVALID') throw e;
    return [
      {
        code: 'USERDATA_CLOUDCONFIG_INVALID',
        field,
        message: `${e.message}. Written as given, as KubeVirt does: the seed's SSH keys and network config still apply`,
      },
    ];
  }
}

// meta-data's JSON size, measured (not serialised) against what is left of
// the seed budget; past it (or cyclic, which parsing already refuses), one
// byte more than what is left, so seed() refuses it.
function metaDataSize(metaData: Record<string, unknown>, remaining: number): number {
  const m = measureExpanded(metaData, remaining);
  return typeof m === 'number' ? m : remaining + 1;
}
