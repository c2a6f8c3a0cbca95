// network-config checks. NoCloud takes cloud-init network config v1 or v2
// YAML, bare or under "network:" (bare is what older guests read). ConfigDrive
// takes OpenStack network_data.json; a YAML v1/v2 document there is a
// mistake we name (conversion is a separate feature).
import { VmseedError } from '../errors.ts';
import type { Datasource } from './seed.ts';
import { isPlainObject, parseYaml, where } from './yaml.ts';

function invalid(field: string, message: string): VmseedError {
  return new VmseedError('NETWORKDATA_INVALID', `${field}: ${message}`, { kind: 'terminal', field });
}

function yamlNetworkVersion(text: string): { version?: number; disabled?: boolean; doc?: Record<string, unknown>; error?: string } {
  const parsed = parseYaml(text, { allowDuplicateKeys: true });
  if (!parsed.ok) return { error: `is not valid YAML at ${where(parsed)} (${parsed.reason})` };
  let doc = parsed.value;
  if (!isPlainObject(doc)) return { error: 'must be a YAML mapping with "version: 1" or "version: 2"' };
  // cloud-init (stages.py _remove_top_level_network_key) takes "network" whenever present.
  if (Object.hasOwn(doc, 'network')) {
    doc = doc.network;
    if (!isPlainObject(doc)) return { error: '"network:" must be a mapping with "version: 1" or "version: 2"' };
  }
  const d = doc as Record<string, unknown>;
  // net.is_disabled_cfg: tells cloud-init to leave networking alone.
  if (d.config === 'disabled') return { disabled: true, doc: d };
  if (d.version !== 1 && d.version !== 2) {
    return { doc: d, error: 'must declare "version: 1" or "version: 2" (bare or under "network:")' };
  }
  return { version: d.version, doc: d };
}

function checkNoCloud(text: string, field: string): void {
  const r = yamlNetworkVersion(text);
  if (r.error && r.doc && (Array.isArray(r.doc.links) || Array.isArray(r.doc.networks))) {
    throw invalid(field, 'this is OpenStack network_data.json, which only datasource configdrive reads; use datasource ' +
      'configdrive or write network config version 1 or 2 YAML');
  }
  if (r.error) throw invalid(field, `network-config ${r.error}`);
  const doc = r.doc!;
  if (r.disabled) return;
  if (r.version === 1) {
    if (!Array.isArray(doc.config)) throw invalid(field, 'network-config version 1 needs a "config:" list of entries');
    doc.config.forEach((item, i) => {
      if (!isPlainObject(item) || typeof item.type !== 'string') {
        throw invalid(field, `network-config version 1 config[${i}] needs a "type" (physical, bond, bridge, vlan, nameserver, route)`);
      }
    });
  } else {
    for (const k of ['ethernets', 'bonds', 'bridges', 'vlans', 'wifis']) {
      if (doc[k] !== undefined && doc[k] !== null && !isPlainObject(doc[k])) {
        throw invalid(field, `network-config version 2 "${k}" must be a mapping of interface names`);
      }
    }
  }
}

function checkConfigDrive(text: string, field: string): void {
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
    if (json.links !== undefined || json.networks !== undefined) return;
  }
  const r = yamlNetworkVersion(text);
  if (r.version !== undefined) {
    throw new VmseedError(
      'NETWORKDATA_UNSUPPORTED_FOR_DATASOURCE',
      `${field}: network config version ${r.version} YAML works with datasource nocloud only; ConfigDrive needs ` +
        'OpenStack network_data.json (links, networks, services). Use datasource nocloud or write network_data.json',
      { kind: 'terminal', field },
    );
  }
  throw invalid(field, 'ConfigDrive network data must be an OpenStack network_data.json object with "links", "networks" and "services"');
}

export function lintNetworkData(data: Uint8Array, datasource: Datasource, field: string): void {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(data);
  } catch {
    throw invalid(field, 'network data is not UTF-8 text');
  }
  if (datasource === 'nocloud') checkNoCloud(text, field);
  else checkConfigDrive(text, field);
}
