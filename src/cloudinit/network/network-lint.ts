// network-config checks. NoCloud takes cloud-init network config v1 or v2
// YAML, bare or under "network:" (bare is what older guests read). ConfigDrive
// takes OpenStack network_data.json. Each is converted to the other's format
// when given for the wrong datasource (src/cloudinit/network/).
import type { Datasource } from '../../api/objects.ts';
import { VmseedError } from '../../errors.ts';
import { isPlainObject, parseYaml, where } from '../yaml.ts';
import { convertNetworkConfigToNetworkData } from './convert-v1v2-to-nwdata.ts';
import { convertNetworkDataToV2 } from './convert-nwdata-to-v2.ts';

function invalid(field: string, message: string): VmseedError {
  return new VmseedError('NETWORKDATA_INVALID', `${field}: ${message}`, { kind: 'terminal', field });
}

function yamlNetworkVersion(
  text: string,
  field: string,
): { version?: number; disabled?: boolean; doc?: Record<string, unknown>; error?: string } {
  const parsed = parseYaml(text, { allowDuplicateKeys: true, field });
  if (!parsed.ok) return { error: `is not valid YAML at ${where(parsed)} (${parsed.reason})` };
  let doc = parsed.value;
  if (!isPlainObject(doc)) return { error: 'must be a YAML mapping with "version: 1" or "version: 2"' };
  // cloud-init (stages.py _remove_top_level_network_key) takes "network" whenever present.
  if (Object.hasOwn(doc, 'network')) {
    doc = doc.network;
    if (!isPlainObject(doc)) return { error: '"network:" must be a mapping with "version: 1" or "version: 2"' };
  }
  const d = doc;
  // net.is_disabled_cfg: tells cloud-init to leave networking alone.
  if (d.config === 'disabled') return { disabled: true, doc: d };
  if (d.version !== 1 && d.version !== 2) {
    return { doc: d, error: 'must declare "version: 1" or "version: 2" (bare or under "network:")' };
  }
  return { version: d.version, doc: d };
}

function checkNoCloud(text: string, field: string): Uint8Array | undefined {
  const r = yamlNetworkVersion(text, field);
  if (r.error && r.doc && (Array.isArray(r.doc.links) || Array.isArray(r.doc.networks))) {
    // OpenStack network_data.json (JSON is YAML): NoCloud does not read it,
    // so it is converted to v2 with the meaning cloud-init gives it.
    return convertNetworkDataToV2(r.doc, field);
  }
  if (r.error) throw invalid(field, `network-config ${r.error}`);
  const doc = r.doc!;
  if (r.disabled) return undefined;
  if (r.version === 1) {
    if (!Array.isArray(doc.config)) throw invalid(field, 'network-config version 1 needs a "config:" list of entries');
    doc.config.forEach((item, i) => {
      if (!isPlainObject(item) || typeof item.type !== 'string') {
        throw invalid(
          field,
          `network-config version 1 config[${i}] needs a "type" (physical, bond, bridge, vlan, nameserver, route)`,
        );
      }
    });
  } else {
    for (const k of ['ethernets', 'bonds', 'bridges', 'vlans', 'wifis']) {
      if (doc[k] !== undefined && doc[k] !== null && !isPlainObject(doc[k])) {
        throw invalid(field, `network-config version 2 "${k}" must be a mapping of interface names`);
      }
    }
  }
  return undefined;
}

function checkConfigDrive(text: string, field: string): Uint8Array | undefined {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch {
    json = undefined;
  }
  if (isPlainObject(json)) {
    for (const k of ['links', 'networks', 'services']) {
      if (json[k] !== undefined && !Array.isArray(json[k])) {
        throw invalid(field, `network_data.json "${k}" must be a list`);
      }
    }
    if (json.links !== undefined || json.networks !== undefined) return undefined;
  }
  const r = yamlNetworkVersion(text, field);
  if (r.version !== undefined) {
    checkNoCloud(text, field);
    return convertNetworkConfigToNetworkData(r.doc!, field);
  }
  if (r.disabled) {
    throw new VmseedError(
      'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE',
      `${field}: "config: disabled" has no network_data.json form; a ConfigDrive without network data already leaves ` +
        'networking to the image (DHCP on the first NIC). Remove the network data',
      { kind: 'terminal', field },
    );
  }
  throw invalid(
    field,
    'ConfigDrive network data must be an OpenStack network_data.json object with "links", "networks" and "services"',
  );
}

// Checks network data for the datasource and returns what the seed must hold:
// the same bytes, or the conversion (v1/v2 → network_data.json for
// ConfigDrive, network_data.json → v2 for NoCloud).
export function lintNetworkData(data: Uint8Array, datasource: Datasource, field: string): Uint8Array {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(data);
  } catch {
    throw invalid(field, 'network data is not UTF-8 text');
  }
  const converted = datasource === 'nocloud' ? checkNoCloud(text, field) : checkConfigDrive(text, field);
  return converted ?? data;
}
