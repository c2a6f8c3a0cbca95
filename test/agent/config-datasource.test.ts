// The agent's NoCloud HTTP datasource and vendor-data flags: parsed and
// validated once; a bad value is one clear line and exit 2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { ConfigError, configSummary, loadConfig } from '../../src/config/config.ts';
import { runCli } from '../support/cli.ts';

const local = ['--local', 'examples'];

test('datasource is off unless --datasource-listen is given', () => {
  const c = loadConfig(local, {}, '/srv')!;
  assert.equal(c.datasource, undefined);
  assert.equal(c.vendorDataFrom, undefined);
});

test('datasource flags, defaults and environment fallbacks', () => {
  const c = loadConfig(
    [...local, '--datasource-listen', '127.0.0.1:8081', '--datasource-key-file', 'keys'],
    {},
    '/srv',
  )!;
  assert.deepEqual(c.datasource, {
    listen: { host: '127.0.0.1', port: 8081 },
    keyFile: '/srv/keys',
    baseUrl: 'http://169.254.169.254/v1',
    prefix: '/v1',
    compatSourceAddress: false,
    podsDir: '/pods',
  });
  assert.ok(Object.isFrozen(c.datasource));
  const e = loadConfig(
    local,
    {
      VMSEED_DATASOURCE_LISTEN: ':8081',
      VMSEED_DATASOURCE_KEY_FILE: '/etc/vmseed/keys',
      VMSEED_DATASOURCE_BASE_URL: 'http://10.0.0.1:8081/seeds/',
      VMSEED_DATASOURCE_COMPAT_SOURCE_ADDRESS: 'true',
    },
    '/',
  )!;
  assert.deepEqual(e.datasource, {
    listen: { host: '0.0.0.0', port: 8081 },
    keyFile: '/etc/vmseed/keys',
    baseUrl: 'http://10.0.0.1:8081/seeds',
    prefix: '/seeds',
    compatSourceAddress: true,
    podsDir: '/pods',
  });
  const f = loadConfig(
    [...local, '--datasource-listen', '[::1]:81', '--datasource-key-file', 'k', '--datasource-compat-source-address'],
    {},
    '/',
  )!;
  assert.equal(f.datasource?.compatSourceAddress, true);
  // The summary on the status page names the key file, never its content.
  const s = configSummary(f);
  assert.equal(s.datasourceListen, '::1:81');
  assert.equal(s.datasourceKeyFile, '/k');
});

test('--datasource-key-create: off by default; true asks the agent to create the key file when it is missing', () => {
  const ds = ['--datasource-listen', '127.0.0.1:8081', '--datasource-key-file', 'keys'];
  assert.equal(loadConfig([...local, ...ds], {}, '/srv')!.datasource?.keyCreate, undefined);
  assert.equal(
    loadConfig([...local, ...ds, '--datasource-key-create', 'false'], {}, '/srv')!.datasource?.keyCreate,
    undefined,
  );
  const on = loadConfig([...local, ...ds, '--datasource-key-create', 'true'], {}, '/srv')!;
  assert.equal(on.datasource?.keyCreate, true);
  assert.equal(configSummary(on).datasourceKeyCreate, true);
  assert.equal(
    loadConfig([...local, ...ds], { VMSEED_DATASOURCE_KEY_CREATE: 'true' }, '/')!.datasource?.keyCreate,
    true,
  );
});

test('--vendor-data-from parses namespace/name[/key]', () => {
  assert.deepEqual(loadConfig([...local, '--vendor-data-from', 'vmseed-system/vendor'], {}, '/')!.vendorDataFrom, {
    namespace: 'vmseed-system',
    name: 'vendor',
  });
  assert.deepEqual(loadConfig(local, { VMSEED_VENDOR_DATA_FROM: 'ns/cm/extra.yaml' }, '/')!.vendorDataFrom, {
    namespace: 'ns',
    name: 'cm',
    key: 'extra.yaml',
  });
  assert.equal(
    configSummary(loadConfig([...local, '--vendor-data-from', 'ns/cm/k'], {}, '/')!).vendorDataFrom,
    'ns/cm/k',
  );
});

