// Whether the webhook adopts a VMI's KubeVirt cloud-init volume, decided at
// its creation. Adoption is opt-in (the VMI's `vmseed.io/adopt: "true"`, or
// its namespace's label of that name, which the configuration's second
// webhook selects) and all or nothing: the volume is adopted only when
// vmseed can build the very seed KubeVirt would, from what the submitted
// VMI says and its Secrets as they are now. Anything else leaves the VMI
// unchanged, so KubeVirt builds its disk as without vmseed, and says why.
//
// Never worse than KubeVirt, so not adopted:
//  - a volume with a field vmseed does not know, or a second cloud-init
//    volume (KubeVirt reads the first only);
//  - SSH keys that accessCredentials propagate through the volume: KubeVirt's
//    own validation refuses such a VMI once the volume is gone;
//  - a disk after the volume's disk with the same device-name prefix: the
//    guest would see it under another name;
//  - what the seed's render refuses (a Secret missing, unreadable or too
//    large, invalid base64, KubeVirt's admission rules), or data KubeVirt's
//    webhook refuses (inline data over its 2 KiB): KubeVirt must refuse that
//    VMI as it would without vmseed;
//  - the answer not known within the budget.
import type { RefResolver, VmiObject } from '../../api/objects.ts';
import { VmseedError, asVmseedError } from '../../errors.ts';
import { ANNOTATION } from '../../cloudinit/annotation/annotation.ts';
import {
  ADOPT_ANNOTATION,
  ADOPTED_ANNOTATION,
  ADOPTED_VERSION,
  MAX_ADOPTED_BYTES,
  adoptedText,
  unadoptableField,
  type AdoptedBy,
  type AdoptedRecord,
} from '../../cloudinit/kubevirt/adopted.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../cloudinit/render.ts';
import { LIMITS } from '../../cloudinit/limits.ts';

export { ADOPT_ANNOTATION };
/** The namespace label that opts every VMI created in it in (the configuration's namespaceSelector). */
export const ADOPT_NAMESPACE_LABEL = 'vmseed.io/adopt';

/** What the webhook decided about a VMI's cloud-init volume. */
export type AdoptionDecision =
  // Not asked for.
  | { kind: 'none' }
  | { kind: 'adopt'; record: AdoptedRecord }
  // Asked for and not done: the VMI stays as submitted. `field` is the part of it that decided.
  | { kind: 'skipped'; reason: string; field: string };

/** How adoption reads what the seed needs. */
export interface AdoptionOptions {
  // The VMI's Secrets; absent: a volume that references one is not adopted.
  secrets?: RefResolver;
  // Why there is no `secrets`, for that answer.
  secretsUnavailable?: string;
  // The whole decision, Secret reads included (default 2 s).
  timeoutMs?: number;
}

type Json = Record<string, unknown>;

