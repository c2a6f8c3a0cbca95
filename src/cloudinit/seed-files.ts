// The one place that decides file names and bytes inside a seed image, used by
// the disk layout, the NoCloud HTTP datasource and the tests alike.
import type { Seed } from './seed.ts';

export interface SeedFile {
  // Relative to the image root, '/'-separated, no leading slash.
  path: string;
  bytes: Uint8Array;
}

export const CONFIGDRIVE_DIR = 'openstack/latest';

/**
 * The meta-data file: compact JSON (JSON.stringify, no trailing newline), as KubeVirt's
 * json.Marshal writes it, unless the user's own file is kept (metaDataRaw).
 */
export function metaDataBytes(seed: Seed): Uint8Array {
  if (seed.metaDataRaw) return seed.metaDataRaw;
  return new Uint8Array(Buffer.from(JSON.stringify(seed.metaData), 'utf8'));
}

/**
 * Every file of the seed, in a stable order. NoCloud (KubeVirt layout): meta-data, user-data
 * (always, even empty; cloud-init requires both), network-config and vendor-data when present.
 * ConfigDrive v2: openstack/latest/{meta_data.json,user_data,network_data.json,vendor_data.json}.
 */
export function serializeMetaData(seed: Seed): SeedFile[] {
  const files: SeedFile[] = [];
  if (seed.datasource === 'nocloud') {
    files.push({ path: 'meta-data', bytes: metaDataBytes(seed) });
    files.push({ path: 'user-data', bytes: seed.userData });
    if (seed.networkConfig && seed.networkConfig.length > 0)
      files.push({ path: 'network-config', bytes: seed.networkConfig });
    if (seed.vendorData && seed.vendorData.length > 0) files.push({ path: 'vendor-data', bytes: seed.vendorData });
  } else {
    files.push({ path: `${CONFIGDRIVE_DIR}/meta_data.json`, bytes: metaDataBytes(seed) });
    files.push({ path: `${CONFIGDRIVE_DIR}/user_data`, bytes: seed.userData });
    if (seed.networkConfig && seed.networkConfig.length > 0)
      files.push({ path: `${CONFIGDRIVE_DIR}/network_data.json`, bytes: seed.networkConfig });
    if (seed.vendorData && seed.vendorData.length > 0)
      files.push({ path: `${CONFIGDRIVE_DIR}/vendor_data.json`, bytes: seed.vendorData });
  }
  return files;
}
