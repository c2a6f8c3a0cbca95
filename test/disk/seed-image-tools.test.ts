// Our images read by the real tools: blkid, bsdtar, xorriso, isoinfo, 7z,
// cloud-init's own Python readers, and our reader; NoCloud and ConfigDrive,
// small and 1 MiB user-data.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { mkdirSync } from 'node:fs';
import { buildSeedImage, seedFiles } from '../../src/disk/seed-image.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { metaDataBytes } from '../../src/cloudinit/seed-files.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';
import {
  blkid,
  bsdtarExtract,
  cloudinitRead,
  isoinfoPaths,
  run,
  sevenZipPaths,
  tempDir,
  writeImage,
  xorrisoFind,
} from './tools.ts';
import { configdriveSeed, nocloudSeed, TIMESTAMP } from './fixtures.ts';

const b64 = (b: Uint8Array) => Buffer.from(b).toString('base64');
const dec = new TextDecoder();

function dirsOf(paths: string[]): string[] {
  const dirs = new Set<string>();
  for (const p of paths) {
    const parts = p.split('/');
    for (let i = 1; i < parts.length; i++) dirs.add(parts.slice(0, i).join('/'));
  }
  return [...dirs];
}

const cases: Array<[string, Seed, string]> = [
  ['nocloud small', nocloudSeed('small'), 'cidata'],
  ['nocloud 1 MiB', nocloudSeed('large'), 'cidata'],
  ['configdrive small', configdriveSeed('small'), 'config-2'],
  ['configdrive 1 MiB', configdriveSeed('large'), 'config-2'],
];

for (const [name, seed, label] of cases) {
  test(`${name}: real readers see the label, names and bytes`, async (t) => {
    const tmp = tempDir();
    t.after(tmp.cleanup);
    const image = buildSeedImage(seed, TIMESTAMP);
    assert.equal(image.label, label);
    assert.equal(image.bytes.length % 4096, 0);
    const iso = writeImage(tmp.dir, 'seed.iso', image.bytes);
    const expected = new Map(seedFiles(seed).map((f) => [f.path, Buffer.from(f.data)]));
    const files = [...expected.keys()].sort();
    const all = [...files, ...dirsOf(files)].sort();

    await t.test('blkid: TYPE=iso9660 and the exact label', () => {
      const b = blkid(iso);
      assert.equal(b.TYPE, 'iso9660');
      assert.equal(b.LABEL, label);
    });
    await t.test('bsdtar extracts the same bytes', () => {
      const out = join(tmp.dir, 'bsdtar');
      mkdirSync(out);
      const got = bsdtarExtract(iso, out);
      assert.deepEqual([...got.keys()].sort(), files);
      for (const [p, data] of expected) assert.ok(got.get(p)!.equals(data), p);
    });
    await t.test('xorriso -find lists the Rock Ridge names', () => {
      assert.deepEqual(xorrisoFind(iso), all);
    });
    await t.test('isoinfo -R -l and -J -l list the names', () => {
      assert.deepEqual(isoinfoPaths(iso, '-R'), all);
      assert.deepEqual(isoinfoPaths(iso, '-J'), all);
    });
    await t.test('7z l lists them', () => {
      assert.deepEqual(sevenZipPaths(iso), all);
    });
    await t.test('our reader returns the same tree and bytes', () => {
      const img = readIso(image.bytes);
      assert.equal(img.label, label);
      assert.equal(img.primaryLabel, label);
      assert.equal(img.jolietLabel, label);
      assert.deepEqual(img.extensions, { joliet: true, rockRidge: true });
      assert.deepEqual(
        img.entries.filter((e) => e.kind === 'file').map((e) => e.path),
        files,
      );
      for (const [p, data] of expected) assert.ok(Buffer.from(img.read(p)!).equals(data), p);
    });
    await t.test("cloud-init's own reader returns our content", () => {
      const out = join(tmp.dir, 'ci');
      mkdirSync(out);
      bsdtarExtract(iso, out);
      const got = cloudinitRead(seed.datasource, out);
      if (seed.datasource === 'nocloud') {
        const f = got.files as Record<string, string>;
        assert.equal(f['user-data'], b64(seed.userData));
        assert.equal(f['network-config'], b64(seed.networkConfig!));
        assert.equal(f['vendor-data'], b64(seed.vendorData!));
        assert.equal(Buffer.from(f['meta-data'], 'base64').toString(), Buffer.from(metaDataBytes(seed)).toString());
        assert.deepEqual(got['meta-data-yaml'], seed.metaData);
        const seeded = got.seeded as Record<string, unknown>;
        assert.deepEqual(seeded['meta-data'], seed.metaData);
        assert.equal(seeded['user-data'], b64(seed.userData));
        assert.equal(seeded['vendor-data'], b64(seed.vendorData!));
      } else {
        assert.equal(got.version, 2);
        const md = got.metadata as Record<string, unknown>;
        assert.equal(md['instance-id'], seed.metaData.uuid);
        assert.equal(md['local-hostname'], seed.metaData.hostname);
        assert.deepEqual(md.public_keys, seed.metaData.public_keys);
        assert.equal(got.userdata, b64(seed.userData));
        assert.deepEqual(got.networkdata, JSON.parse(dec.decode(seed.networkConfig)));
        assert.deepEqual(got.vendordata, JSON.parse(dec.decode(seed.vendorData)));
      }
    });
  });
}

