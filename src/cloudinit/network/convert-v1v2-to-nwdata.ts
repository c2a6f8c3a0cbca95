// network-config v1/v2 given for a ConfigDrive → network_data.json, when
// that is lossless (see read-v1v2.ts and emit-nwdata.ts for what is refused).
import { VmseedError } from '../../errors.ts';
import { modelToNetworkData, networkDataBytes } from './emit-nwdata.ts';
import type { NetModel } from './model.ts';
import { networkConfigToModel } from './read-v1v2.ts';

const same = (a: string[], b: string[]) => a.length === b.length && a.every((x, i) => x === b[i]);

// network_data.json has only global DNS. Per-interface DNS moves there when
// every interface that sets DNS sets the same servers and search domains
// (what cloud-init's renderers make of it is then the same); otherwise the
// difference cannot be kept, so it is refused.
export function hoistDns(model: NetModel, field: string): NetModel {
  const withDns = model.interfaces.filter((n) => n.dnsServers.length > 0 || n.dnsSearch.length > 0);
  if (withDns.length === 0) return model;
  const first = withDns[0];
  for (const n of withDns.slice(1)) {
    if (!same(n.dnsServers, first.dnsServers) || !same(n.dnsSearch, first.dnsSearch)) {
      throw new VmseedError(
        'NETWORK_CONVERSION_UNSUPPORTED',
        `${field}: interfaces "${first.id}" and "${n.id}" set different DNS servers or search domains; ` +
          'network_data.json (ConfigDrive) has only global DNS. Use the same nameservers everywhere or datasource nocloud',
        { kind: 'terminal', field },
      );
    }
  }
  const uniq = (xs: string[]) => [...new Set(xs)];
  return {
    interfaces: model.interfaces.map((n) => ({ ...n, dnsServers: [], dnsSearch: [] })),
    dns: {
      servers: uniq([...model.dns.servers, ...first.dnsServers]),
      search: uniq([...model.dns.search, ...first.dnsSearch]),
    },
  };
}

/**
 * Parsed network-config v1/v2 as network_data.json bytes; `field` names it in messages. Throws
 * terminal VmseedError NETWORKDATA_INVALID, or NETWORK_CONVERSION_UNSUPPORTED for what
 * network_data.json cannot express.
 */
export function convertNetworkConfigToNetworkData(doc: Record<string, unknown>, field: string): Uint8Array {
  const model = hoistDns(networkConfigToModel(doc, field), field);
  const ids = model.interfaces.map((n) => n.id);
  const itemField = (i: number) => (doc.version === 1 ? `${field}.config[${i}]` : `${field}.ethernets.${ids[i]}`);
  return networkDataBytes(modelToNetworkData(model, itemField, field));
}
