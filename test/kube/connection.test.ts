import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { inClusterConnection, KubeConnection, loadConnection } from '../../src/kube/connection.ts';
import { VmseedError } from '../../src/errors.ts';
import { tempDir } from '../support/agent-harness.ts';

test('kubeconfig: current context, token file relative to the file, inline CA', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  await writeFile(join(dir.path, 'tok'), 'secret-token\n');
  const kc = join(dir.path, 'config');
  await writeFile(
    kc,
    `apiVersion: v1
kind: Config
clusters:
- {name: other, cluster: {server: "https://other:6443"}}
- {name: main, cluster: {server: "https://api.example:6443/", certificate-authority-data: ${Buffer.from('-----BEGIN CERTIFICATE-----\n').toString('base64')}}}
users:
- {name: agent, user: {tokenFile: tok}}
contexts:
- {name: a, context: {cluster: other, user: agent}}
- {name: b, context: {cluster: main, user: agent}}
current-context: b
`,
  );
  const c = await loadConnection(kc);
  t.after(() => c.close());
  assert.equal(c.getCurrentCluster().server, 'https://api.example:6443');
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer secret-token' });
});

test('kubeconfig errors are CONFIG_INVALID and name the problem, not the secret', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const kc = join(dir.path, 'config');
  await writeFile(kc, 'current-context: nope\ncontexts: []\n');
  await assert.rejects(
    () => loadConnection(kc),
    (e: unknown) =>
      e instanceof VmseedError && e.code === 'CONFIG_INVALID' && /current-context 'nope' not found/.test(e.message),
  );
  await assert.rejects(
    () => loadConnection(join(dir.path, 'missing')),
    (e: unknown) => e instanceof VmseedError && /ENOENT/.test(e.message),
  );
});

test('in-cluster: service account CA and rotating token file', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const sa = join(dir.path, 'sa');
  await mkdir(sa);
  await writeFile(join(sa, 'ca.crt'), 'CA');
  await writeFile(join(sa, 'token'), 'tok-1');
  const c = inClusterConnection({ KUBERNETES_SERVICE_HOST: '10.0.0.1', KUBERNETES_SERVICE_PORT: '443' }, sa);
  t.after(() => c.close());
  assert.equal(c.getCurrentCluster().server, 'https://10.0.0.1:443');
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer tok-1' });
  assert.throws(() => inClusterConnection({}, sa), /KUBERNETES_SERVICE_HOST is not set/);
});

test('token file: re-read after its period and on demand after a 401; an oversized file is not a token', async (t) => {
  const dir = await tempDir();
  t.after(() => dir.remove());
  const file = join(dir.path, 'token');
  await writeFile(file, 'tok-1\n');
  const c = new KubeConnection({ server: 'https://127.0.0.1:1', tokenFile: file, tokenRereadMs: 60_000 });
  t.after(() => c.close());
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer tok-1' });
  await writeFile(file, 'tok-2\n');
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer tok-1' }, 'cached within the period');
  assert.equal(c.tokenRejected(), true, 'a 401 re-reads at once: a new token, worth a retry');
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer tok-2' });
  assert.equal(c.tokenRejected(), false, 'the same token again: no retry');
  await writeFile(file, 'x'.repeat(65 * 1024));
  assert.equal(c.tokenRejected(), false);
  assert.deepEqual(c.authHeaders(), { Authorization: 'Bearer tok-2' }, 'the last good token is kept');
  const quick = new KubeConnection({ server: 'https://127.0.0.1:1', tokenFile: file, tokenRereadMs: 0 });
  t.after(() => quick.close());
  await writeFile(file, 'tok-3');
  assert.deepEqual(quick.authHeaders(), { Authorization: 'Bearer tok-3' });
  await new Promise((r) => setTimeout(r, 5));
  await writeFile(file, 'tok-4');
  assert.deepEqual(quick.authHeaders(), { Authorization: 'Bearer tok-4' }, 'the period elapsed: read again');
});
