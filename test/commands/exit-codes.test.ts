// The exit-code contract of every subcommand (docs/reference/cli.md, "Exit codes"): 0 ok,
// 1 the work failed, 2 bad invocation or input. Run in-process; long-running
// commands (agent, cluster, redirect) are only given invocations they refuse
// before listening.
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { main } from '../../src/main.ts';

async function run(argv: string[], cwd: string): Promise<{ code: number; out: string; err: string }> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let out = '';
  let err = '';
  stdout.on('data', (c) => (out += c));
  stderr.on('data', (c) => (err += c));
  const code = await main(argv, {
    stdout,
    stderr,
    stdin: new PassThrough(),
    env: { SOURCE_DATE_EPOCH: '0' },
    cwd,
    stopSignal: AbortSignal.abort(new Error('test')),
  });
  return { code, out, err };
}

const UID = '3f1f5e6c-1111-4222-8333-944455556666';

// [subcommand, case, argv after the subcommand, exit code, stderr pattern]
// A missing input is '' where the command names no input file read at start:
// cluster's TLS and CA files and redirect's key file are re-read while it
// runs (a missing one fails /readyz), warm-cache takes no arguments.
const CASES: ReadonlyArray<[string, string, string[], 0 | 1 | 2, RegExp]> = [
  ['agent', '--help', ['--help'], 0, /^$/],
  ['agent', 'unknown flag', ['--bogus'], 2, /Unknown option '--bogus'/],
  ['agent', 'missing input', ['--local', 'nope'], 2, /--local .*nope: ENOENT/],
  ['cluster', '--help', ['--help'], 0, /^$/],
  ['cluster', 'unknown flag', ['--bogus'], 2, /Unknown option '--bogus'/],
  ['cluster', 'bad flag combination', ['--webhook-client-names', 'a'], 2, /needs --webhook-client-ca/],
  ['build', '--help', ['--help'], 0, /^$/],
  ['build', 'unknown flag', ['--bogus'], 2, /Unknown option '--bogus'/],
  ['build', 'missing required flag', ['--user-data', 'ud'], 2, /-o OUT\.iso is required/],
  [
    'build',
    'missing input',
    ['--user-data', 'nope', '-o', 'out.iso'],
    2,
    /--user-data nope: cannot read it \(ENOENT\)/,
  ],
  ['build', 'missing --vmi', ['--vmi', 'nope', '-o', 'out.iso'], 2, /--vmi nope: cannot read it \(ENOENT\)/],
  ['build', 'output is a directory', ['--user-data', 'ud', '-o', 'dir'], 2, /-o dir: is a directory/],
  [
    'build',
    'output dir missing',
    ['--user-data', 'ud', '-o', 'nodir/out.iso'],
    1,
    /cannot write nodir\/out\.iso \(ENOENT\)/,
  ],
  ['build', 'broken cloud-config', ['--user-data', 'bad', '-o', 'out.iso'], 2, /USERDATA_CLOUDCONFIG_INVALID/],
  ['inspect', '--help', ['--help'], 0, /^$/],
  ['inspect', 'unknown flag', ['--bogus', 'x.iso'], 2, /Unknown option '--bogus'/],
  ['inspect', 'missing input', ['nope.iso'], 2, /nope\.iso: cannot read it \(ENOENT\)/],
  ['redirect', '--help', ['--help'], 0, /^$/],
  ['redirect', 'unknown flag', ['--bogus'], 2, /Unknown option '--bogus'/],
  ['redirect', 'missing required flag', [], 2, /--to HOST:PORT is required/],
  ['redirect', 'bad --listen', ['--to', '127.0.0.1:8081', '--listen', 'x'], 2, /listen/],
  ['seed-url', '--help', ['--help'], 0, /^$/],
  ['seed-url', 'unknown flag', ['--bogus'], 2, /Unknown option '--bogus'/],
  ['seed-url', 'missing input', ['ns/a', '--uid', UID, '--key-file', 'nope'], 2, /DATASOURCE_KEY_FILE_UNREADABLE/],
  ['seed-url', 'missing --vmi', ['--vmi', 'nope', '--key-file', 'nope'], 2, /cannot read manifest .*nope: ENOENT/],
  ['warm-cache', '--help', ['--help'], 0, /^$/],
  ['warm-cache', 'unknown flag', ['--bogus'], 2, /takes no arguments/],
];

describe('exit codes: 0 ok, 1 failure, 2 bad input or usage', () => {
  let dir: string;
  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmseed-exit-'));
    await writeFile(join(dir, 'ud'), '#cloud-config\n{}\n');
    await writeFile(join(dir, 'bad'), '#cloud-config\nruncmd: [a\n');
    await writeFile(join(dir, 'plain'), 'echo hello\n');
    await mkdir(join(dir, 'dir'));
  });
  after(() => rm(dir, { recursive: true, force: true }));

  for (const [command, what, argv, code, err] of CASES) {
    test(`${command}: ${what} -> ${code}`, async () => {
      const r = await run([command, ...argv], dir);
      assert.equal(r.code, code, r.err);
      assert.match(r.err, err);
      if (argv[0] === '--help') assert.match(r.out, /usage: vmseed/);
    });
  }

  test('vmseed with no command is a usage error (2), an unknown command too', async () => {
    assert.equal((await run([], dir)).code, 2);
    assert.equal((await run(['bogus'], dir)).code, 2);
    assert.equal((await run(['--help'], dir)).code, 0);
  });

  test('build --user-data without a header: the --vmi warning, exit 0, the image written', async () => {
    const files = await run(['build', '--user-data', 'plain', '-o', 'plain.iso'], dir);
    assert.equal(files.code, 0, files.err);
    assert.match(files.err, /^vmseed build: warning: USERDATA_NO_HEADER: user-data does not start with a header/);
    assert.ok((await readFile(join(dir, 'plain.iso'))).length > 0);
    // --vmi with the same user-data says the same.
    await writeFile(
      join(dir, 'vmi.yaml'),
      [
        'apiVersion: kubevirt.io/v1',
        'kind: VirtualMachineInstance',
        'metadata: {name: a, namespace: default, uid: u1}',
        'spec:',
        '  volumes:',
        '    - name: c',
        '      cloudInitNoCloud:',
        '        userData: "echo hello\\n"',
        '',
      ].join('\n'),
    );
    const vmi = await run(['build', '--vmi', 'vmi.yaml', '-o', 'vmi.iso'], dir);
    assert.equal(vmi.code, 0, vmi.err);
    const warning = (s: string) => s.split('\n').find((l) => l.includes('USERDATA_NO_HEADER'));
    assert.equal(warning(files.err), warning(vmi.err));
  });
});
