// The image store on a real temporary directory: atomic replace seen by
// concurrent readers, no rewrite when identical, crash temporaries cleaned,
// keys that could leave the root refused, a datasource switch cleans up.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import * as fsp from 'node:fs/promises';
import { existsSync, mkdirSync, readdirSync, statSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import * as fs from 'node:fs';
import { DEFAULT_SYNC_MAX_BYTES, ImageStore, type StoreFs, type StoreSyncFs } from '../../src/disk/store.ts';
import { VmseedError } from '../../src/errors.ts';
import { blkid, tempDir } from './tools.ts';
import { buildIso } from '../../src/disk/iso9660.ts';

const key = { namespace: 'default', name: 'vm-1', uid: '6a8f0e43-5a4c-4b5f-9f38-2f3f7a1b2c3d' };

function image(fill: number, size = 256 * 1024): Uint8Array {
  return new Uint8Array(size).fill(fill);
}

// 256 KiB images: at the threshold, so the default store takes the
// synchronous path; syncMaxBytes 0 forces the thread-pool path.
for (const [mode, syncMaxBytes] of [['synchronous calls', undefined], ['fs/promises', 0]] as const) {
test(`write (${mode}): atomic replace; concurrent readers only ever see a whole image`, async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir, syncMaxBytes });
  const path = store.pathFor(key, 'nocloud');
  assert.equal(path, join(tmp.dir, 'default', `vm-1_${key.uid}`, 'nocloud.iso'));
  await store.write(key, 'nocloud', image(1));
  let stop = false;
  let reads = 0;
  const readers = Array.from({ length: 3 }, async () => {
    while (!stop) {
      const data = await fsp.readFile(path);
      reads++;
      assert.equal(data.length, 256 * 1024, 'never a partial image');
      assert.ok(data.every((b) => b === data[0]), 'never a mix of two images');
    }
  });
  for (let i = 2; i < 40; i++) {
    const r = await store.write(key, 'nocloud', image(i), { fsync: i % 10 === 0 });
    assert.equal(r.written, true);
  }
  stop = true;
  await Promise.all(readers);
  assert.ok(reads > 0);
  assert.equal((await fsp.readFile(path))[0], 39);
  assert.equal(statSync(path).mode & 0o777, 0o640);
  assert.deepEqual(readdirSync(join(tmp.dir, 'default', `vm-1_${key.uid}`)), ['nocloud.iso'], 'no temporaries left');
});
}

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
  assert.notEqual(statSync(first.path).ino, ino);
  // Someone else changes the file in place (same size): the store notices.
  writeFileSync(first.path, image(9));
  assert.equal((await store.write(key, 'nocloud', image(8))).written, true);
  assert.equal((await fsp.readFile(first.path))[0], 8);
  // A fresh store (agent restart) compares with the file's content.
  assert.equal((await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(8))).written, false);
});

test('switching datasource leaves only the new image; list and remove', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const other = { namespace: 'prod', name: 'db.primary', uid: 'uid-2' };
  await store.write(key, 'nocloud', image(1, 10));
  await store.write(key, 'configdrive', image(2, 20));
  await store.write(other, 'nocloud', image(3, 30));
  assert.ok(!existsSync(store.pathFor(key, 'nocloud')));
  assert.deepEqual(await store.list(), [
    { ...key, datasource: 'configdrive', path: store.pathFor(key, 'configdrive'), size: 20 },
    { ...other, datasource: 'nocloud', path: store.pathFor(other, 'nocloud'), size: 30 },
  ]);
  await store.remove(key);
  await store.remove(key); // idempotent
  assert.deepEqual((await store.list()).map((s) => s.name), ['db.primary']);
  assert.ok(!existsSync(join(tmp.dir, 'default')), 'empty directories go too');
  assert.deepEqual(await new ImageStore({ root: join(tmp.dir, 'missing') }).list(), []);
});

test('cleanupTemporaries removes what a crash left mid-write, nothing else', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const { path } = await store.write(key, 'nocloud', image(1, 10));
  const dir = join(path, '..');
  writeFileSync(join(dir, '.nocloud.iso.tmp-abc123'), 'partial');
  writeFileSync(join(dir, '.configdrive.iso.tmp-def456'), 'partial');
  const removed = await store.cleanupTemporaries();
  assert.equal(removed.length, 2);
  assert.deepEqual(readdirSync(dir), ['nocloud.iso']);
});

