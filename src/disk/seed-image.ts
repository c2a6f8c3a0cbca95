// Seed → image bytes, with what callers log and compare: label, file list
// and a content hash (same seed and timestamp → same hash → no rewrite).
import type { Datasource } from '../api/objects.ts';
import { createHash } from 'node:crypto';
import type { Seed } from '../cloudinit/seed.ts';
import { buildIso, SYSTEM_AREA_BYTES, type IsoFile } from './iso9660.ts';
import { CONFIGDRIVE_LABEL, configdriveFiles } from './configdrive.ts';
import { NOCLOUD_LABEL, nocloudFiles } from './nocloud.ts';

export interface SeedImage {
  bytes: Uint8Array;
  label: string;
  files: Array<{ path: string; size: number }>;
  sha256: string;
}

export const LABELS: Record<Datasource, string> = { nocloud: NOCLOUD_LABEL, configdrive: CONFIGDRIVE_LABEL };

export function seedFiles(seed: Seed): IsoFile[] {
  return seed.datasource === 'configdrive' ? configdriveFiles(seed) : nocloudFiles(seed);
}

// The sha256 of the image, exactly as `sha256sum` gives it, without hashing
// the 32 KiB zero system area every time: the hash state after those bytes
// is computed once and copied. For a seed-sized image this about halves the
// hashing, which costs more than building the image (docs/operations.md,
// "Measured" under the seed images' names).
const AFTER_SYSTEM_AREA = createHash('sha256').update(new Uint8Array(SYSTEM_AREA_BYTES));

export function imageSha256(bytes: Uint8Array): string {
  return AFTER_SYSTEM_AREA.copy().update(bytes.subarray(SYSTEM_AREA_BYTES)).digest('hex');
}

/**
 * A seed's ISO 9660 image, with its label, file list and sha256 (the same seed
 * and timestamp give the same bytes). Throws a terminal VmseedError when the
 * seed cannot be laid out.
 */
export function buildSeedImage(seed: Seed, timestamp: Date): SeedImage {
  const files = seedFiles(seed);
  const label = LABELS[seed.datasource];
  const bytes = buildIso({ label, files, timestamp });
  return {
    bytes,
    label,
    files: files.map((f) => ({ path: f.path, size: f.data.length })),
    sha256: imageSha256(bytes),
  };
}

/**
 * Hands an image's memory back at once: its bytes are dead once the store
 * has written them (or found them already on disk). Left to the garbage
 * collector, each image is external memory V8 collects only after tens of
 * megabytes of it, so a cold start of many VMIs holds dead images at its
 * peak (docs/operations.md, "Measured" under Resources). The caller must not
 * touch `bytes` afterwards (a detached view reads as empty).
 */
export function releaseImageBytes(bytes: Uint8Array): void {
  const buf = bytes.buffer;
  if (buf instanceof ArrayBuffer && !buf.detached && bytes.byteOffset === 0 && bytes.byteLength === buf.byteLength)
    buf.transfer(0);
}
