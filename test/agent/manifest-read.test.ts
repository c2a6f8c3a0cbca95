// Local-mode manifests are read with a budget and without blocking, against
// real files: a FIFO, a device, a file over the budget (also one that grows
// past it after the stat would be caught by the extra byte), and a symlink
// to a manifest (followed: ConfigMap volumes are symlinks). The source
// itself starts with a FIFO and an oversize file among the manifests, loads
// the others and shows the refusal.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { mkdir, mkdtemp, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { test } from 'node:test';
import pino from 'pino';
import { LocalDirSource } from '../../src/agent/local/local-vmi-source.ts';
import { MAX_MANIFEST_BYTES, readManifest } from '../../src/agent/local/manifest-read.ts';
import { VmseedError } from '../../src/errors.ts';

const vmi = (name: string) =>
  `apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: ${name}, namespace: default}\nspec: {domain: {}}\n`;

async function refusal(p: Promise<unknown>): Promise<VmseedError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof VmseedError, String(e));
    return e;
  }
  assert.fail('expected a refusal');
}

test('readManifest: regular files and symlinks to them; FIFOs, devices and oversize files refused', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-manifest-read-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeFile(join(dir, 'a.yaml'), vmi('a'));
  assert.equal(await readManifest(join(dir, 'a.yaml'), 'a.yaml'), vmi('a'));

  // A ConfigMap volume: name -> ..data/name.
  await mkdir(join(dir, '..data'));
  await writeFile(join(dir, '..data', 'cm.yaml'), vmi('cm'));
  await symlink('..data/cm.yaml', join(dir, 'cm.yaml'));
  assert.equal(await readManifest(join(dir, 'cm.yaml'), 'cm.yaml'), vmi('cm'));

  // No writer will ever open it: a blocking open would never return.
  execFileSync('mkfifo', [join(dir, 'fifo.yaml')]);
  const fifo = await refusal(readManifest(join(dir, 'fifo.yaml'), 'fifo.yaml'));
  assert.equal(fifo.code, 'MANIFEST_INVALID');
  assert.equal(fifo.field, 'fifo.yaml');
  await symlink('/dev/zero', join(dir, 'zero.yaml'));
  assert.equal((await refusal(readManifest(join(dir, 'zero.yaml'), 'zero.yaml'))).code, 'MANIFEST_INVALID');

  await writeFile(join(dir, 'big.yaml'), Buffer.alloc(MAX_MANIFEST_BYTES + 1, 0x20));
  const big = await refusal(readManifest(join(dir, 'big.yaml'), 'big.yaml'));
  assert.equal(big.code, 'MANIFEST_TOO_LARGE');
  assert.equal(big.kind, 'terminal');
  // At the budget exactly: read.
  assert.equal(
    (await readManifest(join(dir, 'big.yaml'), 'big.yaml', MAX_MANIFEST_BYTES + 1)).length,
    MAX_MANIFEST_BYTES + 1,
  );
  assert.equal((await refusal(readManifest(join(dir, 'a.yaml'), 'a.yaml', 10))).code, 'MANIFEST_TOO_LARGE');
});

test('the local source starts with a FIFO and an oversize file among the manifests and loads the rest', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-manifest-read-'));
  await writeFile(join(dir, 'a.yaml'), vmi('a'));
  execFileSync('mkfifo', [join(dir, 'b-fifo.yaml')]);
  await writeFile(join(dir, 'c-big.yaml'), `${vmi('c')}# ${'x'.repeat(MAX_MANIFEST_BYTES)}\n`);
  await writeFile(join(dir, 'd.yaml'), vmi('d'));
  const lines: string[] = [];
  const src = new LocalDirSource({
    dir,
    logger: pino({ level: 'warn' }, { write: (l: string) => void lines.push(l) }),
    onKey: () => {},
  });
  // One hook, watcher first: t.after hooks run in the order they were
  // added, and a directory removed under a running chokidar left an
  // fs.watch handle behind that kept this test file's process alive.
  t.after(async () => {
    await src.stop();
    await rm(dir, { recursive: true, force: true });
  });
  await src.start();
  assert.ok(src.get('default/a'));
  assert.ok(src.get('default/d'));
  assert.equal(src.get('default/c'), undefined, 'the oversize file is not parsed');
  const refused = lines
    .map((l) => JSON.parse(l) as { file?: string; code?: string })
    .filter((r) => r.code)
    .map((r) => `${r.file} ${r.code}`)
    .sort();
  assert.deepEqual(refused, ['b-fifo.yaml MANIFEST_INVALID', 'c-big.yaml MANIFEST_TOO_LARGE']);
});
