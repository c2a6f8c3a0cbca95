// Fetching referenced Secrets. A missing Secret or key is retryable: the VMI
// is often created before its Secret (kubectl apply -f dir/, GitOps ordering).
import { VmseedError } from '../../errors.ts';
import type { RefResolver } from '../../api/objects.ts';
import { hasSecretKey, secretValue } from './secret-data.ts';
import { fetchObject } from './object-refs.ts';

/**
 * The Secret keys user-data is read from, the first present wins: KubeVirt reads userdata then
 * userData; `value` is the Cluster API bootstrap-data convention, read last.
 */
export const USERDATA_SECRET_KEYS = ['userdata', 'userData', 'value'] as const;
/** The Secret keys network data is read from, the first present wins, as KubeVirt reads them. */
export const NETWORKDATA_SECRET_KEYS = ['networkdata', 'networkData'] as const;

/**
 * The value of the first of `keys` the Secret has, like KubeVirt's readFirstFoundFileFromDir: an
 * existing but empty key still wins over later keys. Throws retryable SECRET_NOT_FOUND or
 * SECRET_KEY_NOT_FOUND, terminal SECRET_DATA_INVALID.
 */
export async function readSecretKey(
  refs: RefResolver,
  namespace: string,
  name: string,
  keys: readonly string[],
  field: string,
): Promise<Uint8Array> {
  const secret = await fetchObject(refs, 'Secret', namespace, name, field);
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
