// `vmseed build --vmi` runs the agent's own rendering over manifests on disk:
// every case of the seed corpus that uses default options must come out of
// the CLI as an image whose files (read back by our reader and, for a sample,
// by bsdtar) are byte for byte the corpus' expected files, and every error
// case must exit 2 with its code.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, readdirSync, readFileSync, mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runCli } from '../support/cli.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { CORPUS_DIR, caseNames, readTree } from '../cloudinit/corpus-lib.ts';
import { bsdtarExtract, tempDir } from '../disk/tools.ts';

async function vmseed(argv: string[], cwd: string) {
  const r = await runCli(argv, cwd);
  return { ...r, out: r.out.toString() };
}

// Cases that change render options (options.json) are not what the CLI runs.
const cases = caseNames().filter((n) => !existsSync(join(CORPUS_DIR, n, 'options.json')));

function args(dir: string, out: string): string[] {
  const yamls = readdirSync(dir)
    .filter((f) => f.endsWith('.yaml'))
    .sort();
  const vmiFile = yamls.includes('vmi.yaml') ? 'vmi.yaml' : (yamls.find((f) => /^(vmi|vm)/.test(f)) ?? yamls[0]);
  const others = yamls.filter((f) => f !== vmiFile).flatMap((f) => ['--objects', join(dir, f)]);
  return ['build', '--vmi', join(dir, vmiFile), ...others, '-o', out];
}

test('the CLI covers most of the corpus', () => {
  assert.ok(cases.length >= 40, `only ${cases.length} cases`);
});

for (const name of cases) {
  const dir = join(CORPUS_DIR, name);
  const expectedDir = join(dir, 'expected');
  const errorFile = join(dir, 'expected-error.txt');
  if (existsSync(expectedDir)) {
    test(`build --vmi ${name}: image files equal the corpus`, async (t) => {
      const tmp = tempDir();
      t.after(tmp.cleanup);
      const out = join(tmp.dir, 'seed.iso');
      const r = await vmseed(args(dir, out), tmp.dir);
      assert.equal(r.code, 0, r.err);
      const image = readIso(readFileSync(out));
      const expected = readTree(expectedDir);
      const got = new Map(
        image.entries.filter((e) => e.kind === 'file').map((e) => [e.path, Buffer.from(image.read(e.path)!)]),
      );
      assert.deepEqual([...got.keys()].sort(), [...expected.keys()].sort());
      for (const [path, bytes] of expected) assert.ok(got.get(path)!.equals(bytes), `${path} differs`);
    });
  } else if (existsSync(errorFile)) {
    const code = readFileSync(errorFile, 'utf8').split('\n')[0];
    test(`build --vmi ${name}: exit 2 with ${code}`, async (t) => {
      const tmp = tempDir();
      t.after(tmp.cleanup);
      const out = join(tmp.dir, 'seed.iso');
      const r = await vmseed(args(dir, out), tmp.dir);
      assert.equal(r.code, 2);
      assert.match(r.err, new RegExp(`^vmseed build: ${code}: `));
      assert.equal(r.err.trimEnd().split('\n').length, 1, 'one line');
      assert.equal(existsSync(out), false, 'no image on failure');
    });
  }
}

test('build --vmi: the same VMI gives the same bytes, and bsdtar reads it', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = join(CORPUS_DIR, 'kv-configdrive-network-json');
  const a = join(tmp.dir, 'a.iso');
  const b = join(tmp.dir, 'b.iso');
  assert.equal((await vmseed(args(dir, a), tmp.dir)).code, 0);
  assert.equal((await vmseed(args(dir, b), tmp.dir)).code, 0);
  assert.ok(readFileSync(a).equals(readFileSync(b)));
  const ex = join(tmp.dir, 'ex');
  mkdirSync(ex);
  const files = bsdtarExtract(a, ex);
  for (const [path, bytes] of readTree(join(dir, 'expected'))) assert.ok(files.get(path)?.equals(bytes), path);
});

test('build --vmi refuses file-mode options and a file with no VMI', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const dir = join(CORPUS_DIR, 'kv-configdrive-network-json');
  const r = await vmseed([...args(dir, join(tmp.dir, 'x.iso')), '--user-data', 'u'], tmp.dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /--user-data cannot be combined with --vmi/);
  const secretsOnly = readdirSync(join(CORPUS_DIR, 'ann-secretref-data')).find((f) => f.startsWith('secret'));
  if (secretsOnly) {
    const s = await vmseed(
      ['build', '--vmi', join(CORPUS_DIR, 'ann-secretref-data', secretsOnly), '-o', join(tmp.dir, 'y.iso')],
      tmp.dir,
    );
    assert.equal(s.code, 2);
    assert.match(s.err, /expected exactly one VirtualMachineInstance/);
  }
});

test('build --vmi with a Secret in no file: the error names the Secret, the field and --objects as the fix', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const vmi = [
    'apiVersion: kubevirt.io/v1',
    'kind: VirtualMachineInstance',
    'metadata: {name: web, namespace: apps}',
    'spec:',
    '  domain: {devices: {}}',
    '  volumes:',
    '    - name: cloudinitdisk',
    '      cloudInitNoCloud: {secretRef: {name: web-userdata}}',
    '',
  ].join('\n');
  writeFileSync(join(tmp.dir, 'vmi.yaml'), vmi);
  const r = await vmseed(['build', '--vmi', 'vmi.yaml', '-o', 'seed.iso'], tmp.dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /^vmseed build: SECRET_NOT_FOUND: Secret apps\/web-userdata \(spec\.volumes\[0\]/);
  assert.match(r.err, /in neither vmi\.yaml nor an --objects file/);
  assert.match(r.err, /--objects FILE/);
  assert.doesNotMatch(r.err, /retries/, 'a one-shot build does not retry');
  assert.equal(existsSync(join(tmp.dir, 'seed.iso')), false);
  // With the Secret given, the same VMI builds.
  writeFileSync(
    join(tmp.dir, 'secret.yaml'),
    'apiVersion: v1\nkind: Secret\nmetadata: {name: web-userdata, namespace: apps}\nstringData: {userdata: "#cloud-config\\n"}\n',
  );
  const ok = await vmseed(['build', '--vmi', 'vmi.yaml', '--objects', 'secret.yaml', '-o', 'seed.iso'], tmp.dir);
  assert.equal(ok.code, 0, ok.err);
});
