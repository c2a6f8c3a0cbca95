// NoCloud seed layout: files in the root of a volume labelled `cidata`.
// Which files and their bytes are decided once, in cloudinit/seed-files.ts,
// so the image and the HTTP datasource can never disagree.
// cloud-init doc/rtd/reference/datasources/nocloud.rst and
// cloudinit/sources/DataSourceNoCloud.py (label cidata, files in the root).
import type { Seed } from '../cloudinit/seed.ts';
import { serializeMetaData } from '../cloudinit/seed-files.ts';
import type { IsoFile } from './iso9660.ts';

export const NOCLOUD_LABEL = 'cidata';

export function nocloudFiles(seed: Seed): IsoFile[] {
  return serializeMetaData(seed).map((f) => ({ path: f.path, data: f.bytes }));
}
