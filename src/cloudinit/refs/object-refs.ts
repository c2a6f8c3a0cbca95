// References of the vmseed annotation to a ConfigMap or a Secret
// (`{kind: configmap|secret, name, key?}`), read through RefResolver. Missing
// objects and keys are retryable, like Secrets for KubeVirt's fields: the
// object is often applied after the VMI.
import { VmseedError } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { ConfigMapObject, RefResolver } from '../../api/objects.ts';
import { secretKeys, secretValue } from './secret-data.ts';
import { fetchSecret } from './secret-refs.ts';

export type ObjectKind = 'configmap' | 'secret';

export interface ObjectRef {
  kind: ObjectKind;
  name: string;
  key?: string;
}

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

export async function fetchConfigMap(
  refs: RefResolver,
  namespace: string,
  name: string,
  field: string,
): Promise<ConfigMapObject> {
  const cm = await refs.getConfigMap(namespace, name);
  if (cm === undefined) {
    throw new VmseedError(
      'CONFIGMAP_NOT_FOUND',
      `ConfigMap ${namespace}/${name} referenced by ${field} does not exist; create it in namespace ${namespace} ` +
        '(vmseed retries until it appears)',
      { kind: 'retryable', field },
    );
  }
  return cm;
}

// Every key of the object (sorted bytewise, as a mounted volume lists them),
// or just `ref.key` (falling back to `defaultKey`) when one is wanted.
export async function readObject(
  refs: RefResolver,
  namespace: string,
  ref: ObjectRef,
  field: string,
  defaultKey?: string,
): Promise<ObjectEntry[]> {
  const wanted = ref.key ?? defaultKey;
  if (ref.kind === 'secret') {
    const secret = await fetchSecret(refs, namespace, ref.name, field);
    const keys = wanted === undefined ? secretKeys(secret) : [wanted];
    return keys.map((key) => {
      const bytes = secretValue(secret, key);
      if (bytes === undefined) throw keyMissing('Secret', namespace, ref.name, key, field);
      return { key, bytes };
    });
  }
  const cm = await fetchConfigMap(refs, namespace, ref.name, field);
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
