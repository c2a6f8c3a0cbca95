// The rendered seed: what src/cloudinit produces and src/disk lays out.
// Plain data, so it can be hashed, compared, served over HTTP and written.

import type { Datasource } from '../api/objects.ts';
import type { SchemaWarningInfo } from '../status/snapshot.ts';

/** Every datasource a seed can be written for. */
export const DATASOURCES: readonly Datasource[] = ['nocloud', 'configdrive'];

/** A problem that does not stop the seed, reported to the VMI's owner (an Event, the status page). */
export interface SeedWarning {
  code:
    | 'USERDATA_NO_HEADER'
    | 'USERDATA_CLOUDCONFIG_INVALID'
    | 'VENDORDATA_NO_HEADER'
    | 'KUBEVIRT_VOLUME_CONFLICT'
    | 'ADOPTION_SKIPPED'
    | 'SEEDED_AFTER_BOOT'
    | 'NETWORKDATA_UNPARSED'
    | 'NETWORK_CONVERSION_UNSUPPORTED'
    | 'KUBEVIRT_INLINE_LIMIT'
    | 'DEVICE_METADATA_INCOMPLETE'
    | 'CLOUD_INIT_VERSION_UNKNOWN'
    | 'CLOUDCONFIG_SCHEMA'
    | 'CLOUDCONFIG_DEPRECATED'
    | 'CLOUDCONFIG_UNCHECKED'
    | 'CLOUDCONFIG_SCHEMA_BUDGET';
  message: string;
  field?: string;
  // CLOUDCONFIG_SCHEMA / CLOUDCONFIG_DEPRECATED: where the problem is, for
  // the status page and the metrics (names and paths only, never values).
  schema?: SchemaWarningInfo;
}

/** A rendered seed; seed-files.ts decides its file names and bytes. */
export interface Seed {
  datasource: Datasource;
  // Serialised as JSON: `meta-data` (NoCloud) or `openstack/latest/meta_data.json`
  // (ConfigDrive, where it must contain `uuid`).
  metaData: Record<string, unknown>;
  // The meta-data file exactly as a user gave it (`vmseed build --meta-data`,
  // like cloud-localds), when nothing was generated or merged into it; it
  // replaces the JSON serialisation of metaData, which still describes it.
  metaDataRaw?: Uint8Array;
  // Bytes as the guest must see them (may be gzip, MIME, a script...).
  userData: Uint8Array;
  // NoCloud: network-config YAML (v1/v2). ConfigDrive: network_data.json text.
  networkConfig?: Uint8Array;
  // NoCloud: vendor-data. ConfigDrive: vendor_data.json text.
  vendorData?: Uint8Array;
  // 'http': served by the NoCloud HTTP datasource only, no seed image
  // (KubeVirt IMDS-annotated VMIs, see annotation/imds-annotations.ts).
  delivery?: 'http';
  // Why the seed carries no progress-reporting part though the render was
  // given a report URL (userdata/reporting-config.ts).
  progressNotReported?: string;
  // The user-data is Cluster API bootstrap data writing its sentinel file
  // (userdata/bootstrap-sentinel.ts): as runcmd's last command, or where a
  // finished boot does not prove it was written. Absent: no sentinel.
  bootstrapSentinel?: 'last' | 'elsewhere';
  warnings: SeedWarning[];
}
