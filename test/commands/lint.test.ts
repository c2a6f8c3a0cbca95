// `vmseed lint FILE` and `vmseed build --lint`: the agent's lint and
// cloud-init's schemas (the host's, DEFAULT_SCHEMA_DIR) over the owner's own
// files, one line per problem, exit 2 on errors. Run in-process through main().
import assert from 'node:assert/strict';
import { mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { runCli } from '../support/cli.ts';
import { DEFAULT_MAX_USER_DATA_BYTES } from '../../src/cloudinit/limits.ts';

const FILES: Record<string, string> = {
  'runcmd.yaml': '#cloud-config\nruncmd: "echo hi"\n',
  'clean.yaml': '#cloud-config\npackages: [curl]\nruncmd:\n  - [echo, hi]\n',
  'deprecated.yaml': '#cloud-config\napt_update: true\n',
  'bogus.yaml': '#cloud-config\nbogus: 1\n',
  'net.yaml': 'network:\n  version: 2\n  ethernets:\n    eth0:\n      dhcp4: true\n  bogus: 1\n',
  'net-clean.yaml': 'network:\n  version: 2\n  ethernets:\n    eth0:\n      dhcp4: true\n',
  'jinja.yaml': '## template: jinja\n#cloud-config\nruncmd:\n  - echo {{ v1.instance_id }}\n',
  'broken.yaml': '#cloud-config\nruncmd: [a\n',
  'plain.txt': 'echo hello\n',
};

describe('vmseed lint', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmseed-lint-'));
    for (const [name, text] of Object.entries(FILES)) await writeFile(join(dir, name), text);
  });
  after(() => rm(dir, { recursive: true, force: true }));

  const lines = (out: Buffer) => out.toString().trimEnd().split('\n');

  test('a schema error: its line, the summary, exit 2', async () => {
    const r = await runCli(['lint', 'runcmd.yaml'], dir);
    assert.equal(r.code, 2, r.err);
    assert.deepEqual(lines(r.out), [
      "runcmd.yaml: error: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1, cc_runcmd)",
      'runcmd.yaml: 1 error (cloud-init 25.1 schema, Debian 25.1.4-1+deb13u1)',
    ]);
  });

  test('a clean file: valid, exit 0', async () => {
    const r = await runCli(['lint', 'clean.yaml'], dir);
    assert.equal(r.code, 0, r.err);
    assert.deepEqual(lines(r.out), ['clean.yaml: valid (cloud-init 25.1 schema, Debian 25.1.4-1+deb13u1)']);
  });

  test('a deprecation only: its line, exit 0, in both releases', async () => {
    for (const release of ['25.1', '22.4']) {
      const r = await runCli(['lint', 'deprecated.yaml', '--cloud-init-version', release], dir);
      assert.equal(r.code, 0, r.err);
      const out = lines(r.out);
      assert.match(
        out[0],
        new RegExp(`^deprecated\\.yaml: deprecation: apt_update: .*\\(cloud-init ${release}, cc_package_update`),
      );
      assert.match(out[1], new RegExp(`^deprecated\\.yaml: 1 deprecation \\(cloud-init ${release} schema, Debian `));
    }
  });

  test('an unknown key: an error under 25.1, accepted by 22.4', async () => {
    const r25 = await runCli(['lint', 'bogus.yaml', '--cloud-init-version', '25.1'], dir);
    assert.equal(r25.code, 2, r25.err);
    assert.equal(
      lines(r25.out)[0],
      "bogus.yaml: error: bogus: Additional properties are not allowed ('bogus' was unexpected) (cloud-init 25.1, unknown)",
    );
    const r22 = await runCli(['lint', 'bogus.yaml', '--cloud-init-version', '22.4'], dir);
    assert.equal(r22.code, 0, r22.err);
    assert.deepEqual(lines(r22.out), ['bogus.yaml: valid (cloud-init 22.4 schema, Debian 22.4.2-1+deb12u4)']);
  });

  test('network-config v2: a bad key under 25.1; 22.4 has no network schema', async () => {
    const bad = await runCli(['lint', '--type', 'network-config', 'net.yaml'], dir);
    assert.equal(bad.code, 2, bad.err);
    assert.equal(
      lines(bad.out)[0],
      "net.yaml: error: network: Additional properties are not allowed ('bogus' was unexpected) (cloud-init 25.1, network-config)",
    );
    const clean = await runCli(['lint', '--type', 'network-config', 'net-clean.yaml'], dir);
    assert.equal(clean.code, 0, clean.err);
    assert.match(clean.out.toString(), /^net-clean\.yaml: valid \(cloud-init 25\.1 /);
    const old = await runCli(['lint', '--type', 'network-config', 'net.yaml', '--cloud-init-version', '22.4'], dir);
    assert.equal(old.code, 0, old.err);
    assert.match(lines(old.out)[0], /^net\.yaml: not checked: cloud-init 22\.4 ships no network-config schema$/);
  });

  test('a jinja template: not checked, exit 0', async () => {
    const r = await runCli(['lint', 'jinja.yaml'], dir);
    assert.equal(r.code, 0, r.err);
    const out = lines(r.out);
    assert.match(out[0], /^jinja\.yaml: not checked: a jinja template is rendered in the guest/);
    assert.match(out[1], /^jinja\.yaml: no problems found, 1 not checked \(cloud-init 25\.1 schema/);
  });

  test("the agent's lint: broken YAML and a missing header are errors", async () => {
    const broken = await runCli(['lint', 'broken.yaml'], dir);
    assert.equal(broken.code, 2, broken.err);
    assert.match(
      lines(broken.out)[0],
      /^broken\.yaml: error: USERDATA_CLOUDCONFIG_INVALID: user-data: #cloud-config is not valid YAML at line/,
    );
    const plain = await runCli(['lint', 'plain.txt'], dir);
    assert.equal(plain.code, 2, plain.err);
    assert.match(lines(plain.out)[0], /^plain\.txt: error: USERDATA_NO_HEADER: /);
  });

  test('stdin: -', async () => {
    const r = await runCli(['lint', '-'], dir, { stdin: FILES['runcmd.yaml'] });
    assert.equal(r.code, 2, r.err);
    assert.equal(
      lines(r.out)[0],
      "<stdin>: error: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1, cc_runcmd)",
    );
  });

  test('--json: the findings as one object', async () => {
    const r = await runCli(['lint', 'runcmd.yaml', '--json'], dir);
    assert.equal(r.code, 2, r.err);
    const j = JSON.parse(r.out.toString()) as { errors: number; release: string; findings: { path: string }[] };
    assert.equal(j.errors, 1);
    assert.equal(j.release, '25.1');
    assert.equal(j.findings[0].path, 'runcmd');
  });

  test('missing schema files: exit 1, naming the directory and the fix', async () => {
    const r = await runCli(['lint', 'runcmd.yaml', '--cloud-init-schemas', 'no-schemas'], dir);
    assert.equal(r.code, 1);
    const where = join(dir, 'no-schemas');
    assert.ok(r.err.includes(`not in ${where}`), r.err);
    assert.ok(r.err.includes(`scripts/fetch-cloud-init-schemas.sh ${where}`), r.err);
  });

  test('bad usage and unreadable or oversized files: exit 2 (the exit-code contract)', async () => {
    assert.match((await runCli(['lint'], dir)).err, /exactly one FILE/);
    assert.equal((await runCli(['lint', '--bogus', 'x'], dir)).code, 2);
    const v = await runCli(['lint', 'clean.yaml', '--cloud-init-version', '23.1'], dir);
    assert.equal(v.code, 2);
    assert.match(v.err, /--cloud-init-version: '23\.1' is not one of 22\.4, 25\.1/);
    const t = await runCli(['lint', 'clean.yaml', '--type', 'meta-data'], dir);
    assert.equal(t.code, 2);
    const missing = await runCli(['lint', 'nope.yaml'], dir);
    assert.equal(missing.code, 2);
    assert.match(missing.err, /nope\.yaml: cannot read it \(ENOENT\)/);
    await writeFile(join(dir, 'big.yaml'), `#cloud-config\n#${'x'.repeat(DEFAULT_MAX_USER_DATA_BYTES)}\n`);
    const big = await runCli(['lint', 'big.yaml'], dir);
    assert.equal(big.code, 2);
    assert.match(big.err, /big\.yaml: larger than 1048576 bytes, the most the agent takes/);
    const help = await runCli(['lint', '--help'], dir);
    assert.equal(help.code, 0);
    assert.match(help.out.toString(), /^usage: vmseed lint FILE/);
  });
});

