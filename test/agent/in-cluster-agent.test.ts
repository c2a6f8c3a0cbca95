// `vmseed agent` started as in a pod: no kubeconfig, KUBERNETES_SERVICE_HOST
// and _PORT, and the service-account volume at its usual path in the
// process's own mount namespace (test/support/in-cluster.ts), against the
// fake API server over TLS with its token and RBAC from the manifest.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { serviceAccountVolume, SA_PATH } from '../support/in-cluster.ts';
import { testPki } from '../support/test-pki.ts';
import { namespacedRbac } from '../support/kube-authz.ts';
import { isoFilesUnder, tempDir, vmi, waitFor, NODE } from '../support/agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;

async function startInCluster(
  t: { after(fn: () => unknown): void },
  options: { args?: string[]; rbac?: unknown[] } = {},
) {
  const fake = await FakeKube.start(options.rbac ? { rbac: options.rbac } : {});
  const dir = await tempDir();
  const sa = await serviceAccountVolume(fake, dir.path);
  const state = join(dir.path, 'seeds');
  const [file, ...args] = sa.command([
    process.execPath,
    join(ROOT, 'src/main.ts'),
    'agent',
    '--state-dir',
    state,
    '--libvirt',
    'off',
    '--listen',
    '127.0.0.1:0',
    ...(options.args ?? []),
  ]);
  const child = spawn(file, args, { env: sa.env({ NODE_NAME: NODE }), stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.after(async () => {
    if (child.exitCode === null) child.kill('SIGKILL');
    await exited;
    await fake.close();
    await dir.remove();
  });
  const url = () => waitFor('status URL', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1], 60_000);
  return { fake, dir, sa, state, child, exited, log: () => log, url };
}

const imageIn = (state: string, ns: string, name: string, uid: string) => {
  const d = join(state, ns, `${name}_${uid}`);
  return isoFilesUnder(d).some((n) => /^nocloud-[0-9a-f]{16}\.iso$/.test(n));
};

test(
  'in-cluster config: token and CA from the service-account path, TLS, RBAC; a rotated token is picked up after a 401',
  { timeout: 180_000 },
  async (t) => {
    const run = await startInCluster(t);
    const { fake, sa, state } = run;
    // The agent's token is the volume's, which the fake accepts alone.
    const v = fake.applyVmi(vmi('in-cluster'));
    await waitFor('image', () => imageIn(state, 'default', 'in-cluster', v.metadata.uid!), 60_000);
    await waitFor('SeedReady Event', () =>
      fake.events().find((e) => e.reason === 'SeedReady' && e.involvedObject.uid === v.metadata.uid),
    );
    const url = await run.url();
    await waitFor('ready', async () => (await fetch(`${url}/readyz`)).status === 200, 60_000);
    assert.ok(
      fake.requests.length > 0 && fake.requests.every((r) => r.status !== 401 && r.status !== 403),
      'authenticated and authorised from the start',
    );
    // The path really was the standard one, and only inside the child's namespace.
    assert.equal(existsSync(join(SA_PATH, 'token')), false, 'the host does not see the bind mount');

    // kubelet rotates the token; the API server stops accepting the old one.
    const before = fake.requests.length;
    await sa.rotateToken();
    fake.setSecret({
      metadata: { name: 'after-rotation', namespace: 'default' },
      stringData: { userdata: '#cloud-config\nhostname: rotated\n' },
    });
    const w = fake.applyVmi(vmi('after-rotation', { cloudInit: 'secretRef: {name: after-rotation}\n' }));
    await waitFor(
      'seeded with the new token',
      () => imageIn(state, 'default', 'after-rotation', w.metadata.uid!),
      60_000,
    );
    const after = fake.requests.slice(before);
    const secretGets = after.filter((r) => r.resource === 'secrets' && r.verb === 'get');
    // The first call with the old token got 401; the agent re-read the file at once and retried.
    assert.deepEqual(
      secretGets.map((r) => r.status),
      [401, 200],
      JSON.stringify(secretGets),
    );
    await waitFor('SeedReady Event for the new VMI', () =>
      fake.events().find((e) => e.reason === 'SeedReady' && e.involvedObject.uid === w.metadata.uid),
    );
    assert.ok(!run.log().includes(sa.token), 'the token is never logged');

    run.child.kill('SIGTERM');
    assert.equal(await run.exited, 0, run.log().slice(-2000));
  },
);

test('in-cluster config: a server certificate from another CA is refused', { timeout: 180_000 }, async (t) => {
  const fake = await FakeKube.start();
  const dir = await tempDir();
  const sa = await serviceAccountVolume(fake, dir.path);
  await sa.setCa((await testPki('some-other-ca')).caCert);
  const [file, ...args] = sa.command([
    process.execPath,
    join(ROOT, 'src/main.ts'),
    'agent',
    '--state-dir',
    join(dir.path, 'seeds'),
    '--libvirt',
    'off',
    '--listen',
    '127.0.0.1:0',
  ]);
  const child = spawn(file, args, { env: sa.env({ NODE_NAME: NODE }), stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (c) => r(c)));
  t.after(async () => {
    if (child.exitCode === null) child.kill('SIGKILL');
    await exited;
    await fake.close();
    await dir.remove();
  });
  fake.applyVmi(vmi('never'));
  const url = await waitFor('status URL', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1], 60_000);
  await waitFor(
    `a certificate error in the log`,
    () =>
      log
        .split('\n')
        .some(
          (l) =>
            l.includes('VMI watch failed') &&
            /not signed by the configured CA \(UNABLE_TO_VERIFY_LEAF_SIGNATURE\)/.test(l),
        ),
    60_000,
  ).catch((e) => {
    throw new Error(`${(e as Error).message}\n${log.slice(-3000)}`);
  });
  assert.equal((await fetch(`${url}/readyz`)).status, 503);
  assert.equal(fake.requests.length, 0, 'no request got through the TLS handshake');
  child.kill('SIGTERM');
  assert.equal(await exited, 0, log.slice(-2000));
});