test('the image is the fixed 25-sector overhead plus whole data sectors, rounded to 4 KiB, and never under 68 KiB', () => {
  // 16 system area + PVD, SVD, terminator + 4 path tables + 2 root directories
  // (the ER sits in the root `.` record: no continuation sector); each file
  // starts on its own sector (meta-data: 1). The floor is busybox volume_id's
  // 0x11000-byte read (MIN_SECTORS).
  for (const size of [0, 1, 2048, 2049, 12 * 1024, 12 * 1024 + 1, 16 * 1024, 100_000]) {
    const seed: Seed = {
      datasource: 'nocloud',
      metaData: { 'instance-id': 'i' },
      userData: new Uint8Array(size).fill(0x61),
      warnings: [],
    };
    const image = buildSeedImage(seed, TIMESTAMP);
    const sectors = 25 + 1 + Math.ceil(size / 2048);
    assert.equal(image.bytes.length, Math.max(0x11000, Math.ceil(sectors / 2) * 4096), `user-data of ${size} bytes`);
  }
});

test('the same seed gives the same bytes and hash; any change gives another', () => {
  const a = nocloudSeed('small');
  const b = nocloudSeed('small');
  const ia = buildSeedImage(a, TIMESTAMP);
  const ib = buildSeedImage(b, TIMESTAMP);
  assert.equal(ia.sha256, ib.sha256);
  assert.ok(Buffer.from(ia.bytes).equals(ib.bytes));
  const other = buildSeedImage(
    { ...a, userData: new TextEncoder().encode('#cloud-config\nhostname: vm2\n') },
    TIMESTAMP,
  );
  assert.notEqual(other.sha256, ia.sha256);
});

test("sha256 is the image file's own (sha256sum agrees), for small and large images and both layouts", (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  for (const seed of [nocloudSeed('small'), nocloudSeed('large'), configdriveSeed('small')]) {
    const image = buildSeedImage(seed, TIMESTAMP);
    const iso = writeImage(tmp.dir, 'h.iso', image.bytes);
    assert.equal(image.sha256, run('sha256sum', [iso]).stdout.toString().split(' ')[0]);
  }
});

test('configdrive without a uuid is refused with METADATA_INVALID', () => {
  const seed = configdriveSeed('small');
  delete seed.metaData.uuid;
  assert.throws(() => buildSeedImage(seed, TIMESTAMP), { code: 'METADATA_INVALID', field: 'metaData.uuid' });
});

test('nocloud writes user-data and meta-data even when empty, the optional files only when given', () => {
  const seed: Seed = { datasource: 'nocloud', metaData: {}, userData: new Uint8Array(0), warnings: [] };
  const img = readIso(buildSeedImage(seed, TIMESTAMP).bytes);
  assert.deepEqual(
    img.entries.map((e) => `${e.path}:${e.size}`),
    ['meta-data:2', 'user-data:0'],
  );
});
