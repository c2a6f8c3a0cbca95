// What a new seed means to the guest when its content changes (an edited
// Secret or ConfigMap, or annotation), chosen per VMI by annotation:
// - refresh (default): the same instance-id. cloud-init keeps treating the
//   instance as the one it already set up: per-instance modules do not run
//   again, and the new content matters only to what runs every boot.
// - reprovision: the instance-id is derived from the content as well, so a
//   change gives a new one, and at its next boot cloud-init runs as on a
//   first boot (per-instance modules again, SSH host keys regenerated).
// Deterministic: the same content gives the same id, across agent restarts.
import { createHash } from 'node:crypto';
import type { VmiObject } from '../api/objects.ts';
import { VmseedError } from '../errors.ts';
import { instanceId, uuidV5, KUBEVIRT_FIRMWARE_UUID_NAMESPACE } from './kubevirt/instance-id.ts';
import type { Seed } from './seed.ts';

export const CHANGE_POLICY_ANNOTATION = 'vmseed.io/on-secret-change';
export const CHANGE_POLICIES = ['refresh', 'reprovision'] as const;
export type ChangePolicy = (typeof CHANGE_POLICIES)[number];

export function changePolicyOf(vmi: VmiObject): ChangePolicy {
  const value = vmi.metadata.annotations?.[CHANGE_POLICY_ANNOTATION];
  if (value === undefined || value.trim() === '') return 'refresh';
  const v = value.trim();
  if ((CHANGE_POLICIES as readonly string[]).includes(v)) return v as ChangePolicy;
  throw new VmseedError(
    'ANNOTATION_INVALID',
    `annotation ${CHANGE_POLICY_ANNOTATION} is "${v.slice(0, 40)}"; use "refresh" (keep the instance-id) or "reprovision" (a new instance-id when the content changes)`,
    { kind: 'terminal', field: `metadata.annotations.${CHANGE_POLICY_ANNOTATION}` },
  );
}

// The seed with the policy applied. An instance-id the user set in
// meta-data is theirs and left alone.
export function applyChangePolicy(vmi: VmiObject, seed: Seed): Seed {
  if (changePolicyOf(vmi) !== 'reprovision' || seed.metaDataRaw !== undefined) return seed;
  const base = instanceId(vmi);
  const key = seed.datasource === 'nocloud' ? 'instance-id' : 'uuid';
  if (seed.metaData[key] !== base) return seed;
  const id = uuidV5(KUBEVIRT_FIRMWARE_UUID_NAMESPACE, `${base}/content/${contentDigest(seed)}`);
  const metaData =
    seed.datasource === 'nocloud'
      ? { ...seed.metaData, 'instance-id': id }
      : { ...seed.metaData, uuid: id, ...(seed.metaData.instance_id === base ? { instance_id: id } : {}) };
  return { ...seed, metaData };
}

// What the guest is given apart from meta-data, each part length-prefixed.
function contentDigest(seed: Seed): string {
  const h = createHash('sha256');
  for (const part of [seed.userData, seed.networkConfig, seed.vendorData]) {
    const bytes = part ?? new Uint8Array();
    h.update(`${part === undefined ? -1 : bytes.length}:`);
    h.update(bytes);
  }
  h.update(JSON.stringify({ ...seed.metaData, 'instance-id': undefined, uuid: undefined, instance_id: undefined }));
  return h.digest('hex');
}
