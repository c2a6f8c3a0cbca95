// The image store's per-VMI records (VMI_RECORDS, e.g. the seed gate's
// `seed-gate-opened`): next to the VMI's images, written atomically, read
// without following links, gone with the images.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { ImageStore, MAX_RECORD_BYTES, type VmiRecord } from '../../src/disk/store.ts';
import { tempDir } from './tools.ts';

const key = { namespace: 'tenant', name: 'vm', uid: '6a8f0e43-5a4c-4b5f-9f38-2f3f7a1b2c3d' };

test("a record is written next to the VMI's images, read back, and removed with them", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  assert.equal(await store.readRecord(key, 'seed-gate-opened'), undefined, 'none yet (no directory either)');
  await store.writeRecord(key, 'seed-gate-opened', '{"a":1}\n');
  assert.equal(readFileSync(join(store.dirFor(key), 'seed-gate-opened'), 'utf8'), '{"a":1}\n');
  assert.equal(statSync(join(store.dirFor(key), 'seed-gate-opened')).mode & 0o777, 0o640, "the store's file mode");
  await store.writeRecord(key, 'seed-gate-opened', '{"a":2}\n');
  assert.equal(await store.readRecord(key, 'seed-gate-opened'), '{"a":2}\n');
  assert.deepEqual(readdirSync(store.dirFor(key)), ['seed-gate-opened'], 'no temporary left');
  const { path } = await store.write(key, 'nocloud', new Uint8Array(2048).fill(1));
  assert.deepEqual(
    (await store.list()).map((i) => i.path),
    [path],
    'a record is not an image',
  );
  await store.remove(key);
  assert.equal(existsSync(join(store.root, key.namespace)), false, 'images, record and directories gone');
});

test('only the known record names; a record over MAX_RECORD_BYTES is refused', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  await assert.rejects(store.writeRecord(key, '../escape' as VmiRecord, 'x'), {
    code: 'STORE_KEY_INVALID',
    field: 'record',
  });
  await assert.rejects(store.readRecord(key, 'nocloud.iso' as VmiRecord), { code: 'STORE_KEY_INVALID' });
  await assert.rejects(store.writeRecord(key, 'seed-gate-opened', 'x'.repeat(MAX_RECORD_BYTES + 1)), {
    code: 'INTERNAL',
    kind: 'terminal',
  });
  assert.equal(existsSync(store.root), false, 'nothing written');
});

test("a symlink, a FIFO or a directory at the record's name: never followed or opened; a write replaces a link or FIFO, refuses a directory", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  const dir = store.dirFor(key);
  mkdirSync(dir, { recursive: true });
  const victim = join(tmp.dir, 'victim');
  writeFileSync(victim, 'not a record');
  const at = join(dir, 'seed-gate-opened');
  symlinkSync(victim, at);
  assert.equal(await store.readRecord(key, 'seed-gate-opened'), undefined, 'a link is not read through');
  await store.writeRecord(key, 'seed-gate-opened', 'ours');
  assert.ok(lstatSync(at).isFile(), 'the link itself replaced');
  assert.equal(readFileSync(victim, 'utf8'), 'not a record');

  execFileSync('rm', [at]);
  execFileSync('mkfifo', [at]);
  assert.equal(await store.readRecord(key, 'seed-gate-opened'), undefined, 'a FIFO does not hang the read');
  await store.writeRecord(key, 'seed-gate-opened', 'ours');
  assert.equal(readFileSync(at, 'utf8'), 'ours');

  execFileSync('rm', [at]);
  mkdirSync(at);
  await assert.rejects(store.writeRecord(key, 'seed-gate-opened', 'ours'), {
    code: 'STORE_UNSAFE_PATH',
    kind: 'terminal',
  });
});

test("a VMI directory that is a symlink: reading and writing a record refuse it; a crash's record temporary is cleaned at start", async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const store = new ImageStore({ root: join(tmp.dir, 'state') });
  await store.writeRecord(key, 'seed-gate-opened', 'ours');
  const dir = store.dirFor(key);
  writeFileSync(join(dir, '.seed-gate-opened.tmp-abc-1'), 'half');
  assert.deepEqual(await store.cleanupTemporaries(), [join(dir, '.seed-gate-opened.tmp-abc-1')]);
  const elsewhere = join(tmp.dir, 'elsewhere');
  mkdirSync(elsewhere);
  writeFileSync(join(elsewhere, 'seed-gate-opened'), 'theirs');
  execFileSync('rm', ['-rf', dir]);
  symlinkSync(elsewhere, dir);
  await assert.rejects(store.readRecord(key, 'seed-gate-opened'), { code: 'STORE_UNSAFE_PATH' });
  await assert.rejects(store.writeRecord(key, 'seed-gate-opened', 'ours'), { code: 'STORE_UNSAFE_PATH' });
  assert.equal(readFileSync(join(elsewhere, 'seed-gate-opened'), 'utf8'), 'theirs');
});
