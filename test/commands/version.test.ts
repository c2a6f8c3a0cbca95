// `vmseed --version` prints the package's version and the Node.js it runs
// on, as the process started by the image's entrypoint does.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { promisify } from 'node:util';
import { ROOT } from '../support/manifests.ts';
import { runCli } from '../support/cli.ts';

const run = promisify(execFile);
const pkg = JSON.parse(readFileSync(ROOT + 'package.json', 'utf8')) as { version: string };

test('vmseed --version, -V and version print the package version and Node.js, exit 0', async () => {
  for (const flag of ['--version', '-V', 'version']) {
    const r = await runCli([flag], ROOT);
    assert.equal(r.code, 0, flag);
    assert.equal(r.out.toString(), `vmseed ${pkg.version} (Node.js ${process.version})\n`, flag);
    assert.equal(r.err, '');
  }
});

test('a spawned vmseed --version answers without loading any command', async () => {
  const { stdout } = await run(process.execPath, [ROOT + 'src/main.ts', '--version'], { timeout: 30_000 });
  assert.equal(stdout, `vmseed ${pkg.version} (Node.js ${process.version})\n`);
});

test('the usage text names --version', async () => {
  const r = await runCli(['--help'], ROOT);
  assert.match(r.out.toString(), /'vmseed --version'/);
});