test('a failed write leaves the old image and no temporary (fault-injecting fs)', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  await store.write(key, 'nocloud', image(1, 100));
  const failing: StoreFs = {
    ...(fsp as unknown as StoreFs),
    open: async (p, flags, mode) => {
      const fh = await fsp.open(p, flags, mode);
      return {
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
  const dir = join(tmp.dir, 'default', `vm-1_${key.uid}`);
  assert.deepEqual(readdirSync(dir), ['nocloud.iso']);
  assert.equal((await fsp.readFile(join(dir, 'nocloud.iso')))[0], 1);
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
    assert.throws(() => store.pathFor(k, 'nocloud'), { code: 'STORE_KEY_INVALID' }, JSON.stringify(k));
    await assert.rejects(store.write(k, 'nocloud', image(1, 1)), { code: 'STORE_KEY_INVALID' });
    await assert.rejects(store.remove(k), { code: 'STORE_KEY_INVALID' });
  }
  assert.throws(() => store.pathFor(key, '../x' as never), { code: 'STORE_KEY_INVALID' });
  assert.deepEqual(readdirSync(tmp.dir), ['root']);
  assert.deepEqual(readdirSync(join(tmp.dir, 'root')), []);
});

// node:fs with some synchronous calls replaced, and a log of the calls made.
function syncFs(log: string[], over: Partial<StoreSyncFs> = {}): StoreSyncFs {
  const real = fs as unknown as StoreSyncFs;
  const names = ['openSync', 'writeSync', 'fchmodSync', 'fsync', 'fstatSync', 'closeSync', 'renameSync', 'unlinkSync', 'mkdirSync', 'statSync', 'readFileSync'] as const;
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
  // A new VMI: its directory is created, so no stat of the image and no
  // failing open.
  assert.deepEqual(sync, [
    'mkdirSync', 'openSync', 'fchmodSync', 'fsync', 'fstatSync', 'renameSync', 'closeSync',
    'openSync', 'fsync', 'closeSync',
  ]);
  assert.ok(log.indexOf('writeSync') < log.indexOf('fsync'), 'data written before the file fsync');
  log.length = 0;
  // Without fsync nothing waits on the thread pool: the image is in place
  // before the returned promise is awaited.
  const pending = store.write(key, 'nocloud', image(2, 64 * 1024), { fsync: false });
  assert.equal(fs.readFileSync(store.pathFor(key, 'nocloud'))[0], 2);
  await pending;
  assert.deepEqual(log.filter((c) => c !== 'writeSync'), ['statSync', 'openSync', 'fchmodSync', 'fstatSync', 'renameSync', 'closeSync']);
  assert.equal((await fsp.readFile(store.pathFor(key, 'nocloud')))[0], 2);
  log.length = 0;
  const big = image(3, DEFAULT_SYNC_MAX_BYTES + 1);
  assert.equal((await store.write(key, 'nocloud', big)).written, true);
  assert.deepEqual(log, [], 'above the threshold nothing synchronous is called');
  assert.ok((await fsp.readFile(store.pathFor(key, 'nocloud'))).equals(big));
  assert.deepEqual(readdirSync(join(tmp.dir, 'default', `vm-1_${key.uid}`)), ['nocloud.iso']);
});

test('synchronous path: a failed write leaves the old image and no temporary', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = join(tmp.dir, 'default', `vm-1_${key.uid}`);
  await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(1, 100));
  const fail = (c: string) => () => {
    throw Object.assign(new Error(c), { code: c });
  };
  const cases: Array<[string, Partial<StoreSyncFs>]> = [
    ['ENOSPC', { writeSync: fail('ENOSPC') }], ['EPERM', { fchmodSync: fail('EPERM') }], ['EIO', { fsync: (_fd: number, cb: (err: Error | null) => void) => setImmediate(() => cb(Object.assign(new Error('EIO'), { code: 'EIO' }))) }], ['EXDEV', { renameSync: fail('EXDEV') }],
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
    assert.deepEqual(readdirSync(dir), ['nocloud.iso'], errno);
    assert.equal((await fsp.readFile(join(dir, 'nocloud.iso')))[0], 1);
  }
});

test('synchronous path: a crash between write and rename leaves the old image and a temporary the next start removes', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = join(tmp.dir, 'default', `vm-1_${key.uid}`);
  await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', image(1, 100));
  // The process "dies" at rename: nothing after it runs, not even the unlink.
  const died = () => {
    throw Object.assign(new Error('killed'), { code: 'EINTR' });
  };
  const dying = new ImageStore({ root: tmp.dir, syncFs: syncFs([], { renameSync: died, unlinkSync: died }) });
  await assert.rejects(dying.write(key, 'nocloud', image(2, 100)), { code: 'STORE_IO_FAILED' });
  assert.equal(readdirSync(dir).length, 2);
  assert.equal((await fsp.readFile(join(dir, 'nocloud.iso')))[0], 1, 'readers still see the whole old image');
  const restarted = new ImageStore({ root: tmp.dir });
  assert.equal((await restarted.cleanupTemporaries()).length, 1);
  assert.deepEqual(readdirSync(dir), ['nocloud.iso']);
  assert.equal((await restarted.write(key, 'nocloud', image(2, 100))).written, true);
  assert.equal((await fsp.readFile(join(dir, 'nocloud.iso')))[0], 2);
});

test('synchronous path: an ISO image\'s zero system area is left as a hole; the file reads back byte for byte', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const iso = buildIso({ label: 'cidata', files: [{ path: 'user-data', data: new Uint8Array(20_000).fill(0x61) }, { path: 'meta-data', data: new Uint8Array(10).fill(0x62) }], timestamp: new Date(0) });
  const { path } = await store.write(key, 'nocloud', iso);
  assert.ok((await fsp.readFile(path)).equals(iso));
  const st = statSync(path);
  assert.equal(st.size, iso.length);
  assert.ok(st.blocks * 512 <= iso.length - 32 * 1024, `${st.blocks * 512} bytes allocated for ${iso.length}`);
  assert.equal(blkid(path).LABEL, 'cidata');
  // Non-zero first bytes are written whole.
  const other = image(5, 64 * 1024);
  await store.write(key, 'nocloud', other);
  assert.ok((await fsp.readFile(path)).equals(other));
  // An unchanged image is recognised by a fresh store too (reads the hole as zeros).
  await store.write(key, 'nocloud', iso);
  assert.equal((await new ImageStore({ root: tmp.dir }).write(key, 'nocloud', iso)).written, false);
});

test('synchronous path: a directory removed behind the store\'s back is recreated', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: tmp.dir });
  const { path } = await store.write(key, 'nocloud', image(1, 100));
  fs.rmSync(join(tmp.dir, 'default'), { recursive: true });
  assert.equal((await store.write(key, 'nocloud', image(2, 100))).written, true);
  assert.equal((await fsp.readFile(path))[0], 2);
});
