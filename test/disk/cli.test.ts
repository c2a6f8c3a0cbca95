// `vmseed build` and `vmseed inspect`, in-process through main() and once as
// a real subprocess; the images are checked with blkid/bsdtar, not only us.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync, existsSync } from 'node:fs';
import { join } from 'node:path';
import { runCli } from '../support/cli.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { blkid, bsdtarExtract, HERE, tempDir } from './tools.ts';
import { bigUserData } from './fixtures.ts';

const MAIN = join(HERE, '..', '..', 'src', 'main.ts');

const vmseed = (argv: string[], cwd: string, stdin = '') =>
  runCli(argv, cwd, { stdin, env: { SOURCE_DATE_EPOCH: '1767225600' } });

test('build nocloud from files (user-data on stdin), default meta-data; inspect and --cat', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'net.yaml'), 'version: 2\nethernets: {eth0: {dhcp4: true}}\n');
  const b = await vmseed(
    ['build', '--user-data', '-', '--network-config', 'net.yaml', '-o', 'seed.iso'],
    tmp.dir,
    '#cloud-config\nhostname: a\n',
  );
  assert.equal(b.code, 0, b.err);
  assert.match(
    b.out.toString(),
    /^seed\.iso: cidata, \d+ bytes, meta-data \(\d+\), user-data \(26\), network-config \(\d+\), sha256 [0-9a-f]{64}\n$/,
  );
  const iso = join(tmp.dir, 'seed.iso');
  assert.equal(blkid(iso).LABEL, 'cidata');
  const ex = join(tmp.dir, 'ex');
  mkdirSync(ex);
  const files = bsdtarExtract(iso, ex);
  assert.equal(files.get('user-data')!.toString(), '#cloud-config\nhostname: a\n');
  assert.deepEqual(JSON.parse(files.get('meta-data')!.toString()), { 'instance-id': 'iid-local01' });

  const i = await vmseed(['inspect', 'seed.iso'], tmp.dir);
  assert.equal(i.code, 0, i.err);
  const text = i.out.toString();
  assert.match(text, /^label: +cidata$/m);
  assert.match(text, /^datasource: +nocloud$/m);
  assert.match(text, /^ +26 +user-data$/m);
  assert.match(text, /^ +\d+ +network-config$/m);
  const cat = await vmseed(['inspect', 'seed.iso', '--cat', 'network-config'], tmp.dir);
  assert.equal(cat.code, 0);
  assert.equal(cat.out.toString(), 'version: 2\nethernets: {eth0: {dhcp4: true}}\n');
});

test('build configdrive with YAML meta-data, 1 MiB user-data and vendor-data; same input, same bytes', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), bigUserData(1 << 20));
  writeFileSync(join(tmp.dir, 'md.yaml'), 'uuid: 0b6e7a51-aaaa-4bbb-8ccc-0123456789ab\nhostname: cd1\n');
  writeFileSync(join(tmp.dir, 'vd.json'), '{"cloud_init": "#cloud-config\\n"}');
  const args = [
    'build',
    '--datasource',
    'configdrive',
    '--user-data',
    'ud',
    '--meta-data',
    'md.yaml',
    '--vendor-data',
    'vd.json',
  ];
  assert.equal((await vmseed([...args, '-o', 'a.iso'], tmp.dir)).code, 0);
  assert.equal((await vmseed([...args, '-o', 'b.iso'], tmp.dir)).code, 0);
  const a = readFileSync(join(tmp.dir, 'a.iso'));
  assert.ok(a.equals(readFileSync(join(tmp.dir, 'b.iso'))), 'SOURCE_DATE_EPOCH makes builds reproducible');
  assert.equal(blkid(join(tmp.dir, 'a.iso')).LABEL, 'config-2');
  const img = readIso(new Uint8Array(a));
  assert.deepEqual(
    img.entries.filter((e) => e.kind === 'file').map((e) => e.path),
    ['openstack/latest/meta_data.json', 'openstack/latest/user_data', 'openstack/latest/vendor_data.json'],
  );
  assert.deepEqual(JSON.parse(new TextDecoder().decode(img.read('openstack/latest/meta_data.json'))), {
    hostname: 'cd1',
    uuid: '0b6e7a51-aaaa-4bbb-8ccc-0123456789ab',
  });
  const i = await vmseed(['inspect', 'a.iso'], tmp.dir);
  assert.match(i.out.toString(), /^datasource: +configdrive$/m);
});

