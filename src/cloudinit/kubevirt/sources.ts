// Turning a cloud-init source (annotation or KubeVirt volume) into user-data
// and network-data bytes.
//
// Two policies:
// - 'single' (the annotation, which no KubeVirt webhook admits): at most one
//   source per data kind, as KubeVirt's vmi-create-admitter enforces.
// - 'kubevirt' (a volume KubeVirt's webhook already admitted, or a local
//   manifest meant for it): virt-launcher's precedence, so the seed matches
//   what KubeVirt would build: plain text beats base64, and non-empty Secret
//   content replaces inline data.
import { VmseedError, type ErrorCode } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { CloudInitSource, LocalObjectReference, RefResolver } from '../../api/objects.ts';
import { NETWORKDATA_SECRET_KEYS, USERDATA_SECRET_KEYS, readSecretKey } from '../refs/secret-refs.ts';

export type SourcePolicy = 'single' | 'kubevirt';

interface KindSpec {
  raw?: string;
  base64?: string;
  ref?: LocalObjectReference;
  rawField: string;
  base64Field: string;
  refField: string;
  keys: readonly string[];
  base64Code: ErrorCode;
  conflictCode: ErrorCode;
  label: string;
}

function decode(text: string, code: ErrorCode, field: string): Uint8Array {
  const r = decodeBase64Strict(text);
  if (!r.ok) {
    throw new VmseedError(
      code,
      `${field} is not valid base64: ${r.reason}; encode with "base64 -w0" or use the plain-text field`,
      {
        kind: 'terminal',
        field,
      },
    );
  }
  return r.bytes;
}

const utf8 = (s: string): Uint8Array => new Uint8Array(Buffer.from(s, 'utf8'));

interface Resolved {
  bytes?: Uint8Array;
  // Where the bytes came from, for size errors and warnings.
  field: string;
}

async function resolveKind(spec: KindSpec, policy: SourcePolicy, ns: string, refs: RefResolver): Promise<Resolved> {
  const hasRaw = spec.raw !== undefined && spec.raw !== '';
  const hasB64 = spec.base64 !== undefined && spec.base64 !== '';
  const hasRef = spec.ref !== undefined;
  if (policy === 'single') {
    const set = [hasRaw && spec.rawField, hasB64 && spec.base64Field, hasRef && spec.refField].filter(
      (x): x is string => !!x,
    );
    if (set.length > 1) {
      throw new VmseedError(
        spec.conflictCode,
        `${set.length} ${spec.label} sources are set (${set.join(', ')}); set only one of them`,
        { kind: 'terminal', field: set[1] },
      );
    }
  }
  let inline: Resolved | undefined;
  if (hasRaw) inline = { bytes: utf8(spec.raw!), field: spec.rawField };
  else if (hasB64) inline = { bytes: decode(spec.base64!, spec.base64Code, spec.base64Field), field: spec.base64Field };
  if (hasRef) {
    const fromSecret = await readSecretKey(refs, ns, spec.ref!.name, spec.keys, spec.refField);
    if (fromSecret.length > 0 || inline === undefined) return { bytes: fromSecret, field: spec.refField };
  }
  return inline ?? { field: spec.rawField };
}

/** A source's user-data and network data as bytes (absent when unset), and the field each came from. */
export interface ResolvedData {
  userData?: Uint8Array;
  networkData?: Uint8Array;
  userDataField: string;
  networkDataField: string;
}

/**
 * Reads a source's user-data and network data under `policy` (header). Throws VmseedError:
 * `*_SOURCE_CONFLICT` (policy 'single') and `*_BASE64_INVALID`, terminal; SECRET_NOT_FOUND and
 * SECRET_KEY_NOT_FOUND, retryable.
 */
export async function resolveSourceData(
  source: CloudInitSource,
  fieldPrefix: string,
  secretRefField: string,
  policy: SourcePolicy,
  namespace: string,
  refs: RefResolver,
): Promise<ResolvedData> {
  const f = (name: string) => `${fieldPrefix}.${name}`;
  const user: KindSpec = {
    raw: source.userData,
    base64: source.userDataBase64,
    ref: source.secretRef,
    rawField: f('userData'),
    base64Field: f('userDataBase64'),
    refField: f(secretRefField),
    keys: USERDATA_SECRET_KEYS,
    base64Code: 'USERDATA_BASE64_INVALID',
    conflictCode: 'USERDATA_SOURCE_CONFLICT',
    label: 'user-data',
  };
  const net: KindSpec = {
    raw: source.networkData,
    base64: source.networkDataBase64,
    ref: source.networkDataSecretRef,
    rawField: f('networkData'),
    base64Field: f('networkDataBase64'),
    refField: f('networkDataSecretRef'),
    keys: NETWORKDATA_SECRET_KEYS,
    base64Code: 'NETWORKDATA_BASE64_INVALID',
    conflictCode: 'NETWORKDATA_SOURCE_CONFLICT',
    label: 'network-data',
  };
  const u = await resolveKind(user, policy, namespace, refs);
  const n = await resolveKind(net, policy, namespace, refs);
  return { userData: u.bytes, networkData: n.bytes, userDataField: u.field, networkDataField: n.field };
}

/** Whether the source sets any of its six data fields (an empty string does not count). */
export function hasAnyData(source: CloudInitSource): boolean {
  return !!(
    source.userData ||
    source.userDataBase64 ||
    source.secretRef ||
    source.networkData ||
    source.networkDataBase64 ||
    source.networkDataSecretRef
  );
}

/**
 * The terminal CLOUDINIT_SOURCE_MISSING error for a source that sets none of the data fields;
 * `alsoAccepted` (appended to the message) names the other fields that would have been enough.
 */
export function sourceMissing(fieldPrefix: string, alsoAccepted: string): VmseedError {
  return new VmseedError(
    'CLOUDINIT_SOURCE_MISSING',
    `${fieldPrefix} sets none of userData, userDataBase64, secretRef, networkData, networkDataBase64, networkDataSecretRef` +
      alsoAccepted +
      '; add user-data or network data',
    { kind: 'terminal', field: fieldPrefix },
  );
}
