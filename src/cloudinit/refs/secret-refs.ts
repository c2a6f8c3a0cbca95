// Fetching referenced Secrets. A missing Secret or key is retryable: the VMI
// is often created before its Secret (kubectl apply -f dir/, GitOps ordering).
import { VmseedError } from '../../errors.ts';
import type { RefResolver, SecretObject } from '../../api/objects.ts';
import { hasSecretKey, secretValue } from './secret-data.ts';

// KubeVirt reads userdata then userData (PR #3929); `value` is the Cluster
// API bootstrap-data convention (hypershift#1642), read last.
export const USERDATA_SECRET_KEYS = ['userdata', 'userData', 'value'] as const;
export const NETWORKDATA_SECRET_KEYS = ['networkdata', 'networkData'] as const;

export async function fetchSecret(
  refs: RefResolver,
  namespace: string,
  name: string,
  field: string,
): Promise<SecretObject> {
  const secret = await refs.getSecret(namespace, name);
  if (secret === undefined) {
    throw new VmseedError(
      'SECRET_NOT_FOUND',
      `Secret ${namespace}/${name} referenced by ${field} does not exist; create it in namespace ${namespace} ` +
        '(vmseed retries until it appears)',
      { kind: 'retryable', field },
    );
  }
  return secret;
}

// The first of `keys` the Secret has, like KubeVirt's readFirstFoundFileFromDir:
// an existing but empty key still wins over later keys.
export async function readSecretKey(
  refs: RefResolver,
  namespace: string,
  name: string,
  keys: readonly string[],
  field: string,
): Promise<Uint8Array> {
  const secret = await fetchSecret(refs, namespace, name, field);
  for (const key of keys) {
    if (hasSecretKey(secret, key)) return secretValue(secret, key) ?? new Uint8Array();
  }
  throw new VmseedError(
    'SECRET_KEY_NOT_FOUND',
    `Secret ${namespace}/${name} referenced by ${field} has none of the keys ${keys.join(', ')}; ` +
      `add the data under "${keys[0]}" (vmseed retries)`,
    { kind: 'retryable', field },
  );
}
