// Virtlet's SSH keys (VirtletSSHKeys, VirtletSSHKeySource): `sshKeysFrom`
// (default key `authorized_keys`, one key per line) then `sshKeys`, appended
// to the public keys from accessCredentials and numbered on from there, so
// they land in meta-data `public-keys` / `public_keys` as KubeVirt's do.
import type { RefResolver } from '../../api/objects.ts';
import { readObjectKey, type ObjectRef } from '../refs/object-refs.ts';
import { LIMITS, listTooLong } from '../limits.ts';

export const SSH_KEYS_DEFAULT_KEY = 'authorized_keys';

export function splitAuthorizedKeys(text: string): string[] {
  return text
    .split(/\r?\n/)
    .map((l) => l.trim())
    .filter((l) => l !== '' && !l.startsWith('#'));
}

/**
 * `base` (accessCredentials' keys) with sshKeysFrom's keys, then `inline`, numbered on after it.
 * Throws terminal LIST_TOO_LONG past LIMITS.sshKeys, and readObjectKey's errors.
 */
export async function appendSshKeys(
  base: Record<string, string>,
  inline: readonly string[],
  from: ObjectRef | undefined,
  namespace: string,
  refs: RefResolver,
  prefix: string,
): Promise<Record<string, string>> {
  const keys: string[] = [];
  if (from) {
    const bytes = await readObjectKey(refs, namespace, from, `${prefix}.sshKeysFrom`, SSH_KEYS_DEFAULT_KEY);
    keys.push(...splitAuthorizedKeys(Buffer.from(bytes).toString('utf8')));
  }
  keys.push(...inline);
  let n = Object.keys(base).length;
  if (n + keys.length > LIMITS.sshKeys) {
    throw listTooLong(from ? `${prefix}.sshKeysFrom` : `${prefix}.sshKeys`, n + keys.length, LIMITS.sshKeys);
  }
  const out = { ...base };
  for (const k of keys) out[String(n++)] = k;
  return out;
}
