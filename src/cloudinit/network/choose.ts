// Which network config a seed carries, in order: `forceDHCP` (Virtlet),
// `init.nics` (oVirt), else the network data the user gave (checked, and
// converted when it is in the other datasource's format). The first two are
// generated, so combining either with given network data is a conflict.
import { VmseedError } from '../../errors.ts';
import type { VmiObject, Datasource } from '../../api/objects.ts';
import { lintNetworkData } from './network-lint.ts';
import { modelToNetworkData, networkDataBytes } from './emit-nwdata.ts';
import { modelToV2Bytes, withGlobalDnsOnInterfaces } from './emit-v2.ts';
import { forcedDhcpNetwork } from './force-dhcp.ts';
import type { NetModel } from './model.ts';

export interface NetworkChoice {
  vmi: VmiObject;
  datasource: Datasource;
  // Field prefix of the vmseed annotation, for messages.
  prefix: string;
  forceDHCP: boolean;
  initNetwork?: NetModel;
  given?: { bytes: Uint8Array; field: string };
}

/**
 * The seed's network config in the datasource's format, or undefined for none (order in the
 * header). Pure (a PURE_OPS step). Throws terminal VmseedError: NETWORKDATA_SOURCE_CONFLICT, or
 * what lintNetworkData refuses in the given data.
 */
export function chooseNetworkConfig(c: NetworkChoice): Uint8Array | undefined {
  if ((c.forceDHCP || c.initNetwork) && c.given) {
    const which = c.forceDHCP ? `${c.prefix}.forceDHCP` : `${c.prefix}.init.nics`;
    throw new VmseedError(
      'NETWORKDATA_SOURCE_CONFLICT',
      `${which} and ${c.given.field} both set the network config; keep one`,
      { kind: 'terminal', field: which },
    );
  }
  if (c.forceDHCP) return forcedDhcpNetwork(c.vmi, c.datasource);
  if (c.initNetwork) {
    return c.datasource === 'nocloud'
      ? modelToV2Bytes(withGlobalDnsOnInterfaces(c.initNetwork))
      : networkDataBytes(
          modelToNetworkData(c.initNetwork, (i) => `${c.prefix}.init.nics[${i}]`, `${c.prefix}.init.dns.search`),
        );
  }
  if (c.given) return lintNetworkData(c.given.bytes, c.datasource, c.given.field);
  return undefined;
}