test(
  '--namespaces through the CLI: Roles in two namespaces suffice, only namespaced paths are asked, other namespaces are left alone',
  { timeout: 180_000 },
  async (t) => {
    const run = await startInCluster(t, {
      args: ['--namespaces', 'team-a,team-b'],
      rbac: namespacedRbac(['team-a', 'team-b']),
    });
    const { fake, state } = run;
    const seeded = ['team-a', 'team-b'].map((ns) => fake.applyVmi(vmi('vm', { namespace: ns })));
    const other = fake.applyVmi(vmi('vm', { namespace: 'team-c' }));
    for (const v of seeded)
      await waitFor(
        `image in ${v.metadata.namespace}`,
        () => imageIn(state, v.metadata.namespace!, 'vm', v.metadata.uid!),
        60_000,
      );
    await waitFor('SeedReady Events in both', () =>
      seeded.every((v) =>
        fake.events().some((e) => e.reason === 'SeedReady' && e.involvedObject.uid === v.metadata.uid),
      ),
    );
    const url = await run.url();
    await waitFor('ready', async () => (await fetch(`${url}/readyz`)).status === 200, 60_000);
    assert.equal(existsSync(join(state, 'team-c')), false);
    assert.equal(imageIn(state, 'team-c', 'vm', other.metadata.uid!), false);
    for (const r of fake.requests) {
      assert.match(r.path, /^\/api(s\/[^/]+)?\/v1\/namespaces\/team-[ab]\//, `${r.method} ${r.path}`);
      assert.ok(r.status < 400, `${r.method} ${r.path} ${r.status}`);
    }
    run.child.kill('SIGTERM');
    assert.equal(await run.exited, 0, run.log().slice(-2000));
  },
);
