// The state dir cannot be turned against the node: against real files, a
// symlinked or non-directory VMI (or namespace) directory is
// STORE_UNSAFE_PATH and left alone, what it points to untouched; a FIFO or a
// symlink named like an image is never opened or followed; only vmseed's own
// names are deleted.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createHash } from 'node:crypto';
import { existsSync, lstatSync, mkdirSync, readdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { ImageStore } from '../../src/disk/store.ts';
import { tempDir } from './tools.ts';

const key = { namespace: 'tenant', name: 'vm', uid: '6a8f0e43-5a4c-4b5f-9f38-2f3f7a1b2c3d' };
const sha = (b: Uint8Array) => createHash('sha256').update(b).digest('hex');
const image = (fill: number, size = 4096) => new Uint8Array(size).fill(fill);

// A directory outside the store with files that must survive.
function precious(dir: string): { dir: string; snapshot(): string } {
  const p = join(dir, 'precious');
  mkdirSync(p);
  writeFileSync(join(p, 'precious.conf'), 'keep me');
  writeFileSync(join(p, 'id_rsa'), 'secret key');
  writeFileSync(join(p, 'nocloud-0123456789abcdef.iso'), 'named like ours, not ours');
  writeFileSync(join(p, '.nocloud-0123456789abcdef.iso.tmp-abc'), 'named like a temporary');
  const snapshot = () =>
    readdirSync(p)
      .sort()
      .map((f) => `${f}=${readFileSync(join(p, f), 'utf8')}`)
      .join('\n');
  return { dir: p, snapshot };
}

for (const mode of ['synchronous calls', 'fs/promises'] as const) {
  const options = mode === 'fs/promises' ? { syncMaxBytes: 0 } : {};

  test(`a VMI directory that is a symlink: write, prune, remove refuse it with STORE_UNSAFE_PATH; its target is untouched (${mode})`, async (t) => {
    const tmp = tempDir();
    t.after(tmp.cleanup);
    const root = join(tmp.dir, 'state');
    const store = new ImageStore({ root, ...options });
    const written = await store.write(key, 'nocloud', image(1));
    const target = precious(tmp.dir);
    const before = target.snapshot();
    const vmiDir = store.dirFor(key);
    execFileSync('rm', ['-rf', vmiDir]);
    symlinkSync(target.dir, vmiDir);

    const rel = `tenant/vm_${key.uid}`;
    const unsafe = { code: 'STORE_UNSAFE_PATH', kind: 'terminal', field: rel };
    await assert.rejects(store.remove(key), unsafe);
    await assert.rejects(store.prune(key, written.path), unsafe);
    await assert.rejects(store.write(key, 'nocloud', image(2)), unsafe);
    await assert.rejects(store.write(key, 'nocloud', image(2, 300 * 1024)), unsafe);
    assert.equal(target.snapshot(), before);
    assert.ok(lstatSync(vmiDir).isSymbolicLink(), 'the link is left alone too');
    // Garbage collection neither lists through it nor cleans temporaries in it.
    assert.deepEqual(await store.list(), []);
    assert.deepEqual(await store.cleanupTemporaries(), []);
    assert.equal(target.snapshot(), before);
  });
}

test('a namespace directory that is a symlink, or a VMI "directory" that is a file: STORE_UNSAFE_PATH naming it', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const root = join(tmp.dir, 'state');
  mkdirSync(root);
  const target = precious(tmp.dir);
  const before = target.snapshot();
  symlinkSync(target.dir, join(root, 'tenant'));
  const store = new ImageStore({ root });
  await assert.rejects(store.write(key, 'nocloud', image(1)), { code: 'STORE_UNSAFE_PATH', field: 'tenant' });
  await assert.rejects(store.remove(key), { code: 'STORE_UNSAFE_PATH', field: 'tenant' });
  assert.deepEqual(await store.list(), []);
  assert.equal(target.snapshot(), before);

  const other = { ...key, namespace: 'other' };
  mkdirSync(join(root, 'other'));
  writeFileSync(store.dirFor(other), 'a file where a directory goes');
  await assert.rejects(store.write(other, 'nocloud', image(1)), {
    code: 'STORE_UNSAFE_PATH',
    field: `other/vm_${key.uid}`,
  });
  assert.equal(readFileSync(store.dirFor(other), 'utf8'), 'a file where a directory goes');
});

test('a FIFO named like an image: list skips it, hashing does not hang, write replaces the entry with the image', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  for (const syncMaxBytes of [undefined, 0]) {
    const store = new ImageStore({
      root: join(tmp.dir, `state-${syncMaxBytes ?? 'sync'}`),
      ...(syncMaxBytes === 0 ? { syncMaxBytes } : {}),
    });
    const bytes = image(7);
    const path = store.pathFor(key, 'nocloud', sha(bytes));
    mkdirSync(store.dirFor(key), { recursive: true });
    execFileSync('mkfifo', [path]);
    assert.deepEqual(await store.list(), []);
    assert.equal(await store.hashImage(path), undefined);
    assert.equal(await store.imageStat(path), undefined);
    const res = await store.write(key, 'nocloud', bytes);
    assert.equal(res.written, true);
    assert.ok(lstatSync(path).isFile());
    assert.deepEqual(new Uint8Array(readFileSync(path)), bytes);
    assert.equal(await store.hashImage(path), sha(bytes));
  }
});

test('a symlink named like an image (to a file of the same size) is replaced, never read or written through', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  const bytes = image(9);
  const victim = join(tmp.dir, 'victim');
  writeFileSync(victim, new Uint8Array(bytes.length).fill(9)); // same bytes: a follow would say "identical"
  const path = store.pathFor(key, 'nocloud', sha(bytes));
  mkdirSync(store.dirFor(key), { recursive: true });
  symlinkSync(victim, path);
  assert.equal(await store.hashImage(path), undefined, 'hashing does not follow it');
  assert.equal((await store.list()).length, 0);
  const res = await store.write(key, 'nocloud', bytes);
  assert.equal(res.written, true, 'not taken for the image through the link');
  assert.ok(lstatSync(path).isFile() && !lstatSync(path).isSymbolicLink());
  assert.ok(existsSync(victim));
  // A hash request for a path outside the root is refused outright.
  assert.equal(await store.hashImage(victim), undefined);
  assert.equal(await store.hashImage(join(store.root, '..', 'victim')), undefined);
});

test("remove() deletes only vmseed's own names: other files, '..'-laden names and directories named like images stay", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  const { path } = await store.write(key, 'nocloud', image(1));
  const dir = store.dirFor(key);
  const theirs = [
    'notes.txt',
    'nocloud-0123456789abcdef.iso.bak',
    '..nocloud-0123456789abcdef.iso',
    'x..iso',
    '.nocloud.iso.tmp-../x'.replace('/', '_'),
  ];
  for (const f of theirs) writeFileSync(join(dir, f), 'theirs');
  mkdirSync(join(dir, 'configdrive-0123456789abcdef.iso'));
  writeFileSync(join(dir, 'configdrive-0123456789abcdef.iso', 'inside'), 'theirs');
  writeFileSync(join(dir, '.nocloud-0123456789abcdef.iso.tmp-abc-1'), 'a temporary of ours');
  await store.remove(key);
  assert.ok(!existsSync(path));
  assert.deepEqual(readdirSync(dir).sort(), [...theirs, 'configdrive-0123456789abcdef.iso'].sort());
  assert.equal(readFileSync(join(dir, 'configdrive-0123456789abcdef.iso', 'inside'), 'utf8'), 'theirs');
});
