// Virtlet's files from ConfigMaps and Secrets (VirtletFilesFromDataSource and
// its mounted-volume write_files): each `files[]` entry becomes write_files
// entries. With `key`, `path` is the file; without, `path` is a directory and
// every key of the object a file in it, in the object's sorted key order.
// Content is always base64 (b64): any bytes survive YAML, and Secret values
// are not readable at a glance in the seed. Permissions default to 0644 for
// ConfigMaps and 0600 for Secrets, as Virtlet writes them.
// Each entry is charged to the render's user-data budget before its base64
// is made, and the resolver the render passes fetches each object once.
import { VmseedError } from '../../errors.ts';
import type { FileSpec } from '../annotation/extras.ts';
import type { RefResolver } from '../../api/objects.ts';
import { readObject } from '../refs/object-refs.ts';
import { base64EncodedLength, type SeedBudget } from '../limits.ts';

/**
 * The `files[]` entries as cloud-init write_files entries (header). Throws VmseedError:
 * REFERENCE_KEY_INVALID for a key that cannot be a file name, USERDATA_TOO_LARGE from `budget`,
 * and readObject's errors.
 */
export async function filesToWriteFiles(
  files: readonly FileSpec[],
  namespace: string,
  refs: RefResolver,
  prefix: string,
  budget?: SeedBudget,
): Promise<Record<string, unknown>[]> {
  const out: Record<string, unknown>[] = [];
  for (let i = 0; i < files.length; i++) {
    const f = files[i];
    const field = `${prefix}.files[${i}].from`;
    const entries = await readObject(refs, namespace, f.from, field);
    const permissions = f.permissions ?? (f.from.kind === 'secret' ? '0600' : '0644');
    for (const e of entries) {
      if (f.from.key === undefined && (e.key.includes('/') || e.key === '..' || e.key === '.')) {
        throw new VmseedError(
          'REFERENCE_KEY_INVALID',
          `${field}: key "${e.key}" cannot be a file name; rename the key or set files[${i}].from.key`,
          { kind: 'terminal', field },
        );
      }
      const path = f.from.key === undefined ? `${f.path.replace(/\/+$/, '')}/${e.key}` : f.path;
      // Charged before the base64 text is made: every entry's content ends
      // up in user-data, so the sum is a floor of its size.
      budget?.userData(base64EncodedLength(e.bytes.length) + path.length, `${prefix}.files[${i}]`);
      out.push({ path, permissions, encoding: 'b64', content: Buffer.from(e.bytes).toString('base64') });
    }
  }
  return out;
}
