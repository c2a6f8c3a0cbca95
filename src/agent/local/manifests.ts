// Multi-document YAML manifests → typed objects, for local mode and
// `vmseed build --vmi`. Pure: the caller reads the file and passes its text
// and name (the name only labels errors).
import { VmseedError } from '../../errors.ts';
import { decodeBase64Strict } from '../../cloudinit/base64.ts';
import { kubevirtFirmwareUuid } from '../../cloudinit/kubevirt/instance-id.ts';
import type { ConfigMapObject, ObjectMeta, SecretObject, VmiObject } from '../../api/objects.ts';
import { isPlainObject, parseYamlAll, where } from '../../cloudinit/yaml.ts';

export interface ManifestObjects {
  vmis: VmiObject[];
  secrets: SecretObject[];
  configMaps: ConfigMapObject[];
  // Other kinds (Services, DataVolumes…) found beside them; not an error.
  ignored: Array<{ kind: string; name: string; document: number }>;
}

export const DEFAULT_NAMESPACE = 'default';

function junk(file: string, doc: number, message: string, field?: string): VmseedError {
  return new VmseedError('MANIFEST_INVALID', `${file}: document ${doc}: ${message}`, {
    kind: 'terminal',
    field: field ?? `${file}#${doc}`,
  });
}

function readMeta(value: unknown, file: string, doc: number): ObjectMeta {
  if (!isPlainObject(value) || typeof value.name !== 'string' || value.name === '') {
    throw junk(file, doc, 'metadata.name is missing or not a string', 'metadata.name');
  }
  if (value.namespace !== undefined && typeof value.namespace !== 'string') {
    throw junk(file, doc, 'metadata.namespace must be a string', 'metadata.namespace');
  }
  for (const k of ['labels', 'annotations'] as const) {
    const m = value[k];
    if (m === undefined || m === null) continue;
    if (!isPlainObject(m) || Object.values(m).some((v) => typeof v !== 'string')) {
      throw junk(file, doc, `metadata.${k} must map names to strings (quote values like "true")`, `metadata.${k}`);
    }
  }
  const meta = { ...(value as unknown as ObjectMeta) };
  meta.namespace = meta.namespace || DEFAULT_NAMESPACE;
  return meta;
}

function stringMap(
  value: unknown,
  file: string,
  doc: number,
  field: string,
  base64: boolean,
): Record<string, string> | undefined {
  if (value === undefined || value === null) return undefined;
  if (!isPlainObject(value)) throw junk(file, doc, `${field} must be a mapping of keys to strings`, field);
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(value)) {
    if (typeof v !== 'string') throw junk(file, doc, `${field}.${k} must be a string (quote it)`, `${field}.${k}`);
    if (base64) {
      const r = decodeBase64Strict(v);
      if (!r.ok)
        throw junk(
          file,
          doc,
          `${field}.${k} is not valid base64 (${r.reason}); use stringData for plain text`,
          `${field}.${k}`,
        );
    }
    out[k] = v;
  }
  return out;
}

// The API server enforces these types; a local manifest has no such guard,
// and a number where a string belongs would otherwise surface much later.
function checkVolume(v: unknown, file: string, doc: number, field: string): void {
  if (!isPlainObject(v) || typeof v.name !== 'string') throw junk(file, doc, `${field} needs a "name"`, field);
  for (const kind of ['cloudInitNoCloud', 'cloudInitConfigDrive'] as const) {
    const src = v[kind];
    if (src === undefined || src === null) continue;
    const f = `${field}.${kind}`;
    if (!isPlainObject(src)) throw junk(file, doc, `${f} must be a mapping`, f);
    for (const k of ['userData', 'userDataBase64', 'networkData', 'networkDataBase64']) {
      if (src[k] !== undefined && src[k] !== null && typeof src[k] !== 'string') {
        throw junk(file, doc, `${f}.${k} must be a string (use a "|" block for multi-line data)`, `${f}.${k}`);
      }
    }
    for (const k of ['secretRef', 'networkDataSecretRef']) {
      const ref = src[k];
      if (
        ref !== undefined &&
        ref !== null &&
        (!isPlainObject(ref) || typeof ref.name !== 'string' || ref.name === '')
      ) {
        throw junk(file, doc, `${f}.${k} must be a mapping with a non-empty "name"`, `${f}.${k}`);
      }
    }
  }
}

function checkCredential(c: unknown, file: string, doc: number, field: string): void {
  if (!isPlainObject(c)) throw junk(file, doc, `${field} must be a mapping`, field);
  const ssh = c.sshPublicKey;
  if (ssh === undefined || ssh === null) return;
  // No source at all is for the admission check (cloudinit/kubevirt/volume-rules.ts), which
  // answers with KubeVirt's wording; a malformed one is a manifest error.
  if (
    isPlainObject(ssh) &&
    (ssh.source === undefined || ssh.source === null || (isPlainObject(ssh.source) && ssh.source.secret == null))
  )
    return;
  const name =
    isPlainObject(ssh) && isPlainObject(ssh.source) && isPlainObject(ssh.source.secret)
      ? ssh.source.secret.secretName
      : undefined;
  if (typeof name !== 'string' || name === '') {
    throw junk(
      file,
      doc,
      `${field}.sshPublicKey.source.secret.secretName must be a non-empty string`,
      `${field}.sshPublicKey.source.secret.secretName`,
    );
  }
}