test('bad input: exit 2 with one clear line, nothing written', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  writeFileSync(join(tmp.dir, 'list.yaml'), '- a\n- b\n');
  writeFileSync(join(tmp.dir, 'broken.yaml'), 'a: [\n');
  const cases: Array<[string[], RegExp]> = [
    [['build', '--user-data', 'ud'], /-o OUT\.iso is required/],
    [['build', '-o', 'x.iso'], /--user-data is required/],
    [['build', '--user-data', 'missing', '-o', 'x.iso'], /--user-data missing: cannot read it \(ENOENT\)/],
    [
      ['build', '--datasource', 'vfat', '--user-data', 'ud', '-o', 'x.iso'],
      /--datasource: 'vfat' is not one of nocloud, configdrive/,
    ],
    [
      ['build', '--user-data', 'ud', '--meta-data', 'list.yaml', '-o', 'x.iso'],
      /METADATA_INVALID: --meta-data: must be a mapping/,
    ],
    [
      ['build', '--user-data', 'ud', '--meta-data', 'broken.yaml', '-o', 'x.iso'],
      /METADATA_INVALID: --meta-data: not valid JSON or YAML/,
    ],
    [
      ['build', '--datasource', 'configdrive', '--user-data', 'ud', '--meta-data', 'ud', '-o', 'x.iso'],
      /METADATA_INVALID/,
    ],
    [['build', '--user-data', '-', '--meta-data', '-', '-o', 'x.iso'], /stdin is already used by --user-data/],
    [['build', '--bogus'], /Unknown option '--bogus'/],
    [['inspect'], /give exactly one image file/],
    [['inspect', 'ud'], /ISO_NOT_AN_IMAGE/],
    [['inspect', 'missing.iso'], /cannot read it \(ENOENT\)/],
  ];
  for (const [argv, re] of cases) {
    const r = await vmseed(argv, tmp.dir);
    assert.equal(r.code, 2, argv.join(' '));
    assert.match(r.err, re, argv.join(' '));
    assert.equal(r.err.trimEnd().split('\n').length, 1, `one line: ${r.err}`);
    assert.equal(r.err.includes('#cloud-config'), false, 'no user-data in messages');
  }
  assert.ok(!existsSync(join(tmp.dir, 'x.iso')));
  assert.equal((await vmseed(['build', '--user-data', 'ud', '-o', 'ok.iso'], tmp.dir)).code, 0);
  const missing = await vmseed(['inspect', 'ok.iso', '--cat', 'nope'], tmp.dir);
  assert.equal(missing.code, 2);
  assert.match(missing.err, /no file 'nope' in the image/);
});

test('as a subprocess: bin entry point builds and inspects', (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  const node = process.execPath;
  const b = spawnSync(node, [MAIN, 'build', '--user-data', '-', '-o', join(tmp.dir, 's.iso')], {
    input: '#cloud-config\n',
  });
  assert.equal(b.status, 0, b.stderr.toString());
  const i = spawnSync(node, [MAIN, 'inspect', join(tmp.dir, 's.iso'), '--cat', 'user-data']);
  assert.equal(i.status, 0, i.stderr.toString());
  assert.equal(i.stdout.toString(), '#cloud-config\n');
  const bad = spawnSync(node, [MAIN, 'build', '--user-data', '-']);
  assert.equal(bad.status, 2);
  assert.equal(bad.stderr.toString(), 'vmseed build: -o OUT.iso is required\n');
});
