// The `vmseed.io/cloud-init` annotation: a YAML document with the field names
// of KubeVirt's cloudInitNoCloud volume, so users keep what they know, plus
// `datasource`. KubeVirt ignores annotations, so this never doubles up with
// virt-launcher's own disk.
import { VmseedError } from '../../errors.ts';
import type { CloudInitSource, LocalObjectReference, Datasource } from '../../api/objects.ts';
import { isPlainObject, parseYaml, where } from '../yaml.ts';
import { EXTRA_FIELDS, parseExtras, type AnnotationExtras } from './extras.ts';
import { LIMITS } from '../limits.ts';

/** The annotation that carries vmseed's own cloud-init document; also the prefix of its field paths. */
export const ANNOTATION = 'vmseed.io/cloud-init';

/** The annotation parsed: its datasource, its KubeVirt-named fields as a cloud-init source, and vmseed's own fields. */
export interface AnnotationSpec {
  datasource: Datasource;
  source: CloudInitSource;
  // How the user spelled the user-data Secret reference, for messages.
  secretRefField: 'secretRef' | 'userDataSecretRef';
  // Virtlet, oVirt and vendor-data fields (extras.ts).
  extras: AnnotationExtras;
}

const STRING_FIELDS = ['userData', 'userDataBase64', 'networkData', 'networkDataBase64', 'datasource'] as const;
const REF_FIELDS = ['secretRef', 'userDataSecretRef', 'networkDataSecretRef'] as const;
// Every field of the document; the README's annotation reference documents each
// (a test keeps the two in step).
export const ANNOTATION_FIELDS: readonly string[] = [...STRING_FIELDS, ...REF_FIELDS, ...EXTRA_FIELDS];
const KNOWN = new Set<string>(ANNOTATION_FIELDS);

function invalid(message: string, field: string): VmseedError {
  return new VmseedError('ANNOTATION_INVALID', `annotation ${ANNOTATION}: ${message}`, { kind: 'terminal', field });
}

function readRef(value: unknown, field: string): LocalObjectReference {
  if (!isPlainObject(value) || typeof value.name !== 'string' || value.name === '') {
    throw invalid(
      `${field} must be a mapping with a non-empty "name" (e.g. "${field}: {name: my-secret}")`,
      `${ANNOTATION}.${field}`,
    );
  }
  return { name: value.name };
}

/**
 * The annotation's YAML checked into a spec; no reference is read. Pure (a PURE_OPS step). Throws
 * terminal VmseedError: ANNOTATION_TOO_LARGE (over LIMITS.annotationBytes), ANNOTATION_INVALID,
 * YAML_TOO_COMPLEX, DATASOURCE_UNKNOWN, USERDATA_SOURCE_CONFLICT, or an extras field's code.
 */
export function parseAnnotation(text: string): AnnotationSpec {
  // Checked on the UTF-16 length first: no byte count of a huge string is made.
  if (text.length > LIMITS.annotationBytes || Buffer.byteLength(text, 'utf8') > LIMITS.annotationBytes) {
    throw new VmseedError(
      'ANNOTATION_TOO_LARGE',
      `annotation ${ANNOTATION} is more than ${LIMITS.annotationBytes} bytes (the Kubernetes limit for all of an object's annotations); ` +
        'move large data into a Secret or ConfigMap and reference it',
      { kind: 'terminal', field: ANNOTATION },
    );
  }
  const parsed = parseYaml(text, { field: ANNOTATION });
  if (!parsed.ok) {
    throw invalid(`YAML error at ${where(parsed)}: ${parsed.reason}; fix the annotation's YAML`, ANNOTATION);
  }
  const doc = parsed.value ?? {};
  if (!isPlainObject(doc)) {
    throw invalid('must be a YAML mapping with fields like userData, secretRef, networkData, datasource', ANNOTATION);
  }
  for (const key of Object.keys(doc)) {
    if (!KNOWN.has(key)) {
      throw invalid(`unknown field "${key}"; known fields are ${[...KNOWN].join(', ')}`, `${ANNOTATION}.${key}`);
    }
  }
  for (const f of STRING_FIELDS) {
    if (doc[f] !== undefined && doc[f] !== null && typeof doc[f] !== 'string') {
      throw invalid(`${f} must be a string (use a YAML block scalar "|" for multi-line data)`, `${ANNOTATION}.${f}`);
    }
  }
  let datasource: Datasource = 'nocloud';
  if (typeof doc.datasource === 'string') {
    if (doc.datasource !== 'nocloud' && doc.datasource !== 'configdrive') {
      throw new VmseedError(
        'DATASOURCE_UNKNOWN',
        `annotation ${ANNOTATION}: datasource must be "nocloud" or "configdrive"; omit it for nocloud`,
        { kind: 'terminal', field: `${ANNOTATION}.datasource` },
      );
    }
    datasource = doc.datasource;
  }
  // KubeVirt's JSON name is secretRef although the Go field is UserDataSecretRef
  // (PR #11832); accept both spellings but not both at once.
  if (doc.secretRef != null && doc.userDataSecretRef != null) {
    throw new VmseedError(
      'USERDATA_SOURCE_CONFLICT',
      `annotation ${ANNOTATION}: secretRef and userDataSecretRef are the same field; keep one`,
      { kind: 'terminal', field: `${ANNOTATION}.userDataSecretRef` },
    );
  }
  const secretRefField = doc.userDataSecretRef != null ? 'userDataSecretRef' : 'secretRef';
  const source: CloudInitSource = {};
  if (typeof doc.userData === 'string') source.userData = doc.userData;
  if (typeof doc.userDataBase64 === 'string') source.userDataBase64 = doc.userDataBase64;
  if (typeof doc.networkData === 'string') source.networkData = doc.networkData;
  if (typeof doc.networkDataBase64 === 'string') source.networkDataBase64 = doc.networkDataBase64;
  const ud = doc[secretRefField];
  if (ud != null) source.secretRef = readRef(ud, secretRefField);
  if (doc.networkDataSecretRef != null)
    source.networkDataSecretRef = readRef(doc.networkDataSecretRef, 'networkDataSecretRef');
  return { datasource, source, secretRefField, extras: parseExtras(ANNOTATION, doc) };
}
