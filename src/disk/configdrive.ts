// ConfigDrive v2 layout: `openstack/latest/` on a volume labelled
// `config-2`. cloud-init's reader rejects a drive whose meta_data.json has no
// `uuid` (it becomes the instance-id). Only `latest` is written: the reader
// falls back to it when no dated version directory exists.
// shared/specs.md part B §2.
import type { Seed } from '../cloudinit/seed.ts';
import { VmseedError } from '../errors.ts';
import type { IsoFile } from './iso9660.ts';
import { stableJsonBytes } from './json.ts';

export const CONFIGDRIVE_LABEL = 'config-2';
const DIR = 'openstack/latest/';

export function configdriveFiles(seed: Seed): IsoFile[] {
  const uuid = seed.metaData.uuid;
  if (typeof uuid !== 'string' || uuid === '') {
    throw new VmseedError(
      'METADATA_INVALID',
      'metaData.uuid: ConfigDrive meta_data.json needs a non-empty string uuid (cloud-init uses it as the instance-id); set it or use the nocloud datasource',
      { field: 'metaData.uuid' },
    );
  }
  const files: IsoFile[] = [
    { path: `${DIR}meta_data.json`, data: stableJsonBytes(seed.metaData) },
    { path: `${DIR}user_data`, data: seed.userData },
  ];
  if (seed.networkConfig !== undefined) files.push({ path: `${DIR}network_data.json`, data: seed.networkConfig });
  if (seed.vendorData !== undefined) files.push({ path: `${DIR}vendor_data.json`, data: seed.vendorData });
  return files;
}
