// The fields of the `vmseed.io/cloud-init` document that go beyond
// KubeVirt's volume API: Virtlet's (metaData, userDataFrom, userDataMerge,
// userDataScript, sshKeys, sshKeysFrom, files, forceDHCP), oVirt's
// structured `init`, and vendor-data. Shapes are checked here; content
// (YAML of user-data, init semantics) where it is used.
import { VmseedError } from '../../errors.ts';
import type { MergeMode } from '../userdata/merge.ts';
import type { ObjectRef } from '../refs/object-refs.ts';
import { isPlainObject } from '../yaml.ts';
import { checkListLength, LIMITS } from '../limits.ts';

/** Virtlet's `userDataFrom`: a ConfigMap or Secret, and how its value is encoded. */
export interface UserDataFrom extends ObjectRef {
  encoding: 'plain' | 'base64';
}

/** One `files[]` entry: an object, or one key of it, written into the guest under `path`. */
export interface FileSpec {
  from: ObjectRef;
  path: string;
  permissions?: string;
}

/** The annotation's fields beyond KubeVirt's volume API, shape-checked by parseExtras. */
export interface AnnotationExtras {
  metaData?: Record<string, unknown>;
  userDataFrom?: UserDataFrom;
  userDataMerge: MergeMode;
  userDataScript?: string;
  sshKeys: string[];
  sshKeysFrom?: ObjectRef;
  files: FileSpec[];
  forceDHCP: boolean;
  // Checked by init/init-parse.ts.
  init?: Record<string, unknown>;
  vendorData?: string;
  vendorDataFrom?: ObjectRef;
}

export const EXTRA_FIELDS = [
  'metaData',
  'userDataFrom',
  'userDataMerge',
  'userDataScript',
  'sshKeys',
  'sshKeysFrom',
  'files',
  'forceDHCP',
  'init',
  'vendorData',
  'vendorDataFrom',
] as const;

export function invalidField(annotation: string, field: string, message: string): VmseedError {
  return new VmseedError('ANNOTATION_INVALID', `annotation ${annotation}: ${field} ${message}`, {
    kind: 'terminal',
    field: `${annotation}.${field}`,
  });
}

// Unix permissions as cloud-init's write_files takes them: an octal string.
export const PERMISSIONS = /^0?[0-7]{3,4}$/;

/**
 * Octal permissions as 4 digits ("0644"), or undefined when `value` is not one. An unquoted
 * `permissions: 0644` is the number 644 to js-yaml (YAML 1.2) but octal 420 to PyYAML (YAML 1.1);
 * either way the user wrote the digits 0644, so a number is read back as those digits.
 */
export function permissionsText(value: unknown): string | undefined {
  const text = typeof value === 'number' ? String(value) : typeof value === 'string' ? value : undefined;
  if (text === undefined || !PERMISSIONS.test(text)) return undefined;
  return text.padStart(4, '0');
}

export function readObjectRef(
  annotation: string,
  value: unknown,
  field: string,
  extraKeys: readonly string[] = [],
): ObjectRef {
  const bad = () =>
    invalidField(
      annotation,
      field,
      `must be a mapping {kind: configmap|secret, name, key?} (e.g. "${field}: {kind: configmap, name: my-data}")`,
    );
  if (!isPlainObject(value)) throw bad();
  for (const k of Object.keys(value)) {
    if (!['kind', 'name', 'key', ...extraKeys].includes(k))
      throw invalidField(annotation, `${field}.${k}`, 'is not a known field; use kind, name, key');
  }
  const kind = typeof value.kind === 'string' ? value.kind.toLowerCase() : value.kind;
  if (kind !== 'configmap' && kind !== 'secret')
    throw invalidField(annotation, `${field}.kind`, 'must be "configmap" or "secret"');
  if (typeof value.name !== 'string' || value.name === '')
    throw invalidField(annotation, `${field}.name`, 'must be a non-empty string');
  if (value.key !== undefined && (typeof value.key !== 'string' || value.key === '')) {
    throw invalidField(annotation, `${field}.key`, 'must be a non-empty string; omit it for the default');
  }
  return { kind, name: value.name, ...(typeof value.key === 'string' ? { key: value.key } : {}) };
}

export function parseExtras(annotation: string, doc: Record<string, unknown>): AnnotationExtras {
  const out: AnnotationExtras = { userDataMerge: 'merge', sshKeys: [], files: [], forceDHCP: false };
  parseUserDataFields(annotation, doc, out);
  parseSshKeys(annotation, doc, out);
  if (doc.files != null) out.files = parseFiles(annotation, doc.files);
  if (doc.forceDHCP != null) {
    if (typeof doc.forceDHCP !== 'boolean') throw invalidField(annotation, 'forceDHCP', 'must be true or false');
    out.forceDHCP = doc.forceDHCP;
  }
  if (doc.init != null) {
    if (!isPlainObject(doc.init))
      throw new VmseedError(
        'INIT_INVALID',
        `annotation ${annotation}: init must be a mapping (hostname, timezone, users, dns, nics, files)`,
        { kind: 'terminal', field: `${annotation}.init` },
      );
    out.init = doc.init;
  }
  parseVendorData(annotation, doc, out);
  return out;
}

