// The image store on a real temporary directory: content-addressed names
// (a new seed is a new file, the old one stays until prune), atomic writes
// seen by concurrent readers, no rewrite when identical, crash temporaries
// cleaned, keys that could leave the root refused.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fsp from 'node:fs/promises';
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import * as fs from 'node:fs';
import { createHash } from 'node:crypto';
import { DEFAULT_SYNC_MAX_BYTES, ImageStore, type StoreFs, type StoreSyncFs } from '../../src/disk/store.ts';
import { VmseedError } from '../../src/errors.ts';
import { blkid, tempDir } from './tools.ts';
import { buildIso } from '../../src/disk/iso9660.ts';

const key = { namespace: 'default', name: 'vm-1', uid: '6a8f0e43-5a4c-4b5f-9f38-2f3f7a1b2c3d' };

function image(fill: number, size = 256 * 1024): Uint8Array {
  return new Uint8Array(size).fill(fill);
}

function sha(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

const vmiDir = (root: string) => join(root, 'default', `vm-1_${key.uid}`);

// 256 KiB images: at the threshold, so the default store takes the
// synchronous path; syncMaxBytes 0 forces the thread-pool path.
for (const [mode, syncMaxBytes] of [
  ['synchronous calls', undefined],
  ['fs/promises', 0],
] as const) {
  test(`write (${mode}): each seed its own content-addressed file; readers of a path only ever see that whole image`, async (t) => {
    const tmp = tempDir();
    t.after(tmp.cleanup);
    const store = new ImageStore({ root: tmp.dir, syncMaxBytes });
    const v1 = image(1);
    const path = store.pathFor(key, 'nocloud', sha(v1));
    assert.equal(path, join(vmiDir(tmp.dir), `nocloud-${sha(v1).slice(0, 16)}.iso`));
    assert.deepEqual(await store.write(key, 'nocloud', v1), { path, written: true });
    let stop = false;
    let reads = 0;
    const readers = Array.from({ length: 3 }, async () => {
      while (!stop) {
        const data = await fsp.readFile(path);
        reads++;
        assert.equal(data.length, 256 * 1024, 'never a partial image');
        assert.ok(
          data.every((b) => b === 1),
          'the path keeps its content',
        );
      }
    });
    const paths = new Set([path]);
    for (let i = 2; i < 40; i++) {
      const r = await store.write(key, 'nocloud', image(i), { fsync: i % 10 === 0 });
      assert.equal(r.written, true);
      assert.equal(r.path, store.pathFor(key, 'nocloud', sha(image(i))));
      paths.add(r.path);
    }
    stop = true;
    await Promise.all(readers);
    assert.ok(reads > 0);
    assert.equal(paths.size, 39, 'a distinct path per content');
    const last = store.pathFor(key, 'nocloud', sha(image(39)));
    assert.equal((await fsp.readFile(last))[0], 39);
    assert.equal(statSync(last).mode & 0o777, 0o640);
    assert.deepEqual(
      readdirSync(vmiDir(tmp.dir)).sort(),
      [...paths].map((p) => basename(p)).sort(),
      'older images kept until prune, no temporaries left',
    );
  });
}

test('v1 then v2: two paths, v1 untouched (same inode) until prune removes it', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const v1 = await store.write(key, 'nocloud', image(1, 100));
  const ino1 = statSync(v1.path).ino;
  const v2 = await store.write(key, 'nocloud', image(2, 100));
  assert.notEqual(v2.path, v1.path);
  assert.equal(statSync(v1.path).ino, ino1, 'the inode a running QEMU holds is not replaced');
  assert.equal((await fsp.readFile(v1.path))[0], 1);
  assert.equal((await fsp.readFile(v2.path))[0], 2);
  assert.deepEqual(await store.prune(key, v2.path), [v1.path]);
  assert.deepEqual(readdirSync(vmiDir(tmp.dir)), [basename(v2.path)]);
  assert.deepEqual(await store.prune(key, v2.path), [], 'idempotent');
  // v1 again (a rollback) is written anew under its name.
  assert.deepEqual(await store.write(key, 'nocloud', image(1, 100)), { path: v1.path, written: true });
  await store.prune({ ...key, uid: 'never-written' }, '/nowhere');
});

