// Writer contract: typed errors, labels, names, determinism, alignment;
// checked with our reader and isoinfo's raw primary listing.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { buildIso, type IsoFile } from '../../src/disk/iso9660.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { VmseedError } from '../../src/errors.ts';
import { mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { blkid, bsdtarExtract, isoinfoPaths, run, sevenZipPaths, tempDir, writeImage, xorrisoFind } from './tools.ts';

const enc = new TextEncoder();
const ts = new Date('2026-01-02T03:04:05Z');
const f = (path: string, text = 'x'): IsoFile => ({ path, data: enc.encode(text) });

function code(fn: () => unknown): string {
  try {
    fn();
  } catch (e) {
    assert.ok(e instanceof VmseedError, `not a VmseedError: ${String(e)}`);
    assert.equal(e.kind, 'terminal');
    assert.ok(e.field, 'the error names the field');
    return e.code;
  }
  assert.fail('no error thrown');
}

test('bad input gets a typed error with a stable code', () => {
  const build =
    (files: IsoFile[], label = 'cidata') =>
    () =>
      buildIso({ label, files, timestamp: ts });
  assert.equal(code(build([f('')])), 'ISO_PATH_EMPTY');
  assert.equal(code(build([f('a'), f('a')])), 'ISO_PATH_DUPLICATE');
  assert.equal(code(build([f('d/a'), f('d/a')])), 'ISO_PATH_DUPLICATE');
  assert.equal(code(build([f('d'), f('d/a')])), 'ISO_PATH_DUPLICATE');
  assert.equal(code(build([f('d/a'), f('d')])), 'ISO_PATH_DUPLICATE');
  assert.equal(code(build([f('a'.repeat(65))])), 'ISO_NAME_TOO_LONG');
  assert.equal(code(build([f(`d${'b'.repeat(64)}/x`)])), 'ISO_NAME_TOO_LONG');
  for (const bad of [
    'a:b',
    'a;1',
    'a*',
    'a?',
    'a\\b',
    'a\u0001',
    '/abs',
    'a//b',
    'a/',
    './a',
    'a/../b',
    '\ud83d\ude00',
  ]) {
    assert.equal(code(build([f(bad)])), 'ISO_NAME_INVALID', JSON.stringify(bad));
  }
  for (const label of ['', 'a'.repeat(33), 'has space', 'ümlaut', 'a/b', 'tab\t']) {
    assert.equal(code(build([f('a')], label)), 'ISO_LABEL_INVALID', JSON.stringify(label));
  }
  assert.equal(
    code(() => buildIso({ label: 'cidata', files: [], timestamp: new Date(NaN) })),
    'ISO_TIMESTAMP_INVALID',
  );
  // 65,536 sectors is the limit: 128 MiB of data is over it.
  const huge = new Uint8Array(128 * 1024 * 1024);
  assert.equal(code(build([{ path: 'big', data: huge }])), 'ISO_TOO_LARGE');
});

test('a name of exactly 64 characters and a 32-character label are accepted', () => {
  const label = 'L'.repeat(32);
  const img = readIso(buildIso({ label, files: [f('a'.repeat(64))], timestamp: ts }));
  assert.equal(img.primaryLabel, label);
  assert.equal(img.jolietLabel, label.slice(0, 16));
  assert.equal(img.label, label);
  assert.deepEqual(
    img.entries.map((e) => e.path),
    ['a'.repeat(64)],
  );
});

test('blkid reports a 32-character label whole (Joliet part merged with the PVD)', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const label = 'seed-Label_0123456789abcdefghijk';
  const iso = writeImage(tmp.dir, 'l.iso', buildIso({ label, files: [f('a')], timestamp: ts }));
  assert.equal(blkid(iso).LABEL, label);
});

test('the same input gives the same bytes; a multiple of 4096 bytes', () => {
  const files = [f('user-data', '#cloud-config\n'), f('meta-data', '{}'), f('openstack/latest/x', 'y')];
  const a = buildIso({ label: 'cidata', files, timestamp: ts });
  const b = buildIso({ label: 'cidata', files: [...files].reverse(), timestamp: ts });
  assert.ok(Buffer.from(a).equals(b));
  assert.equal(a.length % 4096, 0);
  const c = buildIso({ label: 'cidata', files, timestamp: new Date(ts.getTime() + 1000) });
  assert.ok(!Buffer.from(a).equals(c), 'the timestamp is part of the image');
});

