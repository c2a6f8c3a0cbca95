// `vmseed agent` in cluster mode as a real subprocess: kubeconfig file,
// informer against the fake API server, /readyz and /metrics served,
// SIGTERM → exit 0; a kubeconfig whose exec plugin is not installed is refused with exit 2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { isoFilesUnder, tempDir, vmi, waitFor, NODE } from '../support/agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

test('cluster mode CLI: kubeconfig, seeds, readiness, Events, SIGTERM exit 0', { timeout: 180_000 }, async (t) => {
  const fake = await FakeKube.start();
  const dir = await tempDir();
  t.after(async () => {
    await fake.close();
    await dir.remove();
  });
  const v = fake.applyVmi(vmi('cli-vm'));
  fake.applyVmi(vmi('elsewhere', { node: 'node-b' }));
  const kubeconfig = await fake.writeKubeconfig(dir.path);
  const state = join(dir.path, 'seeds');
  const child = spawn(
    process.execPath,
    [
      join(ROOT, 'src/main.ts'),
      'agent',
      '--kubeconfig',
      kubeconfig,
      '--state-dir',
      state,
      '--libvirt',
      'off',
      '--listen',
      '127.0.0.1:0',
      '--status-listen',
      '127.0.0.2:0',
    ],
    {
      env: { ...process.env, NODE_NAME: NODE },
      stdio: ['ignore', 'ignore', 'pipe'],
    },
  );
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.after(() => void (child.exitCode === null && child.kill('SIGKILL')));

  const vmiDir = join(state, 'default', `cli-vm_${v.metadata.uid!}`);
  await waitFor('image', () => isoFilesUnder(vmiDir).find((n) => /^nocloud-[0-9a-f]{16}\.iso$/.test(n)), 60_000);
  assert.equal(existsSync(join(state, 'default', 'elsewhere')), false);
  const url = await waitFor('url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1]);
  await waitFor('ready', async () => (await fetch(`${url}/readyz`)).status === 200);
  // The image is on disk before its reconcile is recorded (the handler
  // counts it when the reconcile returns): wait for the count.
  const metrics = await waitFor('reconcile counted', async () => {
    const text = await (await fetch(`${url}/metrics`)).text();
    return /vmseed_reconcile_total\{result="success"\} [1-9]/.test(text) ? text : undefined;
  });
  assert.match(metrics, /vmseed_informer_synced 1/);
  await waitFor('SeedReady Event', () =>
    fake.events().find((e) => e.reason === 'SeedReady' && e.involvedObject.uid === v.metadata.uid),
  );
  assert.ok(
    fake.requests.every(
      (r) =>
        r.resource !== 'virtualmachineinstances' ||
        [`kubevirt.io/nodeName=${NODE}`, `kubevirt.io/migrationTargetNodeName=${NODE}`].includes(r.query.labelSelector),
    ),
  );

  await fake.refuse(true);
  await waitFor(
    'not ready while the API server is away',
    async () => (await fetch(`${url}/readyz`)).status === 503,
    60_000,
  );
  await fake.refuse(false);
  await waitFor('ready again', async () => (await fetch(`${url}/readyz`)).status === 200, 60_000);

  child.kill('SIGTERM');
  assert.equal(await exited, 0, log.slice(-2000));
});

test('a kubeconfig whose exec plugin is not installed: one line, exit 2', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const kc = join(dir.path, 'kc.yaml');
  await writeFile(
    kc,
    `apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: u, user: {exec: {command: vmseed-no-such-plugin, apiVersion: client.authentication.k8s.io/v1}}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
`,
  );
  const r = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
    const c = spawn(
      process.execPath,
      [
        join(ROOT, 'src/main.ts'),
        'agent',
        '--kubeconfig',
        kc,
        '--node-name',
        'n',
        '--state-dir',
        join(dir.path, 's'),
        '--listen',
        '127.0.0.1:0',
      ],
      { stdio: ['ignore', 'ignore', 'pipe'] },
    );
    let stderr = '';
    c.stderr.on('data', (d) => (stderr += d));
    c.on('exit', (code) => resolve({ code, stderr }));
  });
  assert.equal(r.code, 2, r.stderr);
  assert.match(
    r.stderr,
    /^vmseed agent: kubeconfig: user 'u': exec plugin command 'vmseed-no-such-plugin' is not found \(not in PATH\)/,
  );
  assert.equal(r.stderr.trim().split('\n').length, 1);
});