function toVmi(obj: Record<string, unknown>, file: string, doc: number): VmiObject {
  const metadata = readMeta(obj.metadata, file, doc);
  const spec = obj.spec ?? {};
  if (!isPlainObject(spec)) throw junk(file, doc, 'spec must be a mapping', 'spec');
  if (spec.volumes !== undefined && !Array.isArray(spec.volumes))
    throw junk(file, doc, 'spec.volumes must be a list', 'spec.volumes');
  if (spec.accessCredentials !== undefined && !Array.isArray(spec.accessCredentials)) {
    throw junk(file, doc, 'spec.accessCredentials must be a list', 'spec.accessCredentials');
  }
  (spec.volumes as unknown[] | undefined)?.forEach((v, i) => checkVolume(v, file, doc, `spec.volumes[${i}]`));
  (spec.accessCredentials as unknown[] | undefined)?.forEach((c, i) =>
    checkCredential(c, file, doc, `spec.accessCredentials[${i}]`),
  );
  return { ...(obj as unknown as VmiObject), kind: 'VirtualMachineInstance', metadata, spec: spec };
}

// What virt-controller does when it starts a VirtualMachine: the VMI takes
// the VM's name and namespace, the template's metadata and spec, and a
// firmware UUID derived from the VM name when none is set. That UUIDv5 is
// KubeVirt's legacy value (pkg/virt-controller/watch/vm/firmware.go
// CalculateLegacyUUID); since 1.6 its VM mutating webhook stores a random
// UUID in a new VM instead (vm-mutator.go setFirmwareDefaultsIfEmpty). A
// manifest on disk has nowhere to keep a random one, and a new one per run
// would change the instance-id, so the stable legacy value is used; set
// firmware.uuid in the template to pin another (docs/kubevirt-differences.md).
function vmToVmi(obj: Record<string, unknown>, file: string, doc: number): VmiObject {
  const vmMeta = readMeta(obj.metadata, file, doc);
  const spec = obj.spec;
  if (!isPlainObject(spec) || !isPlainObject(spec.template)) {
    throw junk(file, doc, 'VirtualMachine needs spec.template', 'spec.template');
  }
  const tmplMeta = isPlainObject(spec.template.metadata) ? spec.template.metadata : {};
  const vmi = toVmi(
    {
      apiVersion: obj.apiVersion,
      kind: 'VirtualMachineInstance',
      metadata: { ...tmplMeta, name: vmMeta.name, namespace: vmMeta.namespace },
      spec: structuredClone(spec.template.spec ?? {}),
    },
    file,
    doc,
  );
  const domain = (vmi.spec.domain ??= {});
  const firmware = (domain.firmware ??= {});
  if (!firmware.uuid) firmware.uuid = kubevirtFirmwareUuid(vmMeta.name);
  return vmi;
}

function addObject(out: ManifestObjects, obj: unknown, file: string, doc: number): void {
  if (obj === null || obj === undefined) return;
  if (!isPlainObject(obj))
    throw junk(file, doc, 'is not a Kubernetes object (expected a mapping with apiVersion, kind, metadata)');
  const kind = obj.kind;
  if (typeof kind !== 'string' || kind === '') throw junk(file, doc, '"kind" is missing', 'kind');
  switch (kind) {
    case 'VirtualMachineInstance':
      out.vmis.push(toVmi(obj, file, doc));
      return;
    case 'VirtualMachine':
      out.vmis.push(vmToVmi(obj, file, doc));
      return;
    case 'Secret': {
      const metadata = readMeta(obj.metadata, file, doc);
      const data = stringMap(obj.data, file, doc, 'data', true);
      const stringData = stringMap(obj.stringData, file, doc, 'stringData', false);
      out.secrets.push({
        apiVersion: 'v1',
        kind: 'Secret',
        metadata,
        ...(typeof obj.type === 'string' ? { type: obj.type } : {}),
        ...(data ? { data } : {}),
        ...(stringData ? { stringData } : {}),
      });
      return;
    }
    case 'ConfigMap': {
      const metadata = readMeta(obj.metadata, file, doc);
      const data = stringMap(obj.data, file, doc, 'data', false);
      const binaryData = stringMap(obj.binaryData, file, doc, 'binaryData', true);
      out.configMaps.push({
        apiVersion: 'v1',
        kind: 'ConfigMap',
        metadata,
        ...(data ? { data } : {}),
        ...(binaryData ? { binaryData } : {}),
      });
      return;
    }
    case 'List':
      if (!Array.isArray(obj.items)) throw junk(file, doc, 'List needs "items"', 'items');
      for (const item of obj.items) addObject(out, item, file, doc);
      return;
    default: {
      const name = isPlainObject(obj.metadata) && typeof obj.metadata.name === 'string' ? obj.metadata.name : '';
      out.ignored.push({ kind, name, document: doc });
    }
  }
}

/**
 * The VMIs, Secrets and ConfigMaps in a multi-document YAML text; `file` only
 * labels errors. Throws a terminal MANIFEST_INVALID, whose documents are
 * numbered from 1, as editors count them.
 */
export function parseManifests(text: string, file: string): ManifestObjects {
  const parsed = parseYamlAll(text);
  if (!parsed.ok) {
    throw new VmseedError('MANIFEST_INVALID', `${file}: YAML error at ${where(parsed)}: ${parsed.reason}`, {
      kind: 'terminal',
      field: file,
    });
  }
  const out: ManifestObjects = { vmis: [], secrets: [], configMaps: [], ignored: [] };
  parsed.value.forEach((obj, i) => addObject(out, obj, file, i + 1));
  return out;
}

/** The objects of several files as one set, in the order given (no dedup). */
export function mergeManifests(parts: ManifestObjects[]): ManifestObjects {
  return {
    vmis: parts.flatMap((p) => p.vmis),
    secrets: parts.flatMap((p) => p.secrets),
    configMaps: parts.flatMap((p) => p.configMaps),
    ignored: parts.flatMap((p) => p.ignored),
  };
}