test('an identical image is not rewritten (same inode, written: false)', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir, fileMode: 0o600 });
  const first = await store.write(key, 'nocloud', image(7));
  assert.equal(first.written, true);
  const ino = statSync(first.path).ino;
  const again = await store.write(key, 'nocloud', image(7));
  assert.deepEqual(again, { path: first.path, written: false });
  assert.equal(statSync(first.path).ino, ino);
  assert.equal(statSync(first.path).mode & 0o777, 0o600);
  const changed = await store.write(key, 'nocloud', image(8));
  assert.equal(changed.written, true);
  assert.notEqual(changed.path, first.path);
  assert.equal(statSync(first.path).ino, ino);
  // Someone else changes the file in place (same size): the store notices.
  writeFileSync(changed.path, image(9));
  assert.equal((await store.write(key, 'nocloud', image(8))).written, true);
  assert.equal((await fsp.readFile(changed.path))[0], 8);
  // A fresh store (agent restart) compares with the file's content.
  assert.equal((await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(8))).written, false);
  // A caller-provided digest names the file; an invalid one is refused.
  assert.equal((await store.write(key, 'nocloud', image(8), { sha256: sha(image(8)) })).written, false);
  assert.throws(() => store.pathFor(key, 'nocloud', 'XYZ'), { code: 'STORE_KEY_INVALID' });
});

test('switching datasource: both images until prune; list (with sha16) and remove', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const other = { namespace: 'prod', name: 'db.primary', uid: 'uid-2' };
  const nc = await store.write(key, 'nocloud', image(1, 10));
  const cd = await store.write(key, 'configdrive', image(2, 20));
  const o = await store.write(other, 'nocloud', image(3, 30));
  assert.ok(existsSync(nc.path), 'write() never deletes');
  writeFileSync(join(vmiDir(tmp.dir), 'notes.txt'), 'not ours');
  assert.deepEqual(await store.list(), [
    { ...key, datasource: 'configdrive', sha16: sha(image(2, 20)).slice(0, 16), path: cd.path, size: 20 },
    { ...key, datasource: 'nocloud', sha16: sha(image(1, 10)).slice(0, 16), path: nc.path, size: 10 },
    { ...other, datasource: 'nocloud', sha16: sha(image(3, 30)).slice(0, 16), path: o.path, size: 30 },
  ]);
  assert.equal((await store.prune(key, cd.path)).length, 1);
  assert.deepEqual(readdirSync(vmiDir(tmp.dir)).sort(), [basename(cd.path), 'notes.txt']);
  await store.remove(key);
  // Only vmseed's own names are deleted: a file someone else put there
  // stays, and so does its directory.
  assert.deepEqual(readdirSync(vmiDir(tmp.dir)), ['notes.txt']);
  fs.unlinkSync(join(vmiDir(tmp.dir), 'notes.txt'));
  await store.remove(key);
  await store.remove(key); // idempotent
  assert.deepEqual(
    (await store.list()).map((s) => s.name),
    ['db.primary'],
  );
  assert.ok(!existsSync(join(tmp.dir, 'default')), 'empty directories go too');
  assert.deepEqual(await new ImageStore({ root: join(tmp.dir, 'missing') }).list(), []);
});

test('cleanupTemporaries removes what a crash left mid-write, nothing else', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const { path } = await store.write(key, 'nocloud', image(1, 10));
  const dir = join(path, '..');
  writeFileSync(join(dir, `.${basename(path)}.tmp-abc123`), 'partial');
  writeFileSync(join(dir, '.configdrive-0123456789abcdef.iso.tmp-def456'), 'partial');
  const removed = await store.cleanupTemporaries();
  assert.equal(removed.length, 2);
  assert.deepEqual(readdirSync(dir), [basename(path)]);
});

test('a failed write leaves the old image and no temporary (fault-injecting fs)', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const old = await store.write(key, 'nocloud', image(1, 100));
  const failing: StoreFs = {
    ...(fsp as unknown as StoreFs),
    open: async (p, flags, mode) => {
      const fh = await fsp.open(p, flags, mode);
      return {
        read: (b: Uint8Array, o: number, l: number, p: number) => fh.read(b, o, l, p),
        writeFile: async () => {
          throw Object.assign(new Error('disk full'), { code: 'ENOSPC' });
        },
        chmod: (m: number) => fh.chmod(m),
        stat: () => fh.stat(),
        sync: () => fh.sync(),
        close: () => fh.close(),
      };
    },
  };
  const broken = new ImageStore({ root: tmp.dir, fs: failing });
  await assert.rejects(broken.write(key, 'nocloud', image(2, 100)), (e: unknown) => {
    assert.ok(e instanceof VmseedError);
    assert.equal(e.code, 'STORE_IO_FAILED');
    assert.equal(e.kind, 'retryable');
    assert.match(e.message, /ENOSPC/);
    return true;
  });
  assert.deepEqual(readdirSync(vmiDir(tmp.dir)), [basename(old.path)]);
  assert.equal((await fsp.readFile(old.path))[0], 1);
});

