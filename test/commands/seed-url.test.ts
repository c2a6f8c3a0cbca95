import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { after, before, describe, test } from 'node:test';
import { main } from '../../src/main.ts';
import { datasourceSeedUrl, datasourceSerial, datasourceSerialFor } from '../../src/datasource/url.ts';
import { startDatasourceServer, type DatasourceServer } from '../../src/datasource/server.ts';
import { DatasourceKeyring, signToken } from '../../src/datasource/tokens.ts';
import { VmseedError } from '../../src/errors.ts';
import {
  MapDirectory,
  cloudInitReadSeeded,
  keyLine,
  nocloudSeed,
  quietLogger,
  randomKey,
} from '../datasource/datasource-fixtures.ts';

async function run(argv: string[], cwd: string): Promise<{ code: number; out: string; err: string }> {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let out = '';
  let err = '';
  stdout.on('data', (c) => (out += c));
  stderr.on('data', (c) => (err += c));
  const code = await main(['seed-url', ...argv], {
    stdout,
    stderr,
    stdin: new PassThrough(),
    env: {},
    cwd,
    stopSignal: new AbortController().signal,
  });
  return { code, out, err };
}

// cloud-init's own parser of the `ds=` line (what it does with the DMI
// system-serial-number), so the string is proven to round-trip.
function cloudInitParseSerial(serial: string): Promise<Record<string, string>> {
  const py = `
import json, sys
from cloudinit.sources.DataSourceNoCloud import load_cmdline_data
fill = {}
ok = load_cmdline_data(fill, sys.argv[1])
print(json.dumps({"ok": ok, **fill}))
`;
  return new Promise((resolve, reject) =>
    execFile('/usr/bin/python3', ['-c', py, serial], (e, out, stderr) =>
      e ? reject(new Error(stderr)) : resolve(JSON.parse(out)),
    ),
  );
}

import { aliasBomb } from '../hostile/corpus.ts';
import { readFileSync } from 'node:fs';
import { OPTIONS, OPTION_HELP } from '../../src/commands/seed-url.ts';
import { serialToken } from '../../src/datasource/url.ts';

