// Which files the NoCloud HTTP datasource serves, and their bytes.
import type { Seed } from '../cloudinit/seed.ts';

export const DATASOURCE_FILES = ['meta-data', 'user-data', 'vendor-data', 'network-config'] as const;
export type DatasourceFile = (typeof DATASOURCE_FILES)[number];

export function isDatasourceFile(s: string): s is DatasourceFile {
  return (DATASOURCE_FILES as readonly string[]).includes(s);
}

// TEMPORARY, single place to swap: the NoCloud `meta-data` serialisation.
// It must be byte-for-byte what the disk layout writes into the image; that
// function is to come from src/cloudinit/seed-files.ts (branch `cloudinit`),
// which did not exist when this was written. Until the lead replaces this
// body with a call to it, meta-data is JSON (valid YAML, which cloud-init
// loads with safeyaml), pretty-printed, with a final newline, following the
// Seed contract ("Serialised as JSON").
export function serialiseNoCloudMetaData(metaData: Record<string, unknown>): Uint8Array {
  return new TextEncoder().encode(JSON.stringify(metaData, null, 2) + '\n');
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
      return serialiseNoCloudMetaData(seed.metaData);
    case 'user-data':
      return seed.userData;
    case 'vendor-data':
      return seed.vendorData;
    case 'network-config':
      return seed.networkConfig;
  }
}
