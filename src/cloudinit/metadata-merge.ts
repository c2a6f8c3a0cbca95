// Virtlet's VirtletCloudInitMetaData as `metaData`: a mapping merged over the
// generated meta-data (Virtlet's merge, so nested mappings merge and custom
// keys are added; KubeVirt #15836). It may replace instance-id; what
// cloud-init needs to find the instance must survive the merge.
import type { Datasource } from '../api/objects.ts';
import { VmseedError } from '../errors.ts';
import { virtletMerge } from './userdata/merge.ts';

export function mergeMetaData(
  generated: Record<string, unknown>,
  override: Record<string, unknown> | undefined,
  datasource: Datasource,
  field: string,
): Record<string, unknown> {
  if (!override) return generated;
  const merged = virtletMerge(generated, override) as Record<string, unknown>;
  // NoCloud falls back to the id "nocloud" without instance-id; ConfigDrive's
  // reader refuses meta_data.json without uuid.
  const idKey = datasource === 'nocloud' ? 'instance-id' : 'uuid';
  const id = merged[idKey];
  if (typeof id !== 'string' || id.trim() === '') {
    throw new VmseedError(
      'METADATA_INVALID',
      `${field}.${idKey} must be a non-empty string: cloud-init identifies the instance by it. Remove the override or give a stable id`,
      { kind: 'terminal', field: `${field}.${idKey}` },
    );
  }
  for (const key of datasource === 'nocloud' ? ['local-hostname'] : ['hostname', 'name']) {
    if (merged[key] !== undefined && typeof merged[key] !== 'string') {
      throw new VmseedError('METADATA_INVALID', `${field}.${key} must be a string`, {
        kind: 'terminal',
        field: `${field}.${key}`,
      });
    }
  }
  return merged;
}
