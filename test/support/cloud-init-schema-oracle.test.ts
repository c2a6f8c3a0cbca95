// The schema oracle reports what each real cloud-init release says about a
// file: errors and deprecations apart, at cloud-init's own dotted paths, and
// the same problems its `cloud-init schema` CLI prints.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import {
  runCloudInitSchemaCli,
  runSchemaOracle,
  type OracleFileType,
  type OracleRelease,
  type OracleResult,
} from './cloud-init-schema-oracle.ts';

const FILES: Record<string, { type: OracleFileType; text: string }> = {
  runcmdString: { type: 'cloud-config', text: '#cloud-config\nruncmd: "echo hi"\n' },
  sudoTrue: { type: 'cloud-config', text: '#cloud-config\nusers: [{name: bob, sudo: true}]\n' },
  clean: { type: 'cloud-config', text: '#cloud-config\nruncmd: [ls]\n' },
  // apt_update is `"deprecated": true` in both releases' schema-cloud-config-v1.json.
  deprecated: { type: 'cloud-config', text: '#cloud-config\napt_update: true\n' },
  deprecatedAndError: { type: 'cloud-config', text: '#cloud-config\napt_update: true\nruncmd: 3\n' },
  unknownTopLevel: { type: 'cloud-config', text: '#cloud-config\nruncmd: [ls]\nbogus_key: 1\n' },
  networkV2BadKey: {
    type: 'network-config',
    text: 'network:\n  version: 2\n  bogus: 1\n  ethernets:\n    eth0:\n      dhcp4: true\n',
  },
  networkV2Clean: {
    type: 'network-config',
    text: 'network:\n  version: 2\n  ethernets:\n    eth0:\n      dhcp4: true\n',
  },
};

let dir: string;
const file = (name: keyof typeof FILES) => path.join(dir, `${name}.yaml`);
const paths = (ps: { path: string }[]) => ps.map((p) => p.path);

before(async () => {
  dir = await mkdtemp(path.join(tmpdir(), 'vmseed-schema-oracle-'));
  for (const [name, f] of Object.entries(FILES)) await writeFile(path.join(dir, `${name}.yaml`), f.text);
});
after(() => rm(dir, { recursive: true, force: true }));

async function oracle(release: OracleRelease): Promise<Record<string, OracleResult>> {
  const results = await runSchemaOracle(
    release,
    Object.entries(FILES).map(([name, f]) => ({ path: path.join(dir, `${name}.yaml`), type: f.type })),
  );
  return Object.fromEntries(Object.keys(FILES).map((name) => [name, results.get(file(name))!]));
}

for (const release of ['22.4', '25.1'] as const) {
  describe(`cloud-init ${release}`, () => {
    let r: Record<string, OracleResult>;
    before(async () => {
      r = await oracle(release);
    });

    test('a string where runcmd wants a list is an error at `runcmd`', () => {
      assert.deepEqual(r.runcmdString.errors, [{ path: 'runcmd', message: "'echo hi' is not of type 'array'" }]);
      assert.deepEqual(r.runcmdString.deprecations, []);
      assert.equal(r.runcmdString.exception, undefined);
    });

    test('sudo: true is no error but a deprecation at `users.0.sudo` (the boolean branch is deprecated)', () => {
      assert.deepEqual(r.sudoTrue.errors, []);
      assert.deepEqual(paths(r.sudoTrue.deprecations), ['users.0.sudo']);
      assert.match(r.sudoTrue.deprecations[0].message, /``false``/);
    });

    test('a clean file has neither errors nor deprecations', () => {
      assert.deepEqual(r.clean, { errors: [], deprecations: [] });
    });

    test('a deprecated key lands in deprecations, not errors, with or without errors beside it', () => {
      assert.deepEqual(r.deprecated.errors, []);
      assert.deepEqual(paths(r.deprecated.deprecations), ['apt_update']);
      assert.match(
        r.deprecated.deprecations[0].message,
        release === '22.4' ? /^DEPRECATED: .*package_update/ : /^ Deprecated in version 22\.2\. .*package_update/,
      );
      // 25.1's validate_cloudconfig_file re-raises with the errors only.
      assert.deepEqual(paths(r.deprecatedAndError.errors), ['runcmd']);
      assert.deepEqual(r.deprecatedAndError.deprecations, r.deprecated.deprecations);
    });

    test('an unknown top-level key: 22.4 allows it, 25.1 reports it at its own name', () => {
      if (release === '22.4') assert.deepEqual(r.unknownTopLevel, { errors: [], deprecations: [] });
      else
        assert.deepEqual(r.unknownTopLevel.errors, [
          { path: 'bogus_key', message: "Additional properties are not allowed ('bogus_key' was unexpected)" },
        ]);
    });

    test('network-config v2: 22.4 has no schema for it, 25.1 reports a bad key at its parent', () => {
      if (release === '22.4') {
        assert.equal(r.networkV2BadKey.unsupported, true);
        assert.equal(r.networkV2Clean.unsupported, true);
      } else {
        assert.deepEqual(r.networkV2BadKey.errors, [
          { path: 'network', message: "Additional properties are not allowed ('bogus' was unexpected)" },
        ]);
        assert.deepEqual(r.networkV2Clean, { errors: [], deprecations: [] });
      }
    });

    test('the CLI fails on the runcmd file and prints the same problem', async () => {
      const cli = await runCloudInitSchemaCli(release, file('runcmdString'));
      assert.notEqual(cli.code, 0);
      const problem = r.runcmdString.errors[0];
      assert.ok(
        (cli.stdout + cli.stderr).includes(`${problem.path}: ${problem.message}`),
        `${cli.stdout}\n${cli.stderr}`,
      );
    });

    test('the CLI prints the deprecation the oracle reports, and exits 0 for it alone', async () => {
      const cli = await runCloudInitSchemaCli(release, file('deprecated'));
      assert.equal(cli.code, 0, cli.stderr);
      const d = r.deprecated.deprecations[0];
      assert.ok(
        cli.stdout.includes(`Cloud config schema deprecations: ${d.path}: ${d.message}`),
        `${cli.stdout}\n${cli.stderr}`,
      );
    });
  });
}

test('one process validates 100 files well under 10 s', async () => {
  const files = Array.from({ length: 100 }, (_, i) => ({
    path: path.join(dir, `batch-${i}.yaml`),
    type: 'cloud-config' as const,
  }));
  for (const [i, f] of files.entries()) await writeFile(f.path, `#cloud-config\nruncmd: ${i % 2 === 0 ? '[ls]' : i}\n`);
  const started = performance.now();
  const results = await runSchemaOracle('25.1', files);
  const seconds = (performance.now() - started) / 1000;
  assert.ok(seconds < 10, `${seconds.toFixed(1)} s`);
  assert.equal(results.size, 100);
  for (const [i, f] of files.entries())
    assert.deepEqual(paths(results.get(f.path)!.errors), i % 2 === 0 ? [] : ['runcmd'], f.path);
});
