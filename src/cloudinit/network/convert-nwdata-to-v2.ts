// OpenStack network_data.json given for NoCloud → network-config v2 with the
// same meaning cloud-init's convert_net_json gives it (read-nwdata.ts).
import { modelToV2Bytes, withGlobalDnsOnInterfaces } from './emit-v2.ts';
import { networkDataToModel } from './read-nwdata.ts';

export function convertNetworkDataToV2(doc: unknown, field: string): Uint8Array {
  return modelToV2Bytes(withGlobalDnsOnInterfaces(networkDataToModel(doc, field)));
}