test('above the 68 KiB floor an image is its natural size rounded up to 4 KiB: an odd sector count gains one, an even one none', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  // One file at the root: the image ends where its extent ends (its LBA in
  // the directory record, from isoinfo, plus its sectors), before padding.
  for (const size of [10 * 2048, 10 * 2048 + 1, 15 * 2048, 15 * 2048 + 1, 100 * 2048 - 7, 101 * 2048]) {
    const data = new Uint8Array(size).fill(0x61);
    const bytes = buildIso({ label: 'cidata', files: [{ path: 'user-data', data }], timestamp: ts });
    const iso = writeImage(tmp.dir, `r${size}.iso`, bytes);
    const lba = /\[\s*(\d+) 00\]\s\suser-data $/m.exec(run('isoinfo', ['-R', '-l', '-i', iso]).stdout.toString());
    assert.ok(lba, 'user-data listed');
    const natural = Number(lba[1]) + Math.ceil(size / 2048);
    assert.ok(natural > 34, `natural ${natural} sectors is above the floor`);
    const want = natural % 2 === 0 ? natural : natural + 1;
    assert.equal(bytes.length, want * 2048, `user-data of ${size} bytes: ${natural} sectors`);
    assert.equal(readIso(bytes).volumeSectors, want, 'the PVD gives the padded size');
  }
});

test('primary names are unique valid 8.3 d-character names; Rock Ridge and Joliet keep the real ones', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const names = [
    'meta-data',
    'meta_data',
    'Meta-Data.json',
    'meta-data.jsonx',
    'user-data',
    '.hidden',
    'a.b.c.d',
    'ÜBER',
    'with space',
    'x'.repeat(64),
    'x'.repeat(63),
  ];
  const files = names.map((n, i) => f(`dir.with.dots/${n}`, String(i)));
  files.push(f('dir_with_dots/z'));
  const iso = writeImage(tmp.dir, 'n.iso', buildIso({ label: 'cidata', files, timestamp: ts }));
  const raw = run('isoinfo', ['-l', '-i', iso]).stdout.toString();
  const ids = [...raw.matchAll(/\]\s\s(\S+) $/gm)].map((m) => m[1]).filter((n) => n !== '.' && n !== '..');
  assert.equal(ids.length, names.length + 1 + 2, 'every record listed');
  const seen = new Set<string>();
  for (const id of ids) {
    assert.match(id, /^([A-Z0-9_]{1,8}(\.[A-Z0-9_]{0,3};1)?)$/, id);
    assert.ok(!seen.has(id), `duplicate ${id}`);
    seen.add(id);
  }
  const expected = [
    ...names.map((n) => `dir.with.dots/${n}`),
    'dir_with_dots/z',
    'dir.with.dots',
    'dir_with_dots',
  ].sort();
  assert.deepEqual(isoinfoPaths(iso, '-R'), expected);
  assert.deepEqual(isoinfoPaths(iso, '-J'), expected);
  const img = readIso(buildIso({ label: 'cidata', files, timestamp: ts }));
  files.forEach((file) => assert.deepEqual(img.read(file.path), file.data));
});

test('Rock Ridge modes: files 0444 by default, the given mode otherwise, directories 0555', () => {
  const img = readIso(
    buildIso({ label: 'cidata', files: [f('a'), { path: 'd/b', data: enc.encode('b'), mode: 0o600 }], timestamp: ts }),
  );
  const mode = (p: string) => img.entries.find((e) => e.path === p)!.mode;
  assert.equal(mode('a'), 0o100444);
  assert.equal(mode('d/b'), 0o100600);
  assert.equal(mode('d'), 0o040555);
});

test("Rock Ridge link counts (isoinfo -R): a directory's is 2 + its subdirectories, in its own `.`, its children's `..` and its parent's record; a file's is 1", (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const paths = [
    'openstack/latest/meta_data.json',
    'openstack/latest/user_data',
    'openstack/latest/network_data.json',
    'openstack/2012-08-10/meta_data.json',
    'openstack/content/0000',
    'openstack/README',
    'ec2/latest/meta-data.json',
    'a/b/c/d/e',
    'a/x',
    'user-data',
  ];
  const iso = writeImage(
    tmp.dir,
    'l.iso',
    buildIso({ label: 'config-2', files: paths.map((p) => f(p)), timestamp: ts }),
  );
  // Subdirectory counts from the input alone: '' is the root.
  const subdirs = new Map<string, Set<string>>([['', new Set()]]);
  for (const p of paths) {
    const parts = p.split('/');
    for (let i = 1; i < parts.length; i++) {
      const parent = parts.slice(0, i - 1).join('/');
      const dir = parts.slice(0, i).join('/');
      if (!subdirs.has(dir)) subdirs.set(dir, new Set());
      subdirs.get(parent)!.add(dir);
    }
  }
  const nlink = (dir: string) => 2 + subdirs.get(dir)!.size;
  assert.equal(nlink(''), 5, 'the root has a, ec2, openstack');
  assert.equal(nlink('openstack'), 5);
  // Listings in record order: `.` then `..` (both printed without a name), then the children.
  const listings = new Map<string, Array<{ dir: boolean; links: number; name: string }>>();
  let current: Array<{ dir: boolean; links: number; name: string }> = [];
  for (const line of run('isoinfo', ['-R', '-l', '-i', iso]).stdout.toString().split('\n')) {
    const m = /^Directory listing of \/(.*)$/.exec(line);
    if (m) listings.set(m[1].replace(/\/$/, ''), (current = []));
    const e = /^([-d])[-rwx]{9}\s+(\d+)\s.*\]\s\s(.*) $/.exec(line);
    if (e) current.push({ dir: e[1] === 'd', links: Number(e[2]), name: e[3] });
  }
  assert.deepEqual([...listings.keys()].sort(), [...subdirs.keys()].sort(), 'every directory listed');
  for (const [dir, records] of listings) {
    const parent = dir === '' ? '' : dir.split('/').slice(0, -1).join('/');
    const [dot, dotdot, ...children] = records;
    assert.equal(dot.links, nlink(dir), `'.' of /${dir}`);
    assert.equal(dotdot.links, nlink(parent), `'..' of /${dir}`);
    for (const c of children) {
      const path = dir === '' ? c.name : `${dir}/${c.name}`;
      assert.equal(c.links, c.dir ? nlink(path) : 1, `/${path}`);
    }
  }
});