test('keys that could escape the root are refused with STORE_KEY_INVALID', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  mkdirSync(join(tmp.dir, 'root'));
  const store = new ImageStore({ root: join(tmp.dir, 'root') });
  const bad = [
    { ...key, namespace: '..' },
    { ...key, namespace: '../x' },
    { ...key, name: '..' },
    { ...key, name: 'a/../../b' },
    { ...key, name: 'a..b' },
    { ...key, uid: '../../etc' },
    { ...key, uid: '' },
    { ...key, name: 'x\0y' },
    { ...key, namespace: '/abs' },
    { ...key, name: 'UPPER' },
  ];
  for (const k of bad) {
    assert.throws(
      () => store.pathFor(k, 'nocloud', sha(image(1, 1))),
      { code: 'STORE_KEY_INVALID' },
      JSON.stringify(k),
    );
    await assert.rejects(store.write(k, 'nocloud', image(1, 1)), { code: 'STORE_KEY_INVALID' });
    await assert.rejects(store.remove(k), { code: 'STORE_KEY_INVALID' });
    await assert.rejects(store.prune(k, '/x'), { code: 'STORE_KEY_INVALID' });
  }
  assert.throws(() => store.pathFor(key, '../x' as never, sha(image(1, 1))), { code: 'STORE_KEY_INVALID' });
  assert.deepEqual(readdirSync(tmp.dir), ['root']);
  assert.deepEqual(readdirSync(join(tmp.dir, 'root')), []);
});

// node:fs with some synchronous calls replaced, and a log of the calls made.
function syncFs(log: string[], over: Partial<StoreSyncFs> = {}): StoreSyncFs {
  const real = fs as unknown as StoreSyncFs;
  const names = [
    'openSync',
    'writeSync',
    'fchmodSync',
    'fsync',
    'fstatSync',
    'closeSync',
    'renameSync',
    'unlinkSync',
    'mkdirSync',
    'lstatSync',
    'readSync',
  ] as const;
  const out: Record<string, unknown> = {};
  for (const n of names) {
    out[n] = (...args: unknown[]) => {
      log.push(n);
      return ((over[n] ?? real[n]) as (...a: unknown[]) => unknown)(...args);
    };
  }
  return out as unknown as StoreSyncFs;
}

test('small images go through synchronous calls, large ones through fs/promises; fsync order: file, rename, directory', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const log: string[] = [];
  const store = new ImageStore({ root: tmp.dir, syncFs: syncFs(log) });
  await store.write(key, 'nocloud', image(1, 64 * 1024), { fsync: true });
  const sync = log.filter((c) => c !== 'writeSync');
  // A new VMI: its namespace directory is not there yet (one lstat), its
  // directory is created, so no stat of the image and no failing open.
  assert.deepEqual(sync, [
    'lstatSync',
    'mkdirSync',
    'openSync',
    'fchmodSync',
    'fsync',
    'fstatSync',
    'renameSync',
    'closeSync',
    'openSync',
    'fsync',
    'closeSync',
  ]);
  assert.ok(log.indexOf('writeSync') < log.indexOf('fsync'), 'data written before the file fsync');
  log.length = 0;
  // Without fsync nothing waits on the thread pool: the image is in place
  // before the returned promise is awaited.
  const pending = store.write(key, 'nocloud', image(2, 64 * 1024), { fsync: false });
  const p2 = store.pathFor(key, 'nocloud', sha(image(2, 64 * 1024)));
  assert.equal(fs.readFileSync(p2)[0], 2);
  await pending;
  // Namespace and VMI directories lstat'ed (not symlinks), then the image.
  assert.deepEqual(
    log.filter((c) => c !== 'writeSync'),
    ['lstatSync', 'lstatSync', 'lstatSync', 'openSync', 'fchmodSync', 'fstatSync', 'renameSync', 'closeSync'],
  );
  assert.equal((await fsp.readFile(p2))[0], 2);
  log.length = 0;
  const big = image(3, DEFAULT_SYNC_MAX_BYTES + 1);
  assert.equal((await store.write(key, 'nocloud', big)).written, true);
  assert.deepEqual(log, [], 'above the threshold nothing synchronous is called');
  assert.ok((await fsp.readFile(store.pathFor(key, 'nocloud', sha(big)))).equals(big));
  assert.equal(readdirSync(vmiDir(tmp.dir)).length, 3, 'three images, no temporaries');
});