function isObject(v: unknown): v is Json {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Who asks for the VMI's adoption: its annotation, else its namespace (`namespaceOptIn`), else nobody. */
export function adoptionAsked(annotations: Record<string, string>, namespaceOptIn: boolean): AdoptedBy | undefined {
  const own = annotations[ADOPT_ANNOTATION];
  if (own === 'true') return 'annotation';
  if (own !== undefined) return undefined;
  return namespaceOptIn ? 'namespace' : undefined;
}

const KINDS = ['cloudInitNoCloud', 'cloudInitConfigDrive'] as const;

// The device-name prefix KubeVirt's converter gives a disk: vdX for virtio,
// sdX for sata, scsi and usb (disk, cdrom and lun alike).
function namePrefix(disk: Json): string {
  for (const kind of ['disk', 'cdrom', 'lun'] as const) {
    const target = disk[kind];
    if (!isObject(target)) continue;
    const bus = typeof target.bus === 'string' ? target.bus : kind === 'disk' ? 'virtio' : 'sata';
    return bus === 'virtio' ? 'vd' : 'sd';
  }
  return 'vd';
}

function skipped(reason: string, field: string): AdoptionDecision {
  return { kind: 'skipped', reason, field };
}

// The object's annotations' size, as the API server counts it (keys and values).
function annotationBytes(annotations: Record<string, string>): number {
  let n = 0;
  for (const [k, v] of Object.entries(annotations)) n += Buffer.byteLength(k) + Buffer.byteLength(v);
  return n;
}

/** The adoption's shape checks, before anything is read; a record, or why not. */
export function adoptionShape(vmi: VmiObject, by: AdoptedBy): AdoptionDecision {
  const annotations = vmi.metadata.annotations ?? {};
  const volumes = vmi.spec.volumes ?? [];
  const found = volumes.flatMap((v, i) => (KINDS.some((k) => isObject(v[k])) ? [i] : []));
  if (found.length === 0)
    return skipped('the VMI has no cloudInitNoCloud or cloudInitConfigDrive volume', 'spec.volumes');
  const volumeIndex = found[0];
  const volume = volumes[volumeIndex];
  const path = `spec.volumes[${volumeIndex}]`;
  if (annotations[ANNOTATION] !== undefined)
    return skipped(`the VMI has the ${ANNOTATION} annotation too; keep one of the two`, path);
  if (found.length > 1) return skipped('the VMI has more than one cloud-init volume', `spec.volumes[${found[1]}]`);
  const kind = KINDS.find((k) => isObject(volume[k]))!;
  if (Object.keys(volume).some((k) => k !== 'name' && k !== kind))
    return skipped('the volume sets another source beside cloud-init', path);
  const why = unadoptableField(volume[kind] as Json);
  if (why) return skipped(`${kind}: ${why}`, `${path}.${kind}`);
  const creds = vmi.spec.accessCredentials ?? [];
  const through = creds.findIndex((c) => {
    const m = (c.sshPublicKey?.propagationMethod ?? {}) as Json;
    return m.noCloud !== undefined || m.configDrive !== undefined;
  });
  if (through >= 0)
    return skipped(
      'accessCredentials propagate SSH keys through the cloud-init volume, which KubeVirt requires to stay',
      `spec.accessCredentials[${through}]`,
    );
  const disks = vmi.spec.domain?.devices?.disks ?? [];
  const diskIndexes = disks.flatMap((d, i) => (d.name === volume.name ? [i] : []));
  if (diskIndexes.length > 1) return skipped('more than one disk names the volume', 'spec.domain.devices.disks');
  const record: AdoptedRecord = { v: ADOPTED_VERSION, by, volumeIndex, volume: structuredClone(volume) };
  if (diskIndexes.length === 1) {
    const diskIndex = diskIndexes[0];
    const disk = disks[diskIndex];
    const prefix = namePrefix(disk);
    const after = disks.findIndex((d, i) => i > diskIndex && namePrefix(d) === prefix);
    if (after >= 0)
      return skipped(
        `disk "${disks[after].name}" comes after the cloud-init disk on the same bus and would change its name in the guest`,
        `spec.domain.devices.disks[${diskIndex}]`,
      );
    record.disk = structuredClone(disk);
    record.diskIndex = diskIndex;
  }
  const text = adoptedText(record);
  if (Buffer.byteLength(text) > MAX_ADOPTED_BYTES)
    return skipped(`the volume is more than ${MAX_ADOPTED_BYTES} bytes as JSON; keep large data in a Secret`, path);
  if (
    annotationBytes(annotations) + Buffer.byteLength(ADOPTED_ANNOTATION) + Buffer.byteLength(text) + 256 >
    LIMITS.annotationBytes
  )
    return skipped("the VMI's annotations would exceed the API server's 256 KiB", 'metadata.annotations');
  return { kind: 'adopt', record };
}

function withTimeout<T>(work: Promise<T>, ms: number): Promise<T | 'timeout'> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<'timeout'>((resolve) => {
    timer = setTimeout(() => resolve('timeout'), ms);
  });
  return Promise.race([work, late]).finally(() => clearTimeout(timer));
}

// A resolver that refuses every read, for a VMI whose volume references no
// object: its render never calls it.
const NO_SECRETS = (why: string): RefResolver => ({
  getSecret: () => Promise.reject(new VmseedError('KUBE_API_UNAVAILABLE', why, { kind: 'retryable' })),
  getConfigMap: () => Promise.reject(new VmseedError('KUBE_API_UNAVAILABLE', why, { kind: 'retryable' })),
});

/**
 * The webhook's decision for a VMI being created (`vmi` as submitted; `by`: who asks, from
 * adoptionAsked). Never throws: what cannot be decided is a `skipped` answer.
 */
export async function decideAdoption(
  vmi: unknown,
  by: AdoptedBy | undefined,
  options: AdoptionOptions,
): Promise<AdoptionDecision> {
  if (by === undefined) return { kind: 'none' };
  if (!isObject(vmi) || !isObject(vmi.metadata) || !isObject(vmi.spec))
    return skipped('the object is not a VMI', 'metadata');
  const object = vmi as unknown as VmiObject;
  const shape = adoptionShape(object, by);
  if (shape.kind !== 'adopt') return shape;
  const kind = KINDS.find((k) => shape.record.volume[k] !== undefined)!;
  const path = `spec.volumes[${shape.record.volumeIndex}].${kind}`;
  const secrets =
    options.secrets ?? NO_SECRETS(`Secrets cannot be read: ${options.secretsUnavailable ?? 'no API credentials'}`);
  // The render the node agent will make, with the node agent's default
  // limits, from this VMI as submitted: what it refuses, it would refuse.
  const render = renderSeed(object, secrets, { ...DEFAULT_RENDER_OPTIONS, kubevirtVolumes: 'own' }).then(
    (outcome) => outcome,
    (e: unknown) => e as Error,
  );
  const outcome = await withTimeout(render, options.timeoutMs ?? 2_000);
  if (outcome === 'timeout') return skipped('its Secrets could not be read in time', path);
  if (outcome instanceof Error) {
    const e = asVmseedError(outcome);
    return skipped(`${e.code}: ${e.message}`, e.field ?? path);
  }
  if (outcome.kind !== 'seed') return skipped(outcome.reason, path);
  const refused = outcome.seed.warnings.find((w) => w.code === 'KUBEVIRT_INLINE_LIMIT');
  if (refused) return skipped(`${refused.code}: KubeVirt's webhook refuses this VMI`, refused.field ?? path);
  return shape;
}