describe('vmseed build --lint', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmseed-build-lint-'));
    for (const [name, text] of Object.entries(FILES)) await writeFile(join(dir, name), text);
  });
  after(() => rm(dir, { recursive: true, force: true }));
  const env = { SOURCE_DATE_EPOCH: '0' };

  test('errors: the lines on stderr, exit 2, no image written', async () => {
    const r = await runCli(['build', '--lint', '--user-data', 'runcmd.yaml', '-o', 'bad.iso'], dir, { env });
    assert.equal(r.code, 2, r.err);
    assert.ok(
      r.err.includes("runcmd.yaml: error: runcmd: 'echo hi' is not of type 'array' (cloud-init 25.1, cc_runcmd)\n"),
      r.err,
    );
    assert.match(r.err, /--lint found errors; bad\.iso not written/);
    await assert.rejects(stat(join(dir, 'bad.iso')), { code: 'ENOENT' });
  });

  test('network-config is checked too (nocloud)', async () => {
    const r = await runCli(
      ['build', '--lint', '--user-data', 'clean.yaml', '--network-config', 'net.yaml', '-o', 'net.iso'],
      dir,
      { env },
    );
    assert.equal(r.code, 2, r.err);
    assert.match(r.err, /^net\.yaml: error: network: Additional properties/m);
    await assert.rejects(stat(join(dir, 'net.iso')), { code: 'ENOENT' });
  });

  test('clean: the summary on stderr, the image written', async () => {
    const r = await runCli(['build', '--lint', '--user-data', 'deprecated.yaml', '-o', 'ok.iso'], dir, { env });
    assert.equal(r.code, 0, r.err);
    assert.match(r.err, /^deprecated\.yaml: 1 deprecation \(cloud-init 25\.1 schema/m);
    assert.ok((await stat(join(dir, 'ok.iso'))).size > 0);
  });

  test('--cloud-init-version 22.4 lets what 22.4 accepts through', async () => {
    const r = await runCli(
      ['build', '--lint', '--cloud-init-version', '22.4', '--user-data', 'bogus.yaml', '-o', 'old.iso'],
      dir,
      { env },
    );
    assert.equal(r.code, 0, r.err);
    assert.ok((await stat(join(dir, 'old.iso'))).size > 0);
  });

  test('the schema options go with --lint; missing schema files are exit 1', async () => {
    const r = await runCli(['build', '--cloud-init-version', '22.4', '--user-data', 'clean.yaml', '-o', 'x.iso'], dir);
    assert.equal(r.code, 2);
    assert.match(r.err, /--cloud-init-version goes with --lint/);
    const m = await runCli(
      ['build', '--lint', '--cloud-init-schemas', 'none', '--user-data', 'clean.yaml', '-o', 'x.iso'],
      dir,
    );
    assert.equal(m.code, 1);
    assert.match(m.err, /scripts\/fetch-cloud-init-schemas\.sh /);
    await assert.rejects(stat(join(dir, 'x.iso')), { code: 'ENOENT' });
  });
});
