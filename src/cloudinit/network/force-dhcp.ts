// Virtlet's VirtletForceDHCPNetworkConfig as `forceDHCP: true`: whatever
// network config would be generated (init.nics) is replaced by DHCPv4 on
// every interface. Interfaces are matched by the MACs the VMI states
// (spec.domain.devices.interfaces[].macAddress, then status.interfaces[].mac);
// when none is known, NoCloud gets one v2 entry matching every "e*" name
// (en*, eth*), and ConfigDrive gets no network_data.json, which makes
// cloud-init fall back to DHCP on the first NIC: network_data.json can only
// name links by MAC.
import type { VmiObject } from '../kube-types.ts';
import type { Datasource } from '../seed.ts';
import { dumpYaml } from '../yaml.ts';
import { modelToNetworkData, networkDataBytes } from './emit-nwdata.ts';
import { modelToV2Bytes } from './emit-v2.ts';
import { emptyInterface, type NetModel, normalizeMac } from './model.ts';

export function knownMacs(vmi: VmiObject): string[] {
  const macs: string[] = [];
  for (const i of vmi.spec?.domain?.devices?.interfaces ?? []) {
    const m = typeof i.macAddress === 'string' ? normalizeMac(i.macAddress) : undefined;
    if (m && !macs.includes(m)) macs.push(m);
  }
  for (const i of vmi.status?.interfaces ?? []) {
    const m = typeof i.mac === 'string' ? normalizeMac(i.mac) : undefined;
    if (m && !macs.includes(m)) macs.push(m);
  }
  return macs;
}

export function forcedDhcpNetwork(vmi: VmiObject, datasource: Datasource): Uint8Array | undefined {
  const macs = knownMacs(vmi);
  const model: NetModel = {
    dns: { servers: [], search: [] },
    interfaces: macs.map((mac, i) => ({ ...emptyInterface(`nic${i}`), mac, dhcp4: true })),
  };
  if (datasource === 'configdrive') {
    return macs.length === 0 ? undefined : networkDataBytes(modelToNetworkData(model, (i) => `forceDHCP[${i}]`));
  }
  if (macs.length > 0) return modelToV2Bytes(model);
  return new Uint8Array(Buffer.from(dumpYaml({ version: 2, ethernets: { 'all-ethernets': { match: { name: 'e*' }, dhcp4: true } } }), 'utf8'));
}
