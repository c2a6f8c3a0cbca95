// The Linux kernel is the reader that matters most: a Debian cloud kernel
// under QEMU TCG finds our image by its label (blkid/findfs in the guest),
// mounts it as iso9660 and prints every file; the bytes must equal the seed's.
// NoCloud on a read-only virtio disk, ConfigDrive (nested openstack/latest/)
// on both a virtio disk and a SCSI CD-ROM, small and 1 MiB user-data.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { bootWithImage } from './support/guest/qemu.ts';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { serializeMetaData } from '../src/cloudinit/seed-files.ts';
import type { Seed } from '../src/cloudinit/seed.ts';
import { configdriveSeed, nocloudSeed, TIMESTAMP } from '../test/disk/fixtures.ts';

async function bootSeed(seed: Seed, cdrom: boolean) {
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-kernel-iso-'));
  try {
    const image = buildSeedImage(seed, TIMESTAMP);
    const file = path.join(dir, 'seed.iso');
    await writeFile(file, image.bytes);
    const expected = serializeMetaData(seed);
    const r = await bootWithImage({
      image: file,
      label: image.label,
      files: expected.map((f) => f.path),
      cdrom,
      timeoutMs: 120_000,
    });
    return { r, expected };
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
}

const cases: Array<[string, Seed, boolean]> = [
  ['NoCloud, small, virtio disk', nocloudSeed('small'), false],
  ['NoCloud, 1 MiB user-data, virtio disk', nocloudSeed('large'), false],
  ['ConfigDrive, small, SCSI CD-ROM', configdriveSeed('small'), true],
  ['ConfigDrive, 1 MiB user-data, virtio disk', configdriveSeed('large'), false],
];

for (const [name, seed, cdrom] of cases) {
  test(`the Linux kernel mounts our image by label and reads it: ${name}`, async () => {
    const { r, expected } = await bootSeed(seed, cdrom);
    assert.equal(r.done, true, 'guest finished');
    assert.ok(r.labelFound, `label not found; console tail:\n${r.console.slice(-2000)}`);
    assert.match(r.labelFound.dev, cdrom ? /^\/dev\/sr\d$/ : /^\/dev\/vd[a-z]$/);
    assert.deepEqual(r.missing, []);
    for (const f of expected) assert.deepEqual(r.files.get(f.path), Buffer.from(f.bytes), f.path);
  });
}