test('synchronous path: a failed write leaves the old image and no temporary', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = vmiDir(tmp.dir);
  const old = await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(1, 100));
  const fail = (c: string) => () => {
    throw Object.assign(new Error(c), { code: c });
  };
  const cases: Array<[string, Partial<StoreSyncFs>]> = [
    ['ENOSPC', { writeSync: fail('ENOSPC') }],
    ['EPERM', { fchmodSync: fail('EPERM') }],
    [
      'EIO',
      {
        fsync: (_fd: number, cb: (err: Error | null) => void) =>
          setImmediate(() => cb(Object.assign(new Error('EIO'), { code: 'EIO' }))),
      },
    ],
    ['EXDEV', { renameSync: fail('EXDEV') }],
  ];
  for (const [errno, over] of cases) {
    const store = new ImageStore({ root: tmp.dir, syncFs: syncFs([], over) });
    await assert.rejects(store.write(key, 'nocloud', image(2, 100), { fsync: true }), (e: unknown) => {
      assert.ok(e instanceof VmseedError);
      assert.equal(e.code, 'STORE_IO_FAILED');
      assert.equal(e.kind, 'retryable');
      assert.match(e.message, new RegExp(errno));
      return true;
    });
    assert.deepEqual(readdirSync(dir), [basename(old.path)], errno);
    assert.equal((await fsp.readFile(old.path))[0], 1);
  }
});

test('synchronous path: a crash between write and rename leaves the old image and a temporary the next start removes', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = vmiDir(tmp.dir);
  const old = await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(1, 100));
  // The process "dies" at rename: nothing after it runs, not even the unlink.
  const died = () => {
    throw Object.assign(new Error('killed'), { code: 'EINTR' });
  };
  const dying = new ImageStore({ root: tmp.dir, syncFs: syncFs([], { renameSync: died, unlinkSync: died }) });
  await assert.rejects(dying.write(key, 'nocloud', image(2, 100)), { code: 'STORE_IO_FAILED' });
  assert.equal(readdirSync(dir).length, 2);
  assert.equal((await fsp.readFile(old.path))[0], 1, 'readers still see the whole old image');
  const restarted = new ImageStore({ root: tmp.dir });
  assert.equal((await restarted.cleanupTemporaries()).length, 1);
  assert.deepEqual(readdirSync(dir), [basename(old.path)]);
  const v2 = await restarted.write(key, 'nocloud', image(2, 100));
  assert.equal(v2.written, true);
  assert.equal((await fsp.readFile(v2.path))[0], 2);
});

test("synchronous path: an ISO image's zero system area is left as a hole; the file reads back byte for byte", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const iso = buildIso({
    label: 'cidata',
    files: [
      { path: 'user-data', data: new Uint8Array(20_000).fill(0x61) },
      { path: 'meta-data', data: new Uint8Array(10).fill(0x62) },
    ],
    timestamp: new Date(0),
  });
  const { path } = await store.write(key, 'nocloud', iso);
  assert.ok((await fsp.readFile(path)).equals(iso));
  const st = statSync(path);
  assert.equal(st.size, iso.length);
  assert.ok(st.blocks * 512 <= iso.length - 32 * 1024, `${st.blocks * 512} bytes allocated for ${iso.length}`);
  assert.equal(blkid(path).LABEL, 'cidata');
  // Non-zero first bytes are written whole.
  const other = image(5, 64 * 1024);
  assert.ok((await fsp.readFile((await store.write(key, 'nocloud', other)).path)).equals(other));
  // An unchanged image is recognised by a fresh store too (reads the hole as zeros).
  assert.equal((await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', iso)).written, false);
});

test("synchronous path: a directory removed behind the store's back is recreated", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  await store.write(key, 'nocloud', image(1, 100));
  fs.rmSync(join(tmp.dir, 'default'), { recursive: true });
  const { path, written } = await store.write(key, 'nocloud', image(2, 100));
  assert.equal(written, true);
  assert.equal((await fsp.readFile(path))[0], 2);
});

for (const [mode, syncMaxBytes] of [
  ['synchronous calls', undefined],
  ['fs/promises', 0],
] as const) {
  test(`write (${mode}): a signal aborted while the bytes are on their way leaves no image and no temporary, CANCELLED with its reason`, async (t) => {
    const tmp = tempDir();
    t.after(tmp.cleanup);
    const store = new ImageStore({ root: tmp.dir, syncMaxBytes });
    const bytes = image(7);
    const ac = new AbortController();
    const reason = new VmseedError('CANCELLED', 'VMI default/vm-1 was deleted; reconcile cancelled', {
      kind: 'retryable',
    });
    // The write's first steps run before its first await (fsync on the
    // synchronous path, the thread pool's writeFile on the other): the
    // abort lands while they are under way.
    const writing = store.write(key, 'nocloud', bytes, { fsync: true, signal: ac.signal });
    ac.abort(reason);
    await assert.rejects(writing, (e) => e === reason);
    assert.equal(existsSync(store.pathFor(key, 'nocloud', sha(bytes))), false, 'no image under its name');
    assert.deepEqual(existsSync(vmiDir(tmp.dir)) ? readdirSync(vmiDir(tmp.dir)) : [], [], 'no temporary left');
    // Not aborted: the same write goes through.
    assert.equal((await store.write(key, 'nocloud', bytes, { signal: new AbortController().signal })).written, true);
  });
}
