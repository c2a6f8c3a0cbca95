// Reading values out of Secrets the way a pod sees them when the Secret is
// mounted: `data` is base64 on the wire; `stringData` only appears in local
// manifests and, as on the API server, wins over `data` for the same key.
import { VmseedError } from '../../errors.ts';
import { decodeBase64Strict } from '../base64.ts';
import type { SecretObject } from '../../api/objects.ts';

/** The Secret's keys (data and stringData), sorted as KubeVirt lists the mounted Secret. */
export function secretKeys(secret: SecretObject): string[] {
  const keys = new Set<string>([...Object.keys(secret.data ?? {}), ...Object.keys(secret.stringData ?? {})]);
  // KubeVirt lists the mounted Secret with os.ReadDir, which sorts file names
  // bytewise; localeCompare would not.
  return [...keys].sort((a, b) => Buffer.compare(Buffer.from(a), Buffer.from(b)));
}

/** Whether the Secret has `key`, in stringData or data, empty or not. */
export function hasSecretKey(secret: SecretObject, key: string): boolean {
  return (
    (secret.stringData !== undefined && Object.hasOwn(secret.stringData, key)) ||
    (secret.data !== undefined && Object.hasOwn(secret.data, key))
  );
}

/**
 * The bytes of `key` (stringData wins over data), or undefined when the Secret has no such key.
 * Throws terminal SECRET_DATA_INVALID when the data value is not strict base64.
 */
export function secretValue(secret: SecretObject, key: string): Uint8Array | undefined {
  if (secret.stringData && Object.hasOwn(secret.stringData, key)) {
    return new Uint8Array(Buffer.from(String(secret.stringData[key]), 'utf8'));
  }
  if (secret.data && Object.hasOwn(secret.data, key)) {
    const decoded = decodeBase64Strict(String(secret.data[key] ?? ''));
    if (!decoded.ok) {
      const ns = secret.metadata.namespace ?? 'default';
      throw new VmseedError(
        'SECRET_DATA_INVALID',
        `Secret ${ns}/${secret.metadata.name} key "${key}" in data is not valid base64 (${decoded.reason}); ` +
          'put base64 in data or plain text in stringData',
        { kind: 'terminal', field: `secret/${secret.metadata.name}.data.${key}` },
      );
    }
    return decoded.bytes;
  }
  return undefined;
}
