// Virtlet's VirtletForceDHCPNetworkConfig as `forceDHCP: true`: whatever
// network config would be generated (init.nics) is replaced by DHCPv4 on
// every interface. Interfaces are matched by the MACs the VMI states
// (spec.domain.devices.interfaces[].macAddress, then status.interfaces[].mac).
// When none is known the seed gets no network config at all, and cloud-init
// falls back to DHCP on the first NIC (in KubeVirt, the pod network). A v2
// name glob (`match: {name: "e*"}`) would cover every NIC under netplan only:
// cloud-init's ENI and sysconfig renderers take the ethernets id as a device
// name and would configure a device that does not exist.
import type { VmiObject, Datasource } from '../../api/objects.ts';
import { modelToNetworkData, networkDataBytes } from './emit-nwdata.ts';
import { modelToV2Bytes } from './emit-v2.ts';
import { emptyInterface, type NetModel, normalizeMac } from './model.ts';
import { checkListLength, LIMITS } from '../limits.ts';

export function knownMacs(vmi: VmiObject): string[] {
  const macs: string[] = [];
  const spec = vmi.spec?.domain?.devices?.interfaces ?? [];
  const status = vmi.status?.interfaces ?? [];
  checkListLength(spec, LIMITS.vmiInterfaces, 'spec.domain.devices.interfaces');
  checkListLength(status, LIMITS.vmiInterfaces, 'status.interfaces');
  for (const i of spec) {
    const m = typeof i.macAddress === 'string' ? normalizeMac(i.macAddress) : undefined;
    if (m && !macs.includes(m)) macs.push(m);
  }
  for (const i of status) {
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
  if (macs.length === 0) return undefined;
  if (datasource === 'configdrive') return networkDataBytes(modelToNetworkData(model, (i) => `forceDHCP[${i}]`));
  return modelToV2Bytes(model);
}
