// Network data on a KubeVirt volume that vmseed cannot parse or convert.
//
// KubeVirt copies networkData / networkDataBase64 / networkDataSecretRef bytes
// unchanged into `network-config` (NoCloud) or
// `openstack/latest/network_data.json` (ConfigDrive): pkg/cloud-init/
// cloud-init.go, GenerateLocalData. Its own e2e tests use strings that are
// neither v1/v2 YAML nor network_data.json (tests/vmi_cloudinit_test.go:
// "#Test networkData", `{"config":"test networkData"}`). Refusing such data
// would leave the guest without its user-data and SSH keys, so for volumes
// vmseed writes the bytes as given and says what cloud-init will do with them.
//
// What cloud-init 22.4 does, from its code:
// - NoCloud: util.load_yaml(network-config) returns None for anything that is
//   not a YAML mapping (sources/DataSourceNoCloud.py), so the datasource has
//   no network config and cloud-init uses its fallback (DHCP on the first
//   NIC). A mapping without a usable "version" makes the init-local stage
//   fail (distros/networking.py extract_physdevs: "Unknown network config
//   version"; cloud-init-local.service fails) and networking stays as the
//   image sets it up; the later stages still apply user-data (seen on a
//   Debian 12 guest: e2e/guest-debian-kubevirt-network.test.ts).
// - ConfigDrive: network_data.json is loaded with util.load_json
//   (sources/helpers/openstack.py read_v2); text that is not JSON raises
//   BrokenMetadata for the whole drive, so neither user-data nor keys are
//   read. JSON is read, and convert_net_json turns it into whatever
//   "links"/"networks" it has (none: an empty network config).
import type { Datasource } from '../../api/objects.ts';
import { VmseedError } from '../../errors.ts';
import type { SeedWarning } from '../seed.ts';
import { isPlainObject, parseYaml } from '../yaml.ts';

// The error codes lintNetworkData throws that a volume turns into warnings.
const PASSABLE = new Set([
  'NETWORKDATA_INVALID',
  'NETWORK_CONVERSION_UNSUPPORTED',
  'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE',
]);

/** Whether a network-data error is one a KubeVirt volume turns into a warning, its bytes written as given. */
export function isPassableNetworkError(e: unknown): e is VmseedError {
  return e instanceof VmseedError && PASSABLE.has(e.code);
}

function isJson(text: string): boolean {
  try {
    JSON.parse(text);
    return true;
  } catch {
    return false;
  }
}

function guestOutcome(bytes: Uint8Array, datasource: Datasource): string {
  let text: string | undefined;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(bytes);
  } catch {
    text = undefined;
  }
  if (datasource === 'configdrive') {
    if (text !== undefined && isJson(text)) {
      return (
        'cloud-init reads it as JSON and configures only the "links"/"networks" it finds in it (none: no network ' +
        'config); user-data is still applied'
      );
    }
    return (
      "cloud-init's ConfigDrive reader needs network_data.json to be JSON and rejects the whole drive otherwise " +
      '("Failed to process path …/network_data.json"), so the guest gets neither user-data nor SSH keys from this seed, ' +
      'as under KubeVirt. Give OpenStack network_data.json, or network-config v1/v2 that vmseed can convert'
    );
  }
  const parsed = text === undefined ? undefined : parseYaml(text, { allowDuplicateKeys: true });
  if (parsed && parsed.ok && isPlainObject(parsed.value)) {
    return (
      'cloud-init\'s init-local stage fails on it ("Unknown network config version") and networking stays as the image ' +
      'sets it up; the later stages still apply user-data'
    );
  }
  return (
    'cloud-init ignores a network-config that is not a YAML mapping and uses its fallback (DHCP on the first NIC); ' +
    'user-data is still applied'
  );
}

/**
 * The warning for network data kept as given after error `e`: it names the field, what vmseed
 * could not do, and what the guest's cloud-init will make of the bytes.
 */
export function passThroughWarning(
  e: VmseedError,
  bytes: Uint8Array,
  datasource: Datasource,
  field: string,
): SeedWarning {
  const code = e.code === 'NETWORKDATA_INVALID' ? 'NETWORKDATA_UNPARSED' : 'NETWORK_CONVERSION_UNSUPPORTED';
  const file = datasource === 'nocloud' ? 'network-config' : 'openstack/latest/network_data.json';
  return {
    code,
    message: `${e.message}. Written to ${file} as given, as KubeVirt does: ${guestOutcome(bytes, datasource)}`,
    field,
  };
}