test('an empty file list still makes a valid image', () => {
  const img = readIso(buildIso({ label: 'cidata', files: [], timestamp: ts }));
  assert.deepEqual(img.entries, []);
  assert.deepEqual(img.extensions, { joliet: true, rockRidge: true });
});

test('L and M path tables for both trees: isoinfo -p agrees with the directory records; M mirrors L', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const files = [f('user-data'), f('openstack/latest/meta_data.json'), f('openstack/content/0000'), f('a/b/c/d')];
  const bytes = buildIso({ label: 'config-2', files, timestamp: ts });
  const iso = writeImage(tmp.dir, 'p.iso', bytes);
  // Directory extents as the directory records give them (the '.' of each listing).
  const dirExtents = (args: string[]): Map<string, number> => {
    const out = new Map<string, number>();
    let dir = '';
    for (const line of run('isoinfo', [...args, '-l', '-i', iso])
      .stdout.toString()
      .split('\n')) {
      const m = /^Directory listing of (\/.*)$/.exec(line);
      if (m) dir = m[1];
      const e = /\[\s*(\d+) 02\]\s\s\. $/.exec(line);
      if (e && !out.has(dir)) out.set(dir, Number(e[1]));
    }
    return out;
  };
  for (const [args, names] of [
    [[], ['', 'A', 'OPENSTAC', 'B', 'CONTENT', 'LATEST', 'C']],
    [['-J'], ['', 'a', 'openstack', 'b', 'content', 'latest', 'c']],
  ] as const) {
    const pt = run('isoinfo', [...args, '-p', '-i', iso])
      .stdout.toString()
      .split('\n')
      .slice(1)
      .filter(Boolean)
      .map((l) => /^\s*(\d+):\s+(\d+) ([0-9a-f]+) ?(.*)$/.exec(l)!)
      .map((m) => ({ num: Number(m[1]), parent: Number(m[2]), extent: parseInt(m[3], 16), name: m[4].trim() }));
    assert.deepEqual(
      pt.map((e) => e.name),
      names,
    );
    // Rebuild each entry's path from parent numbers and check its extent.
    const paths = new Map<number, string>();
    const extents = dirExtents([...args]);
    for (const e of pt) {
      const path = e.num === 1 ? '/' : `${paths.get(e.parent)}${e.name}/`;
      paths.set(e.num, path);
      const key = args.length ? path : path.toUpperCase();
      assert.equal(e.extent, extents.get(key), `extent of ${path}`);
    }
  }
  // M tables: same records, big-endian, at the LBA each descriptor gives.
  const dv = new DataView(bytes.buffer, bytes.byteOffset);
  for (const vd of [16, 17]) {
    const base = vd * 2048;
    const size = dv.getUint32(base + 132, true);
    const l = dv.getUint32(base + 140, true) * 2048;
    const m = dv.getUint32(base + 148, false) * 2048;
    assert.equal(dv.getUint32(base + 136, false), size, 'both-endian size');
    for (let off = 0; off < size;) {
      const idLen = bytes[l + off];
      assert.equal(bytes[m + off], idLen);
      assert.equal(dv.getUint32(l + off + 2, true), dv.getUint32(m + off + 2, false));
      assert.equal(dv.getUint16(l + off + 6, true), dv.getUint16(m + off + 6, false));
      assert.deepEqual(
        bytes.subarray(l + off + 8, l + off + 8 + idLen),
        bytes.subarray(m + off + 8, m + off + 8 + idLen),
      );
      off += 8 + idLen + (idLen & 1);
    }
  }
});

