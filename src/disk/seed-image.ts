// Seed → image bytes, with what callers log and compare: label, file list
// and a content hash (same seed and timestamp → same hash → no rewrite).
import { createHash } from 'node:crypto';
import type { Datasource, Seed } from '../cloudinit/seed.ts';
import { buildIso, type IsoFile } from './iso9660.ts';
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

export function buildSeedImage(seed: Seed, timestamp: Date): SeedImage {
  const files = seedFiles(seed);
  const label = LABELS[seed.datasource];
  const bytes = buildIso({ label, files, timestamp });
  return {
    bytes,
    label,
    files: files.map((f) => ({ path: f.path, size: f.data.length })),
    sha256: createHash('sha256').update(bytes).digest('hex'),
  };
}
