// /readyz of the running agent CLI. The API server going away and coming
// back is covered by test/agent/cluster-cli.test.ts (status code) and
// metrics-after-reconcile.test.ts (vmseed_informer_synced); here: the
// reasons it gives, and the state directory becoming unwritable or
// disappearing under a running agent, and recovering.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { chmod, chown, mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { NODE, tempDir, vmi, waitFor } from '../support/agent-harness.ts';
import { readyz, startCliAgent } from '../support/agent-cli.ts';

// root writes through any mode bits, so as root the agent runs as nobody.
const AS_ROOT = process.getuid?.() === 0;
const NOBODY = 65534;

const startCli = (args: string[], env: Record<string, string> = {}) =>
  startCliAgent([...args, '--status-listen', '127.0.0.1:0'], { env, ...(AS_ROOT ? { uid: NOBODY, gid: NOBODY } : {}) });

test(
  'local mode: /readyz false while the state directory is not writable or gone, true again after',
  { timeout: 180_000 },
  async (t) => {
    const dir = await tempDir('vmseed-readyz-');
    t.after(() => dir.remove());
    const manifests = join(dir.path, 'manifests');
    const state = join(dir.path, 'seeds');
    await mkdir(manifests);
    await mkdir(state);
    await writeFile(
      join(manifests, 'a.yaml'),
      'apiVersion: kubevirt.io/v1\nkind: VirtualMachineInstance\nmetadata: {name: a, namespace: default, annotations: {vmseed.io/cloud-init: "userData: \\"#cloud-config\\\\n\\"\\n"}}\nspec: {domain: {}}\n',
    );
    if (AS_ROOT)
      for (const p of [dir.path, manifests, state, join(manifests, 'a.yaml')]) await chown(p, NOBODY, NOBODY);
    const run = startCli(['--local', manifests, '--state-dir', state]);
    try {
      const url = await run.url();
      await waitFor('ready', async () => (await readyz(url)).status === 200, 60_000);

      await chmod(state, 0o555);
      const down = await waitFor(
        'not ready: read-only state dir',
        async () => {
          const r = await readyz(url);
          return r.status === 503 && r;
        },
        60_000,
      );
      assert.ok(down.body.includes(`state directory ${state} is not writable`), down.body);
      assert.ok(!/VMI watch/.test(down.body), `only the state directory is wrong: ${down.body}`);
      await chmod(state, 0o755);
      await waitFor('ready again', async () => (await readyz(url)).status === 200, 60_000);

      // Gone altogether (someone cleaned the hostPath): not ready until it is back.
      await rm(state, { recursive: true });
      const gone = await waitFor(
        'not ready: state dir gone',
        async () => {
          const r = await readyz(url);
          return r.status === 503 && r;
        },
        60_000,
      );
      assert.ok(gone.body.includes(`state directory ${state} does not exist`), gone.body);
      await mkdir(state);
      if (AS_ROOT) await chown(state, NOBODY, NOBODY);
      await waitFor('ready once recreated', async () => (await readyz(url)).status === 200, 60_000);
      // A file where the directory should be: writable, but no place for images.
      await rm(state, { recursive: true });
      await writeFile(state, '');
      if (AS_ROOT) await chown(state, NOBODY, NOBODY);
      const file = await waitFor(
        'not ready: state dir is a file',
        async () => {
          const r = await readyz(url);
          return r.status === 503 && r;
        },
        60_000,
      );
      assert.ok(file.body.includes(`state directory ${state} is not a directory`), file.body);
      await rm(state);
      await mkdir(state);
      if (AS_ROOT) await chown(state, NOBODY, NOBODY);
      await waitFor('ready once a directory again', async () => (await readyz(url)).status === 200, 60_000);
      // /healthz never cared: the process was alive throughout.
      assert.equal((await fetch(`${url}/healthz`)).status, 200);
    } finally {
      const code = await run.stop();
      assert.equal(code, 0, run.output().slice(-2000));
    }
  },
);

test(
  'cluster mode: /readyz names the watch while the API server is away, and recovers',
  { timeout: 180_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir('vmseed-readyz-kube-');
    t.after(async () => {
      await fake.close();
      await dir.remove();
    });
    fake.applyVmi(vmi('one'));
    const kubeconfig = await fake.writeKubeconfig(dir.path);
    if (AS_ROOT) await chown(dir.path, NOBODY, NOBODY);
    if (AS_ROOT) await chown(kubeconfig, NOBODY, NOBODY);
    const run = startCli(['--kubeconfig', kubeconfig, '--state-dir', join(dir.path, 'seeds'), '--libvirt', 'off'], {
      NODE_NAME: NODE,
    });
    try {
      const url = await run.url();
      await waitFor('ready', async () => (await readyz(url)).status === 200, 60_000);
      await fake.refuse(true);
      const down = await waitFor(
        'not ready',
        async () => {
          const r = await readyz(url);
          return r.status === 503 && r;
        },
        60_000,
      );
      assert.match(down.body, /VMI watch is not connected/);
      assert.ok(!down.body.includes('state directory'), down.body);
      await fake.refuse(false);
      await waitFor('ready again', async () => (await readyz(url)).status === 200, 60_000);
      // and it reconciles what changed meanwhile
      fake.applyVmi(vmi('two'));
      await waitFor(
        'two seeded',
        async () => {
          const s = (await (await fetch(`${url}/status.json`)).json()) as {
            vmis: Array<{ name: string; state: string }>;
          };
          return s.vmis.some((v) => v.name === 'two' && v.state === 'ready');
        },
        60_000,
      );
    } finally {
      const code = await run.stop();
      assert.equal(code, 0, run.output().slice(-2000));
    }
  },
);