// Virtlet's metaData, userDataFrom, userDataMerge and userDataScript.
function parseUserDataFields(annotation: string, doc: Record<string, unknown>, out: AnnotationExtras): void {
  const bad = (field: string, message: string) => invalidField(annotation, field, message);
  if (doc.metaData != null) {
    if (!isPlainObject(doc.metaData))
      throw new VmseedError(
        'METADATA_INVALID',
        `annotation ${annotation}: metaData must be a YAML mapping of meta-data keys (e.g. "metaData: {instance-id: web-1}")`,
        { kind: 'terminal', field: `${annotation}.metaData` },
      );
    out.metaData = doc.metaData;
  }
  if (doc.userDataFrom != null) {
    const ref = readObjectRef(annotation, doc.userDataFrom, 'userDataFrom', ['encoding']);
    const enc = (doc.userDataFrom as Record<string, unknown>).encoding ?? 'plain';
    if (enc !== 'plain' && enc !== 'base64') throw bad('userDataFrom.encoding', 'must be "plain" or "base64"');
    out.userDataFrom = { ...ref, encoding: enc };
  }
  if (doc.userDataMerge != null) {
    if (doc.userDataMerge !== 'merge' && doc.userDataMerge !== 'overwrite')
      throw bad('userDataMerge', 'must be "merge" (default) or "overwrite"');
    out.userDataMerge = doc.userDataMerge;
  }
  if (doc.userDataScript != null) {
    if (typeof doc.userDataScript !== 'string' || doc.userDataScript === '')
      throw bad('userDataScript', 'must be a non-empty string (a script starting with "#!")');
    out.userDataScript = doc.userDataScript;
  }
}

function parseSshKeys(annotation: string, doc: Record<string, unknown>, out: AnnotationExtras): void {
  if (doc.sshKeys != null) {
    // A list, or Virtlet's one-key-per-line text.
    const list = typeof doc.sshKeys === 'string' ? doc.sshKeys.split('\n') : doc.sshKeys;
    if (!Array.isArray(list) || !list.every((k) => typeof k === 'string'))
      throw invalidField(annotation, 'sshKeys', 'must be a list of public keys (strings)');
    out.sshKeys = list.map((k) => k.trim()).filter((k) => k !== '' && !k.startsWith('#'));
    checkListLength(out.sshKeys, LIMITS.sshKeys, `${annotation}.sshKeys`);
  }
  if (doc.sshKeysFrom != null) out.sshKeysFrom = readObjectRef(annotation, doc.sshKeysFrom, 'sshKeysFrom');
}

function parseFiles(annotation: string, files: unknown): FileSpec[] {
  const bad = (field: string, message: string) => invalidField(annotation, field, message);
  if (!Array.isArray(files)) throw bad('files', 'must be a list of {from: {kind, name, key?}, path, permissions?}');
  checkListLength(files, LIMITS.files, `${annotation}.files`);
  return files.map((f, i) => {
    const field = `files[${i}]`;
    if (!isPlainObject(f)) throw bad(field, 'must be a mapping {from, path, permissions?}');
    for (const k of Object.keys(f))
      if (!['from', 'path', 'permissions'].includes(k))
        throw bad(`${field}.${k}`, 'is not a known field; use from, path, permissions');
    const from = readObjectRef(annotation, f.from, `${field}.from`);
    if (typeof f.path !== 'string' || !f.path.startsWith('/'))
      throw bad(`${field}.path`, 'must be an absolute path in the guest');
    let permissions: string | undefined;
    if (f.permissions != null) {
      permissions = permissionsText(f.permissions);
      if (permissions === undefined)
        throw bad(`${field}.permissions`, 'must be octal permissions like "0644" (quote it)');
    }
    return { from, path: f.path, ...(permissions ? { permissions } : {}) };
  });
}

function parseVendorData(annotation: string, doc: Record<string, unknown>, out: AnnotationExtras): void {
  if (doc.vendorData != null) {
    if (typeof doc.vendorData !== 'string')
      throw invalidField(annotation, 'vendorData', 'must be a string (use a YAML block scalar "|")');
    out.vendorData = doc.vendorData;
  }
  if (doc.vendorDataFrom != null) out.vendorDataFrom = readObjectRef(annotation, doc.vendorDataFrom, 'vendorDataFrom');
  if (out.vendorData !== undefined && out.vendorDataFrom) {
    throw new VmseedError(
      'VENDORDATA_INVALID',
      `annotation ${annotation}: vendorData and vendorDataFrom are both set; keep one`,
      { kind: 'terminal', field: `${annotation}.vendorDataFrom` },
    );
  }
}
