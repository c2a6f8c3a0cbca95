// meta-data as KubeVirt and Virtlet write it: JSON (old cloud-init and CirrOS
// parse JSON; JSON is also YAML for newer ones).
import type { VmiObject, Datasource } from '../api/objects.ts';
import { hostname } from './kubevirt/hostname.ts';
import { instanceId } from './kubevirt/instance-id.ts';
import type { DeviceData } from './devices-metadata.ts';

// KubeVirt puts the VM's instancetype into meta-data; the cluster-wide one
// wins over the namespaced one (cloud-init.go ReadCloudInitVolumeDataSource).
export const CLUSTER_INSTANCETYPE_ANNOTATION = 'kubevirt.io/cluster-instancetype-name';
export const INSTANCETYPE_ANNOTATION = 'kubevirt.io/instancetype-name';

export function instanceType(vmi: VmiObject): string | undefined {
  const a = vmi.metadata.annotations ?? {};
  return a[CLUSTER_INSTANCETYPE_ANNOTATION] || a[INSTANCETYPE_ANNOTATION] || undefined;
}

export function buildMetaData(
  vmi: VmiObject,
  datasource: Datasource,
  publicKeys: Record<string, string>,
  devices: DeviceData[] = [],
): Record<string, unknown> {
  const id = instanceId(vmi);
  const host = hostname(vmi);
  const type = instanceType(vmi);
  const hasKeys = Object.keys(publicKeys).length > 0;
  if (datasource === 'nocloud') {
    return {
      'instance-id': id,
      'local-hostname': host,
      ...(type ? { 'instance-type': type } : {}),
      ...(hasKeys ? { 'public-keys': publicKeys } : {}),
    };
  }
  // KubeVirt's ConfigDriveMetadata keys (pkg/cloud-init/cloud-init.go) and
  // no others: instance_type, instance_id, hostname, uuid, devices,
  // public_keys (local_hostname is in its struct but never set).
  // cloud-init's ConfigDrive reader takes the instance-id from `uuid` (required)
  // and compares it with the SMBIOS UUID. instance_id repeats it rather than
  // KubeVirt's "<name>.<namespace>" so both datasources name the instance alike.
  return {
    uuid: id,
    instance_id: id,
    hostname: host,
    ...(type ? { instance_type: type } : {}),
    ...(devices.length > 0 ? { devices } : {}),
    ...(hasKeys ? { public_keys: publicKeys } : {}),
  };
}