test('bad datasource and vendor-data values are one clear line', () => {
  const bad: Array<[string[], RegExp]> = [
    [['--datasource-listen', '127.0.0.1:8081'], /^--datasource-key-file FILE is required with --datasource-listen/],
    [['--datasource-key-file', 'k'], /^--datasource-key-file needs --datasource-listen/],
    [['--datasource-base-url', 'http://x/v1'], /^--datasource-base-url needs --datasource-listen/],
    [['--datasource-compat-source-address'], /^--datasource-compat-source-address needs --datasource-listen/],
    [['--datasource-key-create', 'true'], /^--datasource-key-create needs --datasource-listen/],
    [
      ['--datasource-listen', ':1', '--datasource-key-file', 'k', '--datasource-key-create', 'yes'],
      /^--datasource-key-create: 'yes' is not one of/,
    ],
    [['--datasource-listen', 'nope', '--datasource-key-file', 'k'], /^--datasource-listen: 'nope' is not HOST:PORT/],
    [
      ['--datasource-listen', ':1', '--datasource-key-file', 'k', '--datasource-base-url', 'ftp://x/v1'],
      /^--datasource-base-url: .*http:\/\/ or https:\/\//,
    ],
    [
      ['--datasource-listen', ':1', '--datasource-key-file', 'k', '--datasource-base-url', 'http://x/v1;y'],
      /^--datasource-base-url: .*must not contain ';'/,
    ],
    [
      ['--datasource-listen', ':1', '--datasource-key-file', 'k', '--datasource-base-url', 'http://x/a b%'],
      /^--datasource-base-url: /,
    ],
    [['--vendor-data-from', 'just-a-name'], /^--vendor-data-from must be <namespace>\/<configmap>\[\/<key>\]/],
  ];
  for (const [args, re] of bad) {
    assert.throws(
      () => loadConfig([...local, ...args], {}, '/'),
      (e: unknown) => {
        assert.ok(e instanceof ConfigError, args.join(' '));
        assert.match(e.message, re, args.join(' '));
        assert.ok(!e.message.includes('\n'));
        return true;
      },
    );
  }
});

// A key file that is not there at all is not an error: its Secret is
// optional (test/cluster/webhook/cluster-webhook.test.ts).
test('vmseed agent: no key file flag or a bad key file stops start-up (exit 2) with one line', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-cfg-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const common = [
    'agent',
    '--local',
    dir,
    '--state-dir',
    join(dir, 'seeds'),
    '--listen',
    '127.0.0.1:0',
    '--datasource-listen',
    '127.0.0.1:0',
  ];
  let r = await runCli(common, dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /^vmseed agent: --datasource-key-file FILE is required/);
  assert.equal(r.err.trim().split('\n').length, 1);

  await writeFile(join(dir, 'weak'), 'AAAA\n');
  r = await runCli([...common, '--datasource-key-file', 'weak'], dir);
  assert.equal(r.code, 2);
  assert.match(r.err, /^vmseed agent: datasource key on line 1 of .*weak has 3 bytes/);
  assert.equal(r.err.trim().split('\n').length, 1);
});

test('vmseed agent: a datasource port already in use is one line and exit 1', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-cfg-'));
  const { createServer } = await import('node:net');
  const busy = createServer();
  await new Promise<void>((r) => busy.listen(0, '127.0.0.1', r));
  t.after(async () => {
    busy.close();
    await rm(dir, { recursive: true, force: true });
  });
  await writeFile(
    join(dir, 'keys'),
    `${Buffer.from(Array.from({ length: 32 }, (_, i) => i * 7 + 1)).toString('base64')}\n`,
  );
  const port = (busy.address() as { port: number }).port;
  const r = await runCli(
    [
      'agent',
      '--local',
      dir,
      '--state-dir',
      join(dir, 'seeds'),
      '--listen',
      '127.0.0.1:0',
      '--datasource-listen',
      `127.0.0.1:${port}`,
      '--datasource-key-file',
      'keys',
    ],
    dir,
  );
  assert.equal(r.code, 1);
  // stderr also carries the agent's JSON log; the error is its one plain line.
  const plain = r.err
    .trim()
    .split('\n')
    .filter((l) => !l.startsWith('{'));
  assert.equal(plain.length, 1, r.err);
  assert.match(
    plain[0],
    new RegExp(`^vmseed agent: cannot listen on 127\\.0\\.0\\.1:${port} \\(--datasource-listen\\): .*EADDRINUSE`),
  );
});
