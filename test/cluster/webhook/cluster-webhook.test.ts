// `vmseed cluster` as a process with the webhook on, beside a node agent with
// the datasource on, and none of the files their Secrets would hold: the
// agent starts, seeds, and its /readyz has no webhook check; the cluster
// component's /readyz names the missing certificate; files that appear later
// are taken up by both without a restart. Also: `vmseed cluster --help`, a
// bad flag, and the agent refusing the webhook flags it no longer has.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, rename, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { PassThrough } from 'node:stream';
import { keyLine, randomKey } from '../../datasource/datasource-fixtures.ts';
import { isoFilesUnder, tempDir, waitFor } from '../../support/agent-harness.ts';
import { readyz, startCliAgent } from '../../support/agent-cli.ts';
import { startCliCluster } from '../../support/cluster-cli.ts';
import { certDir, fixtureReview, patchOf, post, testPki } from '../../support/webhook.ts';
import { CHALLENGE_PREFIX, newNonce } from '../../../src/redirect/challenge.ts';
import { main } from '../../../src/main.ts';

const VMI = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: web
  namespace: default
  uid: 11111111-2222-3333-4444-555555555555
  annotations:
    vmseed.io/cloud-init: |
      userData: |
        #cloud-config
        hostname: web
spec:
  domain: {}
`;

const images = isoFilesUnder;

test('no datasource key and no webhook certificate: the agent seeds and is not held back by the webhook; the cluster component says why and takes the certificate up when it appears, writing serials with no key', async (t) => {
  const tmp = await tempDir('vmseed-webhook-cluster-');
  const dir = tmp.path;
  const manifests = join(dir, 'vmis');
  const keys = join(dir, 'datasource');
  const tls = join(dir, 'webhook-tls');
  // The directories exist (empty Secret volumes), their files do not.
  await Promise.all([mkdir(manifests), mkdir(keys), mkdir(tls)]);
  await writeFile(join(manifests, 'web.yaml'), VMI);
  const agent = startCliAgent([
    '--local',
    manifests,
    '--state-dir',
    join(dir, 'seeds'),
    '--datasource-listen',
    '127.0.0.1:0',
    '--datasource-key-file',
    join(keys, 'keys'),
  ]);
  // The webhook needs no key: it writes serials with random tokens.
  const cluster = startCliCluster(['--webhook-cert-dir', tls]);
  // Both are stopped before their directory goes.
  t.after(async () => {
    await Promise.all([agent.stop(), cluster.stop()]);
    await tmp.remove();
  });
  const url = await agent.url();
  const probes = await cluster.probeUrl();
  await waitFor('the seed image', () => images(join(dir, 'seeds')).length === 1, 60_000);
  const notReady = await waitFor('/readyz naming the certificate', async () => {
    const r = await readyz(probes);
    return r.status === 503 && r.body.includes('webhook certificate missing') ? r : undefined;
  });
  assert.match(notReady.body, new RegExp(`${tls}/tls.crt`));
  assert.doesNotMatch((await readyz(url)).body, /webhook/, "the agent's readiness has no webhook check");
  assert.equal((await fetch(`${probes}/healthz`)).status, 200, 'alive while not ready');

  // The datasource answers the redirect challenge with one line per key: none yet.
  const dsPort = await waitFor('datasource port', () => {
    const m = /"port":(\d+),"prefix"/.exec(agent.output());
    return m ? Number(m[1]) : undefined;
  });
  const challenge = async () =>
    (await (await fetch(`http://127.0.0.1:${dsPort}${CHALLENGE_PREFIX}${newNonce()}`)).text()).trim();
  assert.equal(await challenge(), '');
  await writeFile(join(keys, 'keys.tmp'), `${keyLine(randomKey())}\n`);
  await rename(join(keys, 'keys.tmp'), join(keys, 'keys'));
  await waitFor('the key loaded', async () => (await challenge()).length === 43);

  const pki = await testPki('webhook');
  await certDir(pki, tls);
  await waitFor('/readyz 200 once the certificate is there', async () => (await readyz(probes)).status === 200);
  const webhookPort = await cluster.webhookPort();
  const review = JSON.stringify(await fixtureReview('vmi-direct'));
  const paths = patchOf(await post(webhookPort, pki.caCert, review))!.map((o) => o.path);
  assert.ok(paths.includes('/spec/domain/firmware'), `the serial is written without any key: ${paths.join(' ')}`);
  assert.ok(paths.includes('/spec/startStrategy'), paths.join(' '));
  const metrics = await (await fetch(`${probes}/metrics`)).text();
  assert.match(metrics, /vmseed_webhook_requests_total\{result="patched"\} [1-9]/);
  assert.equal(await cluster.stop(), 0);
  assert.equal(await agent.stop(), 0);
  for (const out of [agent.output(), cluster.output()])
    assert.doesNotMatch(out, /"level":(50|60)/, 'nothing logged as an error');
  assert.doesNotMatch(cluster.output(), /ds=nocloud/, 'no serial in the log');
});

