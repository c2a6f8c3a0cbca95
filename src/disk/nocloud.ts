// NoCloud seed layout: files in the root of a volume labelled `cidata`.
// cloud-init skips a disk without both `user-data` and `meta-data` (either
// may be empty); `network-config` and `vendor-data` only when given.
// shared/specs.md part B §1.
import type { Seed } from '../cloudinit/seed.ts';
import type { IsoFile } from './iso9660.ts';
import { stableJsonBytes } from './json.ts';

export const NOCLOUD_LABEL = 'cidata';

export function nocloudFiles(seed: Seed): IsoFile[] {
  const files: IsoFile[] = [
    { path: 'meta-data', data: stableJsonBytes(seed.metaData) },
    { path: 'user-data', data: seed.userData },
  ];
  if (seed.networkConfig !== undefined) files.push({ path: 'network-config', data: seed.networkConfig });
  if (seed.vendorData !== undefined) files.push({ path: 'vendor-data', data: seed.vendorData });
  return files;
}