test('many long UTF-8 names: Rock Ridge NM entries spread over several continuation sectors', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const names = Array.from({ length: 40 }, (_, i) => `${'日'.repeat(60)}${String(i).padStart(4, '0')}`);
  const files = names.map((n, i) => f(i % 2 ? `d/${n}` : n, n));
  const bytes = buildIso({ label: 'cidata', files, timestamp: ts });
  const iso = writeImage(tmp.dir, 'u.iso', bytes);
  const expected = [...files.map((x) => x.path), 'd'].sort();
  assert.deepEqual(isoinfoPaths(iso, '-R'), expected);
  const img = readIso(bytes);
  assert.deepEqual(
    img.entries.map((e) => e.path),
    expected,
  );
  for (const file of files) assert.deepEqual(img.read(file.path), file.data);
  const out = join(tmp.dir, 'x');
  mkdirSync(out);
  const got = bsdtarExtract(iso, out);
  for (const file of files) assert.equal(got.get(file.path)?.toString(), new TextDecoder().decode(file.data));
});

// The root `.` record's System Use entries: [signature, entry bytes].
function rootDotEntries(bytes: Uint8Array): Array<[string, Uint8Array]> {
  const dv = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  const rootLba = dv.getUint32(16 * 2048 + 156 + 2, true);
  const rec = rootLba * 2048;
  const len = bytes[rec];
  const idLen = bytes[rec + 32];
  let off = rec + 33 + idLen + (idLen % 2 === 0 ? 1 : 0);
  const out: Array<[string, Uint8Array]> = [];
  while (off + 4 <= rec + len && bytes[off + 2] >= 4) {
    out.push([String.fromCharCode(bytes[off], bytes[off + 1]), bytes.subarray(off, off + bytes[off + 2])]);
    off += bytes[off + 2];
  }
  assert.ok(len <= 255 && len % 2 === 0, `root '.' record length ${len}`);
  return out;
}

for (const [what, files] of [
  ['a seed', [f('user-data', '#cloud-config\n'), f('meta-data', 'instance-id: i\n')]],
  ['long names that need continuation areas', Array.from({ length: 12 }, (_, i) => f(`${'日'.repeat(60)}-${i}`))],
] as const) {
  test(`ER sits in the root '.' record (SP first, no CE to it); Rock Ridge is detected by every reader: ${what}`, (t) => {
    const tmp = tempDir();
    t.after(tmp.cleanup);
    const bytes = buildIso({ label: 'cidata', files: [...files], timestamp: ts });
    const entries = rootDotEntries(bytes);
    assert.deepEqual(
      entries.map(([sig]) => sig),
      ['SP', 'ER', 'PX', 'TF', 'NM'],
    );
    const er = entries[1][1];
    // SUSP 5.5: len_id, len_des, len_src, version 1; the id Linux, libisofs
    // and the other readers match.
    assert.equal(er[3], 1);
    assert.equal(er[4], 10);
    assert.equal(er[7], 1);
    assert.equal(er[2], 8 + er[4] + er[5] + er[6]);
    assert.equal(new TextDecoder().decode(er.subarray(8, 18)), 'RRIP_1991A');

    const iso = writeImage(tmp.dir, 'er.iso', bytes);
    const expected = files.map((x) => x.path).sort();
    // isoinfo: finds the RR signatures and lists the real names.
    assert.match(run('isoinfo', ['-d', '-i', iso]).stdout.toString(), /Rock Ridge signatures version 1 found/);
    assert.deepEqual(isoinfoPaths(iso, '-R'), expected);
    // libisofs only takes Rock Ridge when it finds an ER with a known id.
    const xr = run('xorriso', ['-indev', iso, '-toc']);
    const toc = xr.stderr + xr.stdout.toString();
    assert.match(toc, /ISO offers\s*: Rock_Ridge Joliet/);
    assert.match(toc, /ISO loaded\s*: Rock_Ridge/);
    assert.deepEqual(xorrisoFind(iso), expected);
    assert.deepEqual(sevenZipPaths(iso), expected);
    const out = join(tmp.dir, 'x');
    mkdirSync(out);
    const got = bsdtarExtract(iso, out);
    assert.deepEqual([...got.keys()].sort(), expected);
    const img = readIso(bytes);
    assert.deepEqual(img.extensions, { joliet: true, rockRidge: true });
    assert.equal(img.namesFrom, 'rockridge');
    assert.deepEqual(
      img.entries.map((e) => e.path),
      expected,
    );
    for (const file of files) assert.deepEqual(img.read(file.path), file.data);
    assert.equal(blkid(iso).TYPE, 'iso9660');
  });
}
