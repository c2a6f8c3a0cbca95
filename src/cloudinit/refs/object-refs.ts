// References of the vmseed annotation to a ConfigMap or a Secret
// (`{kind: configmap|secret, name, key?}`), read through RefResolver. Missing
// objects and keys are retryable, like Secrets for KubeVirt's fields: the
// object is often applied after the VMI.
import { VmseedError, type ErrorCode } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { ConfigMapObject, RefResolver, SecretObject } from '../../api/objects.ts';
import { secretKeys, secretValue } from './secret-data.ts';

export type ObjectKind = 'configmap' | 'secret';

/** The annotation's `{kind, name, key?}` reference to a ConfigMap or Secret of the VMI's namespace. */
export interface ObjectRef {
  kind: ObjectKind;
  name: string;
  key?: string;
}

/** One key of a referenced object, with its value's bytes. */
export interface ObjectEntry {
  key: string;
  bytes: Uint8Array;
}

function configMapKeys(cm: ConfigMapObject): string[] {
  const keys = new Set([...Object.keys(cm.data ?? {}), ...Object.keys(cm.binaryData ?? {})]);
  return [...keys].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

function configMapValue(cm: ConfigMapObject, key: string, namespace: string): Uint8Array | undefined {
  if (cm.data && Object.hasOwn(cm.data, key)) return new Uint8Array(Buffer.from(String(cm.data[key]), 'utf8'));
  if (cm.binaryData && Object.hasOwn(cm.binaryData, key)) {
    const r = decodeBase64Strict(String(cm.binaryData[key]));
    if (!r.ok) {
      throw new VmseedError(
        'SECRET_DATA_INVALID',
        `ConfigMap ${namespace}/${cm.metadata.name} key "${key}" in binaryData is not valid base64 (${r.reason}); fix the ConfigMap`,
        { kind: 'terminal', field: `configmap/${cm.metadata.name}.binaryData.${key}` },
      );
    }
    return r.bytes;
  }
  return undefined;
}

/** The objects a reference can name, by kind. */
export interface Referenced {
  Secret: SecretObject;
  ConfigMap: ConfigMapObject;
}

// What fetchObject reads for each kind, and what it throws while one is missing.
const KINDS: {
  [K in keyof Referenced]: {
    missing: ErrorCode;
    get(refs: RefResolver, namespace: string, name: string): Promise<Referenced[K] | undefined>;
  };
} = {
  Secret: { missing: 'SECRET_NOT_FOUND', get: (refs, namespace, name) => refs.getSecret(namespace, name) },
  ConfigMap: { missing: 'CONFIGMAP_NOT_FOUND', get: (refs, namespace, name) => refs.getConfigMap(namespace, name) },
};

/**
 * The Secret or ConfigMap `namespace/name`; throws retryable SECRET_NOT_FOUND
 * or CONFIGMAP_NOT_FOUND, naming `field`, while it does not exist.
 */
export async function fetchObject<K extends keyof Referenced>(
  refs: RefResolver,
  kind: K,
  namespace: string,
  name: string,
  field: string,
): Promise<Referenced[K]> {
  const object = await KINDS[kind].get(refs, namespace, name);
  if (object === undefined) {
    throw new VmseedError(
      KINDS[kind].missing,
      `${kind} ${namespace}/${name} referenced by ${field} does not exist; create it in namespace ${namespace} ` +
        '(vmseed retries until it appears)',
      { kind: 'retryable', field },
    );
  }
  return object;
}

/**
 * Every key of the object (sorted bytewise, as a mounted volume lists them), or just `ref.key`
 * (falling back to `defaultKey`) when one is wanted. Throws VmseedError: a missing object or key,
 * retryable (`*_NOT_FOUND`); SECRET_DATA_INVALID for a value that is not base64, terminal.
 */
export async function readObject(
  refs: RefResolver,
  namespace: string,
  ref: ObjectRef,
  field: string,
  defaultKey?: string,
): Promise<ObjectEntry[]> {
  const wanted = ref.key ?? defaultKey;
  if (ref.kind === 'secret') {
    const secret = await fetchObject(refs, 'Secret', namespace, ref.name, field);
    const keys = wanted === undefined ? secretKeys(secret) : [wanted];
    return keys.map((key) => {
      const bytes = secretValue(secret, key);
      if (bytes === undefined) throw keyMissing('Secret', namespace, ref.name, key, field);
      return { key, bytes };
    });
  }
  const cm = await fetchObject(refs, 'ConfigMap', namespace, ref.name, field);
  const keys = wanted === undefined ? configMapKeys(cm) : [wanted];
  return keys.map((key) => {
    const bytes = configMapValue(cm, key, namespace);
    if (bytes === undefined) throw keyMissing('ConfigMap', namespace, ref.name, key, field);
    return { key, bytes };
  });
}

function keyMissing(kind: 'Secret' | 'ConfigMap', ns: string, name: string, key: string, field: string): VmseedError {
  return new VmseedError(
    kind === 'Secret' ? 'SECRET_KEY_NOT_FOUND' : 'CONFIGMAP_KEY_NOT_FOUND',
    `${kind} ${ns}/${name} referenced by ${field} has no key "${key}"; add it or change ${field}.key (vmseed retries)`,
    { kind: 'retryable', field },
  );
}

/** The bytes of one key, `ref.key` or else `defaultKey`; throws as readObject does. */
export async function readObjectKey(
  refs: RefResolver,
  namespace: string,
  ref: ObjectRef,
  field: string,
  defaultKey: string,
): Promise<Uint8Array> {
  const [entry] = await readObject(refs, namespace, ref, field, defaultKey);
  return entry.bytes;
}
