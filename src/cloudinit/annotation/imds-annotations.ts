// KubeVirt IMDS compatibility (github.com/rophy/kubevirt-imds): a VMI that
// carries IMDS's annotations is served the way IMDS's sidecar serves it, so
// its users can move to vmseed without editing their VMs.
//
// What IMDS does (internal/webhook/mutate.go, internal/imds/handlers.go,
// docs/cloud-init.md):
//   - `imds.kubevirt.io/enabled: "true"` (exactly "true") opts the VM in;
//   - `imds.kubevirt.io/user-data` is the user-data, verbatim;
//   - meta-data is `instance-id: <namespace>-<vm name>` and
//     `local-hostname: <vm name>`, nothing else (the VM name is the launcher
//     pod's `kubevirt.io/domain` label, i.e. the VMI name);
//   - network-config is always 404, so cloud-init falls back to DHCP;
//   - the guest's serial is `ds=nocloud;s=http://169.254.169.254/v1/`, with
//     no per-VM part: the sidecar trusts the pod's network namespace.
//
// Where vmseed differs, and why:
//   - meta-data is JSON (`{"instance-id":…,"local-hostname":…}`) like every
//     vmseed seed; JSON is YAML, so cloud-init reads the same two keys;
//   - user-data that is not set is served empty (200), where IMDS answers
//     404: cloud-init's read_seeded raises on a failed user-data fetch and
//     the datasource is not found at all, which is never what was meant;
//   - IMDS's wanted features (docs/cloud-init.md "Future Enhancements"):
//     user-data from a ConfigMap, under the annotation name IMDS proposed
//     (`imds.kubevirt.io/user-data-configmap: <name>[/<key>]`, key default
//     `user-data`), and vendor-data, which is the operator's
//     `--vendor-data-from` ConfigMap, as for every other vmseed seed.
//
// The seed is delivered over HTTP only (no seed disk): that is how IMDS
// delivers it, and a second copy on a cidata disk would make cloud-init
// prefer the disk and ignore the serial.
import { VmseedError } from '../../errors.ts';
import type { RefResolver, VmiObject } from '../../api/objects.ts';
import { readObjectKey } from '../refs/object-refs.ts';
import type { Seed, SeedWarning } from '../seed.ts';
import { bootstrapSentinel } from '../userdata/bootstrap-sentinel.ts';
import { lintUserData } from '../userdata/user-data-lint.ts';
import { withReportingPart } from '../userdata/reporting-config.ts';
import { lintVendorData, resolveVendorData, type VendorDataRef } from '../userdata/vendor-data.ts';

/** KubeVirt IMDS's opt-in annotation; only the exact value "true" opts in. */
export const IMDS_ENABLED = 'imds.kubevirt.io/enabled';
export const IMDS_USER_DATA = 'imds.kubevirt.io/user-data';
export const IMDS_USER_DATA_CONFIGMAP = 'imds.kubevirt.io/user-data-configmap';
export const IMDS_USER_DATA_KEY = 'user-data';

/** Whether the VMI opts in to KubeVirt IMDS compatibility (IMDS_ENABLED is exactly "true"). */
export function isImdsEnabled(vmi: VmiObject): boolean {
  return vmi.metadata.annotations?.[IMDS_ENABLED] === 'true';
}

// IMDS's instance-id: `<namespace>-<name>`. Not unique in general
// (`a-b`/`c` and `a`/`b-c` collide), but it is what IMDS guests have cached
// in /var/lib/cloud/data/instance-id; another id would make their next boot
// a first boot (per-instance modules re-run, SSH host keys regenerated).
export function imdsInstanceId(vmi: VmiObject): string {
  return `${vmi.metadata.namespace ?? 'default'}-${vmi.metadata.name}`;
}

export interface ImdsRenderOptions {
  maxUserDataBytes: number;
  defaultVendorData?: VendorDataRef;
}

