// A seed's files in ConfigDrive v2's layout (`openstack/latest/...`), for
// the OpenStack metadata paths served over HTTP. A ConfigDrive seed is
// taken as it is: the same bytes its image holds (seed-files.ts). A NoCloud
// seed (KubeVirt IMDS's, or a vmseed VMI's) is converted the way the
// renderer would have written it for ConfigDrive: meta-data keys under
// their ConfigDrive names (metadata.ts), vendor-data wrapped as
// vendor_data.json, network-config converted to network_data.json. Pure.
import { metaDataBytes, serializeMetaData, CONFIGDRIVE_DIR } from './seed-files.ts';
import type { Seed } from './seed.ts';
import { convertNetworkConfigToNetworkData } from './network/convert-v1v2-to-nwdata.ts';
import { vendorDataFile } from './userdata/vendor-data.ts';
import { isPlainObject, parseYaml } from './yaml.ts';

/** A seed's files under their ConfigDrive v2 names (relative to openstack/latest/). */
export interface ConfigDriveFiles {
  'meta_data.json': Uint8Array;
  user_data: Uint8Array;
  'network_data.json'?: Uint8Array;
  'vendor_data.json'?: Uint8Array;
}

const utf8 = (s: string) => new Uint8Array(Buffer.from(s, 'utf8'));

/**
 * The seed's files as the OpenStack metadata paths serve them (header). Pure and never throws:
 * network config or vendor-data that has no ConfigDrive form is left out.
 */
export function configDriveView(seed: Seed): ConfigDriveFiles {
  if (seed.datasource === 'configdrive') return fromImage(seed);
  const out: ConfigDriveFiles = { 'meta_data.json': metaDataJson(seed), user_data: seed.userData };
  const network = networkData(seed.networkConfig);
  if (network) out['network_data.json'] = network;
  const vendor = vendorData(seed.vendorData);
  if (vendor) out['vendor_data.json'] = vendor;
  return out;
}

function fromImage(seed: Seed): ConfigDriveFiles {
  const out: ConfigDriveFiles = { 'meta_data.json': metaDataBytes(seed), user_data: seed.userData };
  for (const f of serializeMetaData(seed)) {
    const name = f.path.slice(CONFIGDRIVE_DIR.length + 1);
    if (name === 'network_data.json' || name === 'vendor_data.json') out[name] = f.bytes;
  }
  return out;
}

// The NoCloud keys as metadata.ts names them for ConfigDrive. `uuid` is
// what cloud-init's reader requires and takes the instance-id from. An
// IMDS seed (delivery http) also gets IMDS's own `name` key.
function metaDataJson(seed: Seed): Uint8Array {
  const m = seed.metaData;
  const id = m['instance-id'];
  const host = m['local-hostname'];
  const out: Record<string, unknown> = { uuid: id, instance_id: id, hostname: host };
  if (seed.delivery === 'http') out.name = host;
  if (m['instance-type'] !== undefined) out.instance_type = m['instance-type'];
  if (m['public-keys'] !== undefined) out.public_keys = m['public-keys'];
  return utf8(JSON.stringify(out));
}

// Network config the converter refuses (or that is not YAML) is left out:
// the guest falls back to DHCP, as with no network config at all.
function networkData(bytes: Uint8Array | undefined): Uint8Array | undefined {
  if (!bytes || bytes.length === 0) return undefined;
  const parsed = parseYaml(Buffer.from(bytes).toString('utf8'));
  if (!parsed.ok || !isPlainObject(parsed.value)) return undefined;
  try {
    return convertNetworkConfigToNetworkData(parsed.value, 'network-config');
  } catch {
    return undefined;
  }
}

// Binary vendor-data has no JSON form: left out.
function vendorData(bytes: Uint8Array | undefined): Uint8Array | undefined {
  if (!bytes || bytes.length === 0) return undefined;
  try {
    return vendorDataFile(bytes, 'configdrive', 'vendor-data');
  } catch {
    return undefined;
  }
}
