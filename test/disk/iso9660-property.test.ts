// Property: any valid tree (names, nesting, sizes 0..1 MiB) comes back
// byte for byte through bsdtar (libarchive) and through our reader.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import fc from 'fast-check';
import { buildIso, type IsoFile } from '../../src/disk/iso9660.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { bsdtarExtract, tempDir, writeImage } from './tools.ts';

// Letters in several cases, separators, and multi-byte UTF-8 (so long names
// overflow the directory record and go through a CE continuation area).
const CHARS = [...'abcXYZ019-_. ', 'é', 'Ü', '日', '~', '+', '='];
const nameArb = fc
  .oneof(
    { weight: 2, arbitrary: fc.array(fc.constantFrom(...CHARS), { minLength: 1, maxLength: 64 }) },
    // Long UTF-8 names: the Rock Ridge NM moves to a continuation area.
    { weight: 1, arbitrary: fc.array(fc.constantFrom('日', '本', '語'), { minLength: 48, maxLength: 64 }) },
  )
  .map((cs) => cs.join(''))
  .filter((n) => n !== '.' && n !== '..');

const fileArb = fc.record({
  // Mostly shared directory names, so directories fill up with several entries.
  dirs: fc.oneof(
    { weight: 1, arbitrary: fc.constant<string[]>([]) },
    {
      weight: 2,
      arbitrary: fc.array(
        fc.oneof(
          { weight: 3, arbitrary: fc.constantFrom('a', 'b', 'openstack', 'latest') },
          { weight: 1, arbitrary: nameArb },
        ),
        { maxLength: 4 },
      ),
    },
  ),
  name: nameArb,
  size: fc.oneof(
    { weight: 4, arbitrary: fc.integer({ min: 0, max: 5000 }) },
    { weight: 1, arbitrary: fc.integer({ min: 0, max: 1 << 20 }) },
  ),
  seed: fc.integer(),
});

function bytes(size: number, seed: number): Uint8Array {
  const out = new Uint8Array(size);
  let x = seed >>> 0 || 1;
  for (let i = 0; i < size; i++) {
    x ^= x << 13;
    x ^= x >>> 17;
    x ^= x << 5;
    out[i] = x & 0xff;
  }
  return out;
}

// Drops paths that repeat or that use a file as a directory (the writer
// rejects those; that is tested elsewhere).
function toFiles(specs: Array<{ dirs: string[]; name: string; size: number; seed: number }>): IsoFile[] {
  const files = new Map<string, IsoFile>();
  const dirs = new Set<string>();
  for (const s of specs) {
    const path = [...s.dirs, s.name].join('/');
    const prefixes = s.dirs.map((_, i) => s.dirs.slice(0, i + 1).join('/'));
    if (files.has(path) || dirs.has(path) || prefixes.some((p) => files.has(p))) continue;
    prefixes.forEach((p) => dirs.add(p));
    files.set(path, { path, data: bytes(s.size, s.seed) });
  }
  return [...files.values()];
}

test('random trees read back through bsdtar and our reader', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  let run = 0;
  fc.assert(
    fc.property(fc.array(fileArb, { minLength: 0, maxLength: 16 }), (specs) => {
      const files = toFiles(specs);
      const image = buildIso({ label: 'cidata', files, timestamp: new Date('2026-05-06T07:08:09Z') });
      assert.equal(image.length % 4096, 0);
      const img = readIso(image);
      assert.deepEqual(
        img.entries.filter((e) => e.kind === 'file').map((e) => e.path),
        files.map((f) => f.path).sort(),
      );
      for (const f of files) assert.ok(Buffer.from(img.read(f.path)!).equals(f.data), `reader: ${f.path}`);
      const dir = join(tmp.dir, String(run++));
      mkdirSync(dir);
      const iso = writeImage(tmp.dir, 'p.iso', image);
      const got = bsdtarExtract(iso, dir);
      assert.deepEqual([...got.keys()].sort(), files.map((f) => f.path).sort());
      for (const f of files) assert.ok(got.get(f.path)!.equals(f.data), `bsdtar: ${f.path}`);
      rmSync(dir, { recursive: true });
    }),
    { numRuns: 25 },
  );
});