describe('vmseed seed-url', () => {
  let dir: string;
  const key = randomKey();
  const uid = '6f1c2d3e-0000-4a5b-8c9d-0123456789ab';
  let server: DatasourceServer;
  const seed = nocloudSeed('a');

  before(async () => {
    dir = await mkdtemp(join(tmpdir(), 'vmseed-seedurl-'));
    await writeFile(join(dir, 'keys'), `${keyLine(key)}\n${keyLine(randomKey())}\n`);
    await writeFile(
      join(dir, 'vmi.yaml'),
      `apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata:\n  name: vm-a\n  namespace: ns1\n  uid: ${uid}\nspec: {}\n`,
    );
    await writeFile(
      join(dir, 'vmi-nouid.yaml'),
      `kind: VirtualMachineInstance\nmetadata:\n  name: vm-a\n  namespace: ns1\n`,
    );
    // An alias bomb (8 levels x 10) in an operator-given file: refused by the budgeted loader.
    await writeFile(
      join(dir, 'vmi-bomb.yaml'),
      `metadata: {name: vm-a, namespace: ns1, uid: ${uid}}\n${aliasBomb(8, 10)}\n`,
    );
    const directory = new MapDirectory();
    directory.add({ namespace: 'ns1', name: 'vm-a', uid, seed });
    server = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory,
      keyring: new DatasourceKeyring([key]),
      logger: quietLogger,
    });
  });
  after(async () => {
    await server.close();
    await rm(dir, { recursive: true, force: true });
  });

  test('prints ds=nocloud;s=<base>/<token>/ signed with the first key', async () => {
    const r = await run(['ns1/vm-a', '--uid', uid, '--key-file', 'keys'], dir);
    assert.equal(r.code, 0, r.err);
    assert.equal(r.out, `ds=nocloud;s=http://169.254.169.254/v1/${signToken(key, uid)}/\n`);
  });

  test("--vmi reads the uid; the serial goes through cloud-init's own ds= parser and its reader gets the seed", async () => {
    const r = await run(['--vmi', 'vmi.yaml', '--key-file', 'keys', '--base', server.baseUrl + '/'], dir);
    assert.equal(r.code, 0, r.err);
    const serial = r.out.trim();
    const parsed = await cloudInitParseSerial(serial);
    assert.equal(parsed.ok, true);
    assert.equal(parsed.seedfrom, `${server.baseUrl}/${signToken(key, uid)}/`);
    const got = await cloudInitReadSeeded(parsed.seedfrom);
    assert.equal(got.ok, true, got.error);
    assert.deepEqual(got.md, seed.metaData);
    assert.equal(got.ud, Buffer.from(seed.userData).toString('base64'));
  });

  test('--ds nocloud-net for older guests, --url-only', async () => {
    const net = await run(['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--ds', 'nocloud-net'], dir);
    assert.match(net.out, /^ds=nocloud-net;s=http:\/\/169\.254\.169\.254\/v1\/[A-Za-z0-9_-]{43}\/\n$/);
    const parsed = await cloudInitParseSerial(net.out.trim());
    assert.equal(parsed.dsmode, 'net');
    const url = await run(['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--url-only'], dir);
    assert.equal(url.out, `http://169.254.169.254/v1/${signToken(key, uid)}/\n`);
  });

  test('--new-token: a fresh random token each time, no key; the serial is what the agent reads as the VMI own', async () => {
    const a = await run(['--new-token'], dir);
    const b = await run(['--new-token', '--ds', 'nocloud-net'], dir);
    assert.equal(a.code, 0, a.err);
    assert.equal(b.code, 0, b.err);
    assert.match(a.out, /^ds=nocloud;s=http:\/\/169\.254\.169\.254\/v1\/[A-Za-z0-9_-]{43}\/\n$/);
    assert.match(b.out, /^ds=nocloud-net;s=http:\/\/169\.254\.169\.254\/v1\/[A-Za-z0-9_-]{43}\/\n$/);
    const [ta, tb] = [serialToken(a.out.trim()), serialToken(b.out.trim())];
    assert.ok(ta !== undefined && tb !== undefined);
    assert.notEqual(ta, tb);
    const parsed = await cloudInitParseSerial(a.out.trim());
    assert.equal(parsed.ok, true);
    // A VMI whose serial carries it is served by it.
    const directory = new MapDirectory();
    directory.add({ namespace: 'ns1', name: 'own', uid: 'uid-own', seed, serialToken: ta });
    const own = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory,
      keyring: DatasourceKeyring.empty(),
      logger: quietLogger,
    });
    try {
      const r = await run(['--new-token', '--url-only', '--base', own.baseUrl], dir);
      assert.equal(r.code, 0, r.err);
      assert.equal((await cloudInitReadSeeded(r.out.trim())).ok, false, 'a token no VMI carries opens nothing');
      const got = await cloudInitReadSeeded(`${own.baseUrl}/${ta}/`);
      assert.equal(got.ok, true, got.error);
      assert.deepEqual(got.md, seed.metaData);
    } finally {
      await own.close();
    }
  });

  test("docs/reference/cli.md's seed-url flag table is the command's", () => {
    const cli = readFileSync(new URL('../../docs/reference/cli.md', import.meta.url), 'utf8');
    const start = cli.indexOf('\n## `vmseed seed-url`\n');
    assert.ok(start >= 0, 'docs/reference/cli.md: ## `vmseed seed-url`');
    const section = cli.slice(start, cli.indexOf('\n## ', start + 1));
    const documented = [...section.matchAll(/^\| `(-[^`]+)` \|/gm)].map((m) => m[1]);
    assert.deepEqual(
      documented,
      OPTION_HELP.map(([flag]) => flag).filter((f) => !f.includes('--help')),
    );
    const flagged = OPTION_HELP.flatMap(([flag]) => flag.split(', ').map((f) => f.split(' ')[0].replace(/^-+/, '')));
    for (const name of Object.keys(OPTIONS)) assert.ok(flagged.includes(name), `--${name} in the help`);
    for (const name of flagged) assert.ok(name === 'h' || name in OPTIONS, `--${name} is a flag`);
  });

  test('bad input exits 2 with one line; unreadable key file exits 1', async () => {
    const cases: Array<[string[], number, RegExp]> = [
      [['ns1/vm-a', '--key-file', 'keys'], 2, /--uid/],
      [['ns1/vm-a', '--uid', uid], 2, /--key-file/],
      [['not a name', '--uid', uid, '--key-file', 'keys'], 2, /namespace/],
      [['ns1/vm-b', '--vmi', 'vmi.yaml', '--key-file', 'keys'], 2, /is ns1\/vm-a, not ns1\/vm-b/],
      [['--vmi', 'vmi-nouid.yaml', '--key-file', 'keys'], 2, /metadata\.uid/],
      [
        ['--vmi', 'vmi-bomb.yaml', '--key-file', 'keys'],
        2,
        /vmi-bomb\.yaml: --vmi: with its aliases expanded the document is more than/,
      ],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--base', 'ftp://x/v1'], 2, /DATASOURCE_URL_INVALID/],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--base', 'http://x/v1?a=b'], 2, /DATASOURCE_URL_INVALID/],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--ds', 'ec2'], 2, /--ds/],
      [
        ['ns1/vm-a', '--uid', 'vm-a', '--key-file', 'keys'],
        2,
        /--uid 'vm-a' is not a UUID; give the VMI's metadata\.uid/,
      ],
      [['ns1/vm-a', '--uid', uid + '0', '--key-file', 'keys'], 2, /not a UUID/],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'keys', '--bogus'], 2, /bogus/],
      [['ns1/vm-a', '--uid', uid, '--vmi', 'vmi.yaml', '--key-file', 'keys'], 2, /give one of --uid, --vmi/],
      [['--new-token', '--key-file', 'keys'], 2, /--new-token takes no key and no VMI: drop --key-file/],
      [['--new-token', '--uid', uid], 2, /drop --uid/],
      [['--new-token', 'ns1/vm-a'], 2, /--new-token takes no <namespace>\/<name>/],
      [['--new-token', '--ds', 'ec2'], 2, /--ds/],
      [['--new-token', '--base', 'ftp://x/v1'], 2, /DATASOURCE_URL_INVALID/],
      // The modes that signed a VM or nonce binding are gone.
      [['--vm', 'ns1/vm-a', '--vm-uid', uid, '--key-file', 'keys'], 2, /Unknown option '--vm'/],
      [['--binding-from', 'vmi.yaml', '--key-file', 'keys'], 2, /Unknown option '--binding-from'/],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'missing'], 2, /DATASOURCE_KEY_FILE_UNREADABLE/],
    ];
    for (const [argv, code, re] of cases) {
      const r = await run(argv, dir);
      assert.equal(r.code, code, argv.join(' '));
      assert.match(r.err, re, argv.join(' '));
      assert.equal(r.err.trim().split('\n').length, 1, r.err);
      assert.equal(r.out, '');
    }
  });
});

test('exported helpers for the status page', () => {
  const ring = new DatasourceKeyring([randomKey()]);
  assert.equal(datasourceSerialFor(ring, 'u'), `ds=nocloud;s=http://169.254.169.254/v1/${ring.sign('u')}/`);
  assert.equal(datasourceSeedUrl('http://10.0.0.1:8081/v1///', 'T'), 'http://10.0.0.1:8081/v1/T/');
  assert.equal(datasourceSerial('http://h/v1/T/', 'nocloud-net'), 'ds=nocloud-net;s=http://h/v1/T/');
  // The token the agent reads from a VMI's serial: any base, either ds= id,
  // `s=` or `seedfrom=`; nothing from a serial that is not a NoCloud seed URL
  // ending in /<token>/, or names two.
  const t = 'AbCdEfGhIjKlMnOpQrStUvWxYz0123456789-_AbCdE';
  for (const serial of [
    `ds=nocloud;s=http://169.254.169.254/v1/${t}/`,
    `ds=nocloud-net;s=https://seeds.example:8443/x/y/${t}/`,
    `ds=nocloud;seedfrom=http://h/${t}/;h=host`,
  ])
    assert.equal(serialToken(serial), t, serial);
  for (const serial of [
    undefined,
    42,
    '',
    'my-own-serial',
    `s=http://h/v1/${t}/`,
    `ds=configdrive;s=http://h/v1/${t}/`,
    `ds=nocloud;s=http://h/v1/${t}`,
    `ds=nocloud;s=http://h/v1/${t}x/`,
    `ds=nocloud;s=http://h/v1/${t.slice(1)}/`,
    `ds=nocloud;s=http://h/v1/${t}/;s=http://h/v1/${t}/`,
    `ds=nocloud;h=http://h/v1/${t}/`,
  ])
    assert.equal(serialToken(serial), undefined, String(serial));
  for (const bad of ['http://h/v1;x', 'http://h/v 1', 'http://h/%s', 'http://u:p@h/v1', 'http://h/v1#x', 'not a url']) {
    assert.throws(
      () => datasourceSeedUrl(bad, 'T'),
      (e: unknown) => e instanceof VmseedError && e.code === 'DATASOURCE_URL_INVALID',
      bad,
    );
  }
});
