// ConfigDrive v2 layout: `openstack/latest/` on a volume labelled
// `config-2`. cloud-init's reader rejects a drive whose meta_data.json has no
// `uuid` (it becomes the instance-id). Only `latest` is written: the reader
// falls back to it when no dated version directory exists.
// cloud-init cloudinit/sources/helpers/openstack.py ConfigDriveReader.read_v2
// (KEY_COPIES: uuid -> instance-id) and doc/rtd/reference/datasources/configdrive.rst.
import type { Seed } from '../cloudinit/seed.ts';
import { VmseedError } from '../errors.ts';
import type { IsoFile } from './iso9660.ts';
import { serializeMetaData } from '../cloudinit/seed-files.ts';

export const CONFIGDRIVE_LABEL = 'config-2';

export function configdriveFiles(seed: Seed): IsoFile[] {
  const uuid = seed.metaData.uuid;
  if (typeof uuid !== 'string' || uuid === '') {
    throw new VmseedError(
      'METADATA_INVALID',
      'metaData.uuid: ConfigDrive meta_data.json needs a non-empty string uuid (cloud-init uses it as the instance-id); set it or use the nocloud datasource',
      { field: 'metaData.uuid' },
    );
  }
  return serializeMetaData(seed).map((f) => ({ path: f.path, data: f.bytes }));
}