function parseConfigMapRef(value: string): { name: string; key: string } {
  const m = /^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)(?:\/([-._a-zA-Z0-9]{1,253}))?$/.exec(value.trim());
  if (!m) {
    throw new VmseedError(
      'ANNOTATION_INVALID',
      `${IMDS_USER_DATA_CONFIGMAP} must be <configmap>[/<key>] (e.g. my-vm-userdata or my-vm-userdata/user-data); the key defaults to "${IMDS_USER_DATA_KEY}"`,
      { kind: 'terminal', field: `metadata.annotations.${IMDS_USER_DATA_CONFIGMAP}` },
    );
  }
  return { name: m[1], key: m[3] ?? IMDS_USER_DATA_KEY };
}

async function userDataOf(
  vmi: VmiObject,
  refs: RefResolver,
  max: number,
): Promise<{ bytes: Uint8Array; field: string }> {
  const a = vmi.metadata.annotations ?? {};
  const inline = a[IMDS_USER_DATA];
  const fromCm = a[IMDS_USER_DATA_CONFIGMAP];
  const inlineField = `metadata.annotations.${IMDS_USER_DATA}`;
  const cmField = `metadata.annotations.${IMDS_USER_DATA_CONFIGMAP}`;
  if (inline !== undefined && inline !== '' && fromCm !== undefined) {
    throw new VmseedError(
      'USERDATA_SOURCE_CONFLICT',
      `both ${IMDS_USER_DATA} and ${IMDS_USER_DATA_CONFIGMAP} are set; keep only one of them`,
      { kind: 'terminal', field: cmField },
    );
  }
  let bytes: Uint8Array;
  let field: string;
  if (fromCm !== undefined) {
    const ref = parseConfigMapRef(fromCm);
    bytes = await readObjectKey(
      refs,
      vmi.metadata.namespace ?? 'default',
      { kind: 'configmap', name: ref.name, key: ref.key },
      cmField,
      IMDS_USER_DATA_KEY,
    );
    field = cmField;
  } else {
    bytes = new Uint8Array(Buffer.from(inline ?? '', 'utf8'));
    field = inlineField;
  }
  if (bytes.length > max) {
    throw new VmseedError(
      'USERDATA_TOO_LARGE',
      `user-data from ${field} is ${bytes.length} bytes, over the limit of ${max} bytes; shrink it or raise the limit in the agent configuration`,
      { kind: 'terminal', field },
    );
  }
  return { bytes, field };
}

// The agent keeps this word about the user-data, never the bytes (the
// provisioning state `bootstrapped`).
function sentinelOf(userData: Uint8Array, max: number): Pick<Seed, 'bootstrapSentinel'> {
  const where = bootstrapSentinel(userData, max);
  return where === 'none' ? {} : { bootstrapSentinel: where };
}

/**
 * The seed IMDS would serve for this VMI (HTTP delivery only). Call only when isImdsEnabled(vmi);
 * reportUrl as RenderContext's. Throws VmseedError: ANNOTATION_INVALID, USERDATA_SOURCE_CONFLICT,
 * USERDATA_TOO_LARGE, VENDORDATA_INVALID (terminal), or a missing ConfigMap or key (retryable).
 */
export async function renderImdsSeed(
  vmi: VmiObject,
  refs: RefResolver,
  options: ImdsRenderOptions,
  reportUrl?: string,
): Promise<Seed> {
  const { bytes: userData, field } = await userDataOf(vmi, refs, options.maxUserDataBytes);
  const warnings: SeedWarning[] = userData.length > 0 ? lintUserData(userData, field) : [];
  const namespace = vmi.metadata.namespace ?? 'default';
  const vendor = await resolveVendorData(undefined, options.defaultVendorData, namespace, refs, IMDS_ENABLED);
  if (vendor) warnings.push(...lintVendorData(vendor.bytes, vendor.field, options.maxUserDataBytes));
  const reporting = reportUrl === undefined ? undefined : withReportingPart(vendor?.bytes, reportUrl);
  const vendorData = reporting && 'bytes' in reporting ? reporting.bytes : vendor?.bytes;
  return {
    datasource: 'nocloud',
    metaData: { 'instance-id': imdsInstanceId(vmi), 'local-hostname': vmi.metadata.name },
    userData,
    ...(vendorData && vendorData.length > 0 ? { vendorData } : {}),
    ...(reporting && 'reason' in reporting ? { progressNotReported: reporting.reason } : {}),
    ...sentinelOf(userData, options.maxUserDataBytes),
    delivery: 'http',
    warnings,
  };
}
