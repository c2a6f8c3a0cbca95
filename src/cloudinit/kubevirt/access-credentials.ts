// spec.accessCredentials[].sshPublicKey propagated through the seed, as
// KubeVirt's resolveSSHPublicKeys does: credentials in spec order, only those
// whose propagationMethod matches the datasource, every non-empty key of each
// Secret in the Secret's sorted key order, numbered "0", "1", … across all.
import type { RefResolver, VmiObject, Datasource } from '../../api/objects.ts';
import { secretKeys, secretValue } from '../refs/secret-data.ts';
import { fetchObject } from '../refs/object-refs.ts';
import { checkListLength, LIMITS, listTooLong } from '../limits.ts';

/**
 * The public keys the VMI's accessCredentials propagate to `datasource`, keyed "0", "1", … for
 * meta-data. Throws VmseedError: SECRET_NOT_FOUND (retryable), LIST_TOO_LONG past
 * LIMITS.accessCredentials or LIMITS.sshKeys, SECRET_DATA_INVALID.
 */
export async function resolvePublicKeys(
  vmi: VmiObject,
  datasource: Datasource,
  refs: RefResolver,
): Promise<Record<string, string>> {
  const keys: Record<string, string> = {};
  let n = 0;
  const ns = vmi.metadata.namespace ?? 'default';
  const creds = vmi.spec?.accessCredentials ?? [];
  checkListLength(creds, LIMITS.accessCredentials, 'spec.accessCredentials');
  for (let i = 0; i < creds.length; i++) {
    const ssh = creds[i]?.sshPublicKey;
    if (!ssh) continue;
    const method = ssh.propagationMethod ?? {};
    const matches = datasource === 'nocloud' ? method.noCloud != null : method.configDrive != null;
    if (!matches) continue;
    const name = ssh.source?.secret?.secretName;
    if (!name) continue;
    const field = `spec.accessCredentials[${i}].sshPublicKey.source.secret.secretName`;
    const secret = await fetchObject(refs, 'Secret', ns, name, field);
    for (const key of secretKeys(secret)) {
      const value = secretValue(secret, key);
      if (!value || value.length === 0) continue;
      if (n >= LIMITS.sshKeys) throw listTooLong(field, n + 1, LIMITS.sshKeys);
      keys[String(n++)] = Buffer.from(value).toString('utf8');
    }
  }
  return keys;
}