async function run(argv: string[], env: NodeJS.ProcessEnv = {}) {
  const stdout = new PassThrough();
  const stderr = new PassThrough();
  let out = '';
  let err = '';
  stdout.on('data', (d) => (out += d));
  stderr.on('data', (d) => (err += d));
  const code = await main(argv, {
    stdout,
    stderr,
    stdin: new PassThrough(),
    env,
    cwd: '/',
    stopSignal: AbortSignal.abort(),
  });
  return { code, out, err };
}

test('vmseed cluster --help lists its flags; a bad flag exits 2 with one clear line', async () => {
  const help = await run(['cluster', '--help']);
  assert.equal(help.code, 0);
  for (const flag of ['--webhook-listen', '--webhook-cert-dir', '--probe-listen', '--log-level'])
    assert.ok(help.out.includes(flag), flag);
  assert.match(help.out, /default 0\.0\.0\.0:8443/);
  assert.match(help.out, /default \/etc\/vmseed\/webhook-tls/);
  assert.match((await run(['--help'])).out, /^ {2}cluster /m, 'listed in vmseed --help');

  const cases: Array<[string[], NodeJS.ProcessEnv, RegExp]> = [
    [['--nope'], {}, /^vmseed cluster: Unknown option '--nope'/],
    [['--webhook-listen', 'nope'], {}, /^vmseed cluster: --webhook-listen: 'nope' is not HOST:PORT/],
    [['--probe-listen', '1.2.3.4:99999'], {}, /^vmseed cluster: --probe-listen: port 99999 is out of range/],
    [['--log-level', 'loud'], {}, /^vmseed cluster: --log-level: 'loud' is not one of/],
    [['--datasource-key-file', '/k'], {}, /^vmseed cluster: Unknown option '--datasource-key-file'/],
    [[], { VMSEED_WEBHOOK_LISTEN: 'x' }, /^vmseed cluster: --webhook-listen: 'x' is not HOST:PORT/],
  ];
  for (const [args, env, message] of cases) {
    const r = await run(['cluster', ...args], env);
    assert.equal(r.code, 2, args.join(' '));
    assert.match(r.err, message, args.join(' '));
    assert.equal(r.out, '');
  }
});

test("the agent refuses the webhook flags and their environment variables, naming 'vmseed cluster'", async () => {
  for (const [args, env] of [
    [['--webhook-listen', ':8443'], {}],
    [['--webhook-cert-dir=/x'], {}],
    [['--webhook-serial', 'off'], {}],
    [[], { VMSEED_WEBHOOK_LISTEN: ':8443' }],
  ] as Array<[string[], NodeJS.ProcessEnv]>) {
    const r = await run(['agent', '--node-name', 'node-a', ...args], env);
    assert.equal(r.code, 2, args.join(' '));
    assert.match(r.err, /^vmseed agent: (--webhook-|VMSEED_WEBHOOK_).* `vmseed cluster`/, r.err);
    assert.equal(r.err.trim().split('\n').length, 1, 'one line');
  }
});
