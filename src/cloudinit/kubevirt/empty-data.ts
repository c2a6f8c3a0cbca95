// KubeVirt's "required" rule after Secrets are read: a cloud-init volume
// whose user-data and network data both come out empty fails the VMI
// (pkg/cloud-init/cloud-init.go readCloudInitData: "userDataBase64, userData,
// networkDataBase64 or networkData is required for a cloud-init data
// source"). The usual way to get there is a Secret whose first key found is
// empty: the launcher reads the first of `userdata`, `userData` that exists
// (readFirstFoundFileFromDir) and stops there, even when it is empty, and an
// empty Secret value does not replace the inline field. vmseed reads the same
// key, so it fails the same way instead of writing an empty seed.
import { VmseedError } from '../../errors.ts';
import type { CloudInitSource, RefResolver } from '../../api/objects.ts';
import { hasSecretKey } from '../refs/secret-data.ts';
import { NETWORKDATA_SECRET_KEYS, USERDATA_SECRET_KEYS } from '../refs/secret-refs.ts';
import type { ResolvedData } from './sources.ts';

async function emptyKey(
  refs: RefResolver,
  ns: string,
  name: string | undefined,
  keys: readonly string[],
): Promise<string | undefined> {
  if (!name) return undefined;
  const secret = await refs.getSecret(ns, name);
  if (!secret) return undefined;
  return keys.find((k) => hasSecretKey(secret, k));
}

export async function requireSomeData(
  data: ResolvedData,
  source: CloudInitSource,
  fieldPrefix: string,
  namespace: string,
  refs: RefResolver,
): Promise<void> {
  if ((data.userData?.length ?? 0) > 0 || (data.networkData?.length ?? 0) > 0) return;
  const notes: string[] = [];
  let field = fieldPrefix;
  for (const [ref, keys, refField] of [
    [source.secretRef, USERDATA_SECRET_KEYS, 'secretRef'],
    [source.networkDataSecretRef, NETWORKDATA_SECRET_KEYS, 'networkDataSecretRef'],
  ] as const) {
    const key = await emptyKey(refs, namespace, ref?.name, keys);
    if (key === undefined) continue;
    if (field === fieldPrefix) field = `${fieldPrefix}.${refField}`;
    const later = keys.slice(0, 2).slice(keys.indexOf(key as never) + 1);
    notes.push(
      `Secret ${namespace}/${ref!.name} key "${key}" is empty` +
        (later.length > 0
          ? ` (KubeVirt reads the first of ${keys.slice(0, 2).join(', ')} that exists, so "${later[0]}" is not read)`
          : ''),
    );
  }
  throw new VmseedError(
    'CLOUDINIT_DATA_EMPTY',
    'userDataBase64, userData, networkDataBase64 or networkData is required for a cloud-init data source: ' +
      `${fieldPrefix} gives empty user-data and empty network data` +
      (notes.length > 0 ? `; ${notes.join('; ')}` : '') +
      '. Put the data in the first key (or delete the empty one); KubeVirt fails this VMI the same way',
    { kind: 'terminal', field },
  );
}
