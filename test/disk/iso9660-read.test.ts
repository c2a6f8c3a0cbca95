// Our reader on images from genisoimage and xorrisofs (the tools KubeVirt,
// Virtlet and cloud-localds use), and on garbage.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { buildIso } from '../../src/disk/iso9660.ts';
import { VmseedError } from '../../src/errors.ts';
import { run, tempDir } from './tools.ts';
import { bigUserData } from './fixtures.ts';

const enc = new TextEncoder();

function sourceTree(dir: string): Map<string, Uint8Array> {
  const files = new Map<string, Uint8Array>([
    ['user-data', enc.encode('#cloud-config\nhostname: g\n')],
    ['meta-data', enc.encode('instance-id: iid-g\n')],
    ['network-config', new Uint8Array(0)],
    ['openstack/latest/meta_data.json', enc.encode('{"uuid": "u"}')],
    ['openstack/latest/user_data', bigUserData(1 << 20)],
    ['a-rather-long-file-name-for-rock-ridge-and-joliet.txt', enc.encode('long')],
  ]);
  for (const [p, data] of files) {
    mkdirSync(join(dir, p, '..'), { recursive: true });
    writeFileSync(join(dir, p), data);
  }
  return files;
}

const tools: Array<[string, (src: string, out: string, extra: string[]) => void]> = [
  ['genisoimage', (src, out, extra) => run('genisoimage', ['-quiet', '-volid', 'cidata', ...extra, '-o', out, src])],
  [
    'xorrisofs',
    (src, out, extra) =>
      run('xorrisofs', ['-quiet', '-volid', 'cidata', ...extra, '-partition_cyl_align', 'on', '-o', out, src]),
  ],
];

for (const [tool, make] of tools) {
  for (const [variant, extra, namesFrom] of [
    ['-joliet -rock', ['-joliet', '-rock'], 'rockridge'],
    ['-joliet only', ['-joliet'], 'joliet'],
  ] as const) {
    test(`reads ${tool} ${variant} images: label, extensions, names and bytes`, (t) => {
      const tmp = tempDir();
      t.after(tmp.cleanup);
      const src = join(tmp.dir, 'src');
      const files = sourceTree(src);
      const out = join(tmp.dir, 'x.iso');
      make(src, out, [...extra]);
      const img = readIso(new Uint8Array(readFileSync(out)));
      assert.equal(img.label, 'cidata');
      // xorrisofs writes Rock Ridge even without -rock.
      const expected = tool === 'xorrisofs' ? 'rockridge' : namesFrom;
      assert.equal(img.namesFrom, expected);
      assert.deepEqual(img.extensions, { joliet: true, rockRidge: expected === 'rockridge' });
      assert.deepEqual(
        img.entries.filter((e) => e.kind === 'file').map((e) => e.path),
        [...files.keys()].sort(),
      );
      for (const [p, data] of files) assert.ok(Buffer.from(img.read(p)!).equals(data), p);
    });
  }
}

test('reads a plain ISO 9660 image (no extensions) by its primary names', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const src = join(tmp.dir, 'src');
  mkdirSync(src);
  writeFileSync(join(src, 'user-data'), 'u');
  const out = join(tmp.dir, 'p.iso');
  run('genisoimage', ['-quiet', '-volid', 'CIDATA', '-o', out, src]);
  const img = readIso(new Uint8Array(readFileSync(out)));
  assert.equal(img.namesFrom, 'primary');
  assert.deepEqual(
    img.entries.map((e) => e.path),
    ['USER_DAT'],
  );
  assert.equal(new TextDecoder().decode(img.read('USER_DAT')), 'u');
});

test('garbage is ISO_NOT_AN_IMAGE, never a crash', () => {
  const notImage = (b: Uint8Array) =>
    assert.throws(
      () => readIso(b),
      (e: unknown) => e instanceof VmseedError && e.code === 'ISO_NOT_AN_IMAGE',
    );
  notImage(new Uint8Array(0));
  notImage(enc.encode('#cloud-config\n'));
  notImage(new Uint8Array(64 * 1024));
  const good = buildIso({ label: 'cidata', files: [{ path: 'a/b', data: enc.encode('x') }], timestamp: new Date(0) });
  notImage(good.subarray(0, 20 * 2048)); // truncated before its directories
  // Corrupt the root directory's extent so it points past the end.
  const bad = new Uint8Array(good);
  bad.set([0xff, 0xff, 0xff, 0x7f], 16 * 2048 + 156 + 2);
  notImage(bad);
  // Random bytes after a valid descriptor header.
  let seed = 1;
  for (let i = 0; i < 50; i++) {
    const junk = new Uint8Array(good);
    for (let k = 0; k < 200; k++) {
      seed = (seed * 1103515245 + 12345) >>> 0;
      junk[19 * 2048 + (seed % (junk.length - 19 * 2048))] = seed >>> 24;
    }
    try {
      readIso(junk);
    } catch (e) {
      assert.ok(e instanceof VmseedError && e.code === 'ISO_NOT_AN_IMAGE', String(e));
    }
  }
});
