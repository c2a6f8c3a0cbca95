// Which files the NoCloud HTTP datasource serves, and their bytes.
import type { Seed } from '../cloudinit/seed.ts';
import { metaDataBytes } from '../cloudinit/seed-files.ts';

export const DATASOURCE_FILES = ['meta-data', 'user-data', 'vendor-data', 'network-config'] as const;
/** One of the NoCloud files the datasource serves, by name. */
export type DatasourceFile = (typeof DATASOURCE_FILES)[number];

export function isDatasourceFile(s: string): s is DatasourceFile {
  return (DATASOURCE_FILES as readonly string[]).includes(s);
}

// The bytes of one file of a seed, or undefined when the seed lacks it (the
// server answers 404, and cloud-init falls back: DHCP for network-config,
// nothing for vendor-data). Only NoCloud seeds are served: a ConfigDrive
// image has no `meta-data`/`user-data` files and its network data is
// OpenStack JSON, not NoCloud network-config.
export function seedFileBytes(seed: Seed, file: DatasourceFile): Uint8Array | undefined {
  if (seed.datasource !== 'nocloud') return undefined;
  switch (file) {
    case 'meta-data':
      // The same bytes as the image's meta-data file.
      return metaDataBytes(seed);
    case 'user-data':
      return seed.userData;
    case 'vendor-data':
      return seed.vendorData;
    case 'network-config':
      return seed.networkConfig;
  }
}
