// A KubeVirt cloud-init volume adopted at admission: the webhook moved the
// VMI's cloudInitNoCloud / cloudInitConfigDrive volume and its disk out of
// the spec (so KubeVirt builds no disk) into the annotation
// `vmseed.io/adopted`, which keeps them verbatim with their places. The seed
// is then rendered from the VMI as it was submitted: the volume and the disk
// put back where they were, read by the same reader as any KubeVirt volume
// (volume-input.ts), so the seed is the one KubeVirt would have built.
import { VmseedError } from '../../errors.ts';
import type { AdoptedInfo } from '../../status/snapshot.ts';
import type { VmiObject, VmiVolume } from '../../api/objects.ts';
import { isPlainObject } from '../yaml.ts';

/** The VMI's (or its VM template's) ask for adoption; `"false"` also opts a VMI out of its namespace's. */
export const ADOPT_ANNOTATION = 'vmseed.io/adopt';
/** Where the webhook records an adopted volume; its presence puts the VMI in vmseed's hands. */
export const ADOPTED_ANNOTATION = 'vmseed.io/adopted';
/** The record's format; another value is refused, not guessed at. */
export const ADOPTED_VERSION = 1;
/** The record's bound: KubeVirt's inline data is 2 KiB a field, so a real one is far smaller. */
export const MAX_ADOPTED_BYTES = 32 * 1024;

/** What asked for the adoption: the VMI's own `vmseed.io/adopt`, or its namespace's label. */
export type AdoptedBy = 'annotation' | 'namespace';

/** The annotation's content: the volume and its disk as submitted, and their places in the spec. */
export interface AdoptedRecord {
  v: typeof ADOPTED_VERSION;
  by: AdoptedBy;
  volumeIndex: number;
  volume: VmiVolume;
  // Absent: the volume had no disk (KubeVirt's webhook refuses that, but the record does not depend on it).
  diskIndex?: number;
  disk?: { name: string; [k: string]: unknown };
}

const KINDS = ['cloudInitNoCloud', 'cloudInitConfigDrive'] as const;
/** The fields of a cloud-init volume vmseed adopts; a volume with any other is left to KubeVirt. */
export const ADOPTABLE_FIELDS: ReadonlySet<string> = new Set([
  'userData',
  'userDataBase64',
  'networkData',
  'networkDataBase64',
  'secretRef',
  'networkDataSecretRef',
]);
const REF_FIELDS = new Set(['secretRef', 'networkDataSecretRef']);

function invalid(message: string): VmseedError {
  return new VmseedError(
    'ADOPTED_INVALID',
    `annotation ${ADOPTED_ANNOTATION}: ${message}; it is written by vmseed's webhook: remove it and create the VMI again with its cloud-init volume`,
    { kind: 'terminal', field: ADOPTED_ANNOTATION },
  );
}

const index = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0;

/** Why a cloud-init volume's source cannot be adopted as it is, or undefined. */
export function unadoptableField(source: Record<string, unknown>): string | undefined {
  for (const [k, v] of Object.entries(source)) {
    if (v === undefined || v === null) continue;
    if (!ADOPTABLE_FIELDS.has(k)) return `field "${k}" is not one vmseed adopts`;
    if (REF_FIELDS.has(k)) {
      if (!isPlainObject(v) || typeof v.name !== 'string' || v.name === '' || Object.keys(v).some((x) => x !== 'name'))
        return `field "${k}" is not a reference by name`;
    } else if (typeof v !== 'string') return `field "${k}" is not a string`;
  }
  return undefined;
}

/** The record read from the annotation's text. Throws VmseedError ADOPTED_INVALID (terminal). */
export function readAdopted(text: string): AdoptedRecord {
  if (text.length > MAX_ADOPTED_BYTES || Buffer.byteLength(text) > MAX_ADOPTED_BYTES)
    throw invalid(`more than ${MAX_ADOPTED_BYTES} bytes`);
  let doc: unknown;
  try {
    doc = JSON.parse(text);
  } catch {
    throw invalid('not JSON');
  }
  if (!isPlainObject(doc)) throw invalid('not a JSON object');
  if (doc.v !== ADOPTED_VERSION) throw invalid(`version ${JSON.stringify(doc.v)} is not ${ADOPTED_VERSION}`);
  if (doc.by !== 'annotation' && doc.by !== 'namespace') throw invalid('"by" is neither annotation nor namespace');
  if (!index(doc.volumeIndex)) throw invalid('"volumeIndex" is not a non-negative integer');
  const volume = doc.volume;
  if (!isPlainObject(volume) || typeof volume.name !== 'string' || volume.name === '')
    throw invalid('"volume" has no name');
  const kinds = KINDS.filter((k) => volume[k] !== undefined);
  if (kinds.length !== 1 || Object.keys(volume).length !== 2 || !isPlainObject(volume[kinds[0]]))
    throw invalid('"volume" must be one cloudInitNoCloud or cloudInitConfigDrive volume');
  const why = unadoptableField(volume[kinds[0]] as Record<string, unknown>);
  if (why) throw invalid(`"volume": ${why}`);
  const record: AdoptedRecord = {
    v: ADOPTED_VERSION,
    by: doc.by,
    volumeIndex: doc.volumeIndex,
    volume: volume as unknown as VmiVolume,
  };
  if (doc.disk !== undefined) {
    const disk = doc.disk;
    if (!isPlainObject(disk) || disk.name !== volume.name) throw invalid('"disk" is not the volume\'s disk');
    if (!index(doc.diskIndex)) throw invalid('"diskIndex" is not a non-negative integer');
    record.disk = disk as AdoptedRecord['disk'];
    record.diskIndex = doc.diskIndex;
  }
  return record;
}

/** The annotation's text for a record (compact JSON, fields in a fixed order). */
export function adoptedText(record: AdoptedRecord): string {
  const { v, by, volumeIndex, volume, diskIndex, disk } = record;
  return JSON.stringify({ v, by, volumeIndex, volume, ...(disk ? { diskIndex, disk } : {}) });
}

function insertAt<T>(list: readonly T[] | undefined, at: number, item: T): T[] {
  const out = [...(list ?? [])];
  out.splice(Math.min(at, out.length), 0, item);
  return out;
}

/**
 * The VMI as it was submitted: the adopted volume and disk back at their places. For rendering
 * only (the seed KubeVirt would build reads the volume, and ConfigDrive's devices metadata the
 * disks); the object itself is not changed.
 */
export function restoreAdopted(vmi: VmiObject, record: AdoptedRecord): VmiObject {
  const spec = { ...vmi.spec, volumes: insertAt(vmi.spec.volumes, record.volumeIndex, record.volume) };
  if (record.disk && record.diskIndex !== undefined) {
    const domain = vmi.spec.domain ?? {};
    const devices = domain.devices ?? {};
    spec.domain = { ...domain, devices: { ...devices, disks: insertAt(devices.disks, record.diskIndex, record.disk) } };
  }
  return { ...vmi, spec };
}

/** What the status page says of a VMI's adopted volume; undefined when it has none or a record that does not read. */
export function adoptedInfo(vmi: VmiObject): AdoptedInfo | undefined {
  const text = vmi.metadata.annotations?.[ADOPTED_ANNOTATION];
  if (text === undefined) return undefined;
  try {
    const record = readAdopted(text);
    const kind = record.volume.cloudInitConfigDrive !== undefined ? 'cloudInitConfigDrive' : 'cloudInitNoCloud';
    return { volume: record.volume.name, kind, by: record.by };
  } catch {
    return undefined;
  }
}
