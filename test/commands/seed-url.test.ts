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
import { bindingMessage, NONCE_ANNOTATION } from '../../src/datasource/binding.ts';
import { OPTIONS, OPTION_HELP } from '../../src/commands/seed-url.ts';
import { fixtureReview } from '../support/webhook.ts';

const VM_UID = 'b2f7e0a4-5c1d-4e9b-8a3f-7d6c5b4a3921';
const NONCE = 'AbCdEfGhIjKlMnOpQrStUv';

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
    await writeFile(
      join(dir, 'vm.yaml'),
      `apiVersion: kubevirt.io/v1\nkind: VirtualMachine\nmetadata:\n  name: vm-cirros\n  namespace: default\n  uid: ${VM_UID}\nspec: {}\n`,
    );
    await writeFile(
      join(dir, 'vmi-nonce.yaml'),
      `kind: VirtualMachineInstance\nmetadata:\n  name: direct\n  namespace: ns1\n  annotations:\n    ${NONCE_ANNOTATION}: ${NONCE}\n`,
    );
    await writeFile(
      join(dir, 'vmi-unbound.yaml'),
      `kind: VirtualMachineInstance\nmetadata:\n  name: direct\n  namespace: ns1\n  uid: ${uid}\n`,
    );
    await writeFile(
      join(dir, 'vm-bad-uid.yaml'),
      `kind: VirtualMachine\nmetadata: {name: vm-x, namespace: ns1, uid: nope}\n`,
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

  test("--vm/--vm-uid and --binding-from print the serial the agent accepts for the VM's VMIs (and the webhook writes)", async () => {
    // A VMI as virt-controller makes it for VM vm-cirros (the AdmissionReview fixture).
    const vmi = (await fixtureReview('vmi-from-vm')).request.object as {
      metadata: { namespace: string; name: string; ownerReferences: [] };
    };
    const binding = bindingMessage(vmi.metadata.namespace, vmi.metadata.name, vmi.metadata)!;
    assert.ok(binding, 'the fixture VMI is bound to its VM');
    const want = `ds=nocloud;s=http://169.254.169.254/v1/${signToken(key, binding)}/\n`;
    for (const argv of [
      ['--vm', 'default/vm-cirros', '--vm-uid', VM_UID],
      ['default/vm-cirros', '--vm-uid', VM_UID],
      ['--binding-from', 'vm.yaml'],
      ['default/vm-cirros', '--binding-from', 'vm.yaml'],
    ]) {
      const r = await run([...argv, '--key-file', 'keys'], dir);
      assert.equal(r.code, 0, `${argv.join(' ')}: ${r.err}`);
      assert.equal(r.out, want, argv.join(' '));
    }
    // The VMI's own manifest, exported with its owner: the same VM binding.
    await writeFile(join(dir, 'vmi-owned.json'), JSON.stringify(vmi));
    assert.equal((await run(['--binding-from', 'vmi-owned.json', '--key-file', 'keys'], dir)).out, want);
    // A VMI admitted with a nonce: its nonce binding, served by the datasource.
    const nonceBinding = bindingMessage('ns1', 'direct', { annotations: { [NONCE_ANNOTATION]: NONCE } })!;
    const directory = new MapDirectory();
    directory.add({ namespace: 'ns1', name: 'direct', uid: 'uid-direct', seed, binding: nonceBinding });
    const nonceServer = await startDatasourceServer({
      listen: { host: '127.0.0.1', port: 0 },
      directory,
      keyring: new DatasourceKeyring([key]),
      logger: quietLogger,
    });
    try {
      const r = await run(
        ['--binding-from', 'vmi-nonce.yaml', '--key-file', 'keys', '--url-only', '--base', nonceServer.baseUrl],
        dir,
      );
      assert.equal(r.code, 0, r.err);
      const got = await cloudInitReadSeeded(r.out.trim());
      assert.equal(got.ok, true, got.error);
      assert.deepEqual(got.md, seed.metaData);
    } finally {
      await nonceServer.close();
    }
  });

  test("the README's seed-url flag table is the command's", () => {
    const readme = readFileSync(new URL('../../README.md', import.meta.url), 'utf8');
    const section = readme.slice(readme.indexOf('### `vmseed seed-url`'), readme.indexOf('### `vmseed redirect`'));
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
      [['--vm', 'ns1/vm-a', '--key-file', 'keys'], 2, /--vm needs --vm-uid/],
      [['--vm-uid', VM_UID, '--key-file', 'keys'], 2, /--vm-uid needs --vm/],
      [
        ['--vm', 'ns1/vm-a', '--vm-uid', 'vm-a', '--key-file', 'keys'],
        2,
        /--vm-uid 'vm-a' is not a UUID; give the VirtualMachine's/,
      ],
      [['ns1/vm-b', '--vm', 'ns1/vm-a', '--vm-uid', VM_UID, '--key-file', 'keys'], 2, /is ns1\/vm-a, not ns1\/vm-b/],
      [['--vm', 'bad name', '--vm-uid', VM_UID, '--key-file', 'keys'], 2, /namespace/],
      [['ns1/vm-a', '--uid', uid, '--vm-uid', VM_UID, '--key-file', 'keys'], 2, /give one of/],
      [
        ['--binding-from', 'vmi-unbound.yaml', '--key-file', 'keys'],
        2,
        /neither a VirtualMachine .* nor an admission nonce/,
      ],
      [['--binding-from', 'vm-bad-uid.yaml', '--key-file', 'keys'], 2, /metadata\.uid 'nope' is not a UUID/],
      [['--binding-from', 'missing.yaml', '--key-file', 'keys'], 2, /cannot read manifest .*ENOENT/],
      [
        ['ns1/other', '--binding-from', 'vm.yaml', '--key-file', 'keys'],
        2,
        /vm\.yaml is default\/vm-cirros, not ns1\/other/,
      ],
      [['ns1/vm-a', '--uid', uid, '--key-file', 'missing'], 1, /DATASOURCE_KEY_FILE_UNREADABLE/],
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
  for (const bad of ['http://h/v1;x', 'http://h/v 1', 'http://h/%s', 'http://u:p@h/v1', 'http://h/v1#x', 'not a url']) {
    assert.throws(
      () => datasourceSeedUrl(bad, 'T'),
      (e: unknown) => e instanceof VmseedError && e.code === 'DATASOURCE_URL_INVALID',
      bad,
    );
  }
});
