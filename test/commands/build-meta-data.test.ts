// `vmseed build --meta-data FILE` writes the user's file as given (like
// cloud-localds), after checking it is a mapping: comments and key order stay.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { runCli } from '../support/cli.ts';
import { bsdtarExtract, tempDir } from '../disk/tools.ts';
import { aliasBomb } from '../hostile/corpus.ts';

async function build(dir: string, args: string[]): Promise<Map<string, Buffer>> {
  const r = await runCli(['build', '--user-data', 'ud', ...args, '-o', 'seed.iso'], dir, {
    env: { SOURCE_DATE_EPOCH: '0' },
  });
  assert.equal(r.code, 0, r.err);
  const into = join(dir, `x${Math.random().toString(36).slice(2)}`);
  mkdirSync(into);
  return bsdtarExtract(join(dir, 'seed.iso'), into);
}

test('NoCloud: a YAML meta-data file is written byte for byte, comments and key order kept', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  const md =
    '# written by hand\nlocal-hostname: web1\ninstance-id: iid-web1   # keep this\npublic-keys:\n  "0": ssh-ed25519 AAAA x\n';
  writeFileSync(join(tmp.dir, 'md.yaml'), md);
  const files = await build(tmp.dir, ['--meta-data', 'md.yaml']);
  assert.equal(files.get('meta-data')!.toString(), md);
});

test('ConfigDrive: JSON meta-data is written as given; YAML becomes JSON (meta_data.json must be JSON)', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  const json = '{\n  "uuid": "0b6e7a51-aaaa-4bbb-8ccc-0123456789ab",\n  "hostname": "cd1"\n}\n';
  writeFileSync(join(tmp.dir, 'md.json'), json);
  let files = await build(tmp.dir, ['--datasource', 'configdrive', '--meta-data', 'md.json']);
  assert.equal(files.get('openstack/latest/meta_data.json')!.toString(), json);
  writeFileSync(join(tmp.dir, 'md.yaml'), '# a comment\nuuid: 0b6e7a51-aaaa-4bbb-8ccc-0123456789ab\nhostname: cd1\n');
  files = await build(tmp.dir, ['--datasource', 'configdrive', '--meta-data', 'md.yaml']);
  assert.deepEqual(JSON.parse(files.get('openstack/latest/meta_data.json')!.toString()), {
    uuid: '0b6e7a51-aaaa-4bbb-8ccc-0123456789ab',
    hostname: 'cd1',
  });
});

test('the file is still checked: a list or broken YAML is refused', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  writeFileSync(join(tmp.dir, 'list.yaml'), '- a\n');
  const r = await runCli(['build', '--user-data', 'ud', '--meta-data', 'list.yaml', '-o', 'x.iso'], tmp.dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /METADATA_INVALID/);
});

test('an empty or comment-only --meta-data is refused as no mapping, naming the default', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  for (const [file, text] of [
    ['empty.yaml', ''],
    ['comments.yaml', '# nothing yet\n'],
    ['null.yaml', 'null\n'],
  ]) {
    writeFileSync(join(tmp.dir, file), text);
    const r = await runCli(['build', '--user-data', 'ud', '--meta-data', file, '-o', 'x.iso'], tmp.dir);
    assert.equal(r.code, 2, file);
    assert.match(r.err, /METADATA_INVALID: --meta-data: the file holds no mapping/, file);
    assert.match(r.err, /leave out --meta-data/, file);
  }
});

test('an alias bomb or a deep nest in --meta-data is refused by the budgeted loader before anything is built', async (t) => {
  const tmp = tempDir();
  t.after(tmp.cleanup);
  writeFileSync(join(tmp.dir, 'ud'), '#cloud-config\n');
  writeFileSync(join(tmp.dir, 'bomb.yaml'), `instance-id: i\n${aliasBomb(8, 10)}\n`);
  writeFileSync(join(tmp.dir, 'deep.yaml'), `instance-id: i\ndeep: ${'['.repeat(1000)}${']'.repeat(1000)}\n`);
  for (const file of ['bomb.yaml', 'deep.yaml']) {
    const r = await runCli(['build', '--user-data', 'ud', '--meta-data', file, '-o', 'x.iso'], tmp.dir);
    assert.notEqual(r.code, 0, file);
    assert.match(r.err, /YAML_TOO_COMPLEX/, file);
  }
});
