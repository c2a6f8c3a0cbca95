// client-node is loaded only for a kubeconfig: a process connecting with the
// service account (as the DaemonSet's agent does) never resolves a module of
// it. Each child records every module URL it resolves (a module.registerHooks
// resolve hook, which sees ESM imports and require() alike), connects, and
// makes one call; the kubeconfig child is the control that the hook sees
// client-node when it is loaded.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { readFile, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { promisify } from 'node:util';
import { FakeKube } from '../support/fake-kube.ts';
import { serviceAccountVolume } from '../support/in-cluster.ts';
import { tempDir } from '../support/agent-harness.ts';

const run = promisify(execFile);
const CLIENT_NODE = '/node_modules/@kubernetes/client-node/';

test('the in-cluster connection does not load client-node; a kubeconfig one does', async (t) => {
  const fake = await FakeKube.start();
  t.after(() => fake.close());
  const dir = await tempDir();
  t.after(() => dir.remove());
  const hooks = join(dir.path, 'hooks.mjs');
  await writeFile(
    hooks,
    `import { registerHooks } from 'node:module';
import { writeFileSync } from 'node:fs';
const seen = [];
registerHooks({
  resolve(specifier, context, next) {
    const r = next(specifier, context);
    seen.push(r.url);
    return r;
  },
});
process.on('exit', () => writeFileSync(process.env.SEEN_FILE, JSON.stringify(seen)));
`,
  );
  const child = join(dir.path, 'child.mjs');
  await writeFile(
    child,
    `const { loadConnection } = await import(${JSON.stringify(new URL('../../src/kube/connection.ts', import.meta.url).href)});
const { KubeConnectionApi } = await import(${JSON.stringify(new URL('../../src/kube/api-client.ts', import.meta.url).href)});
const conn = await loadConnection(process.env.KC || undefined);
const res = await new KubeConnectionApi(conn, { retry: { retries: 0 } }).request('GET', '/apis/kubevirt.io/v1/virtualmachineinstances');
await conn.close(100);
console.log(JSON.stringify({ status: res.status }));
`,
  );
  const seenBy = async (file: string, env: NodeJS.ProcessEnv, argv: string[]) => {
    const [cmd, ...args] = argv;
    const { stdout } = await run(cmd, args, { env: { ...env, SEEN_FILE: file }, timeout: 120_000 });
    const urls = JSON.parse(await readFile(file, 'utf8')) as string[];
    return { status: (JSON.parse(stdout.trim()) as { status: number }).status, urls };
  };
  const node = [process.execPath, '--import', pathToFileURL(hooks).href, child];

  const sa = await serviceAccountVolume(fake, dir.path);
  const inCluster = await seenBy(join(dir.path, 'in-cluster.json'), sa.env(), sa.command(node));
  assert.equal(inCluster.status, 200, 'the service account authenticated');
  assert.ok(
    inCluster.urls.some((u) => u.endsWith('/src/kube/connection.ts')),
    'the hook saw the modules',
  );
  assert.deepEqual(
    inCluster.urls.filter((u) => u.includes(CLIENT_NODE)),
    [],
  );

  const kubeconfig = await fake.writeKubeconfig(dir.path, sa.token);
  const env: NodeJS.ProcessEnv = { ...process.env, KC: kubeconfig };
  delete env.KUBERNETES_SERVICE_HOST;
  const viaKubeconfig = await seenBy(join(dir.path, 'kubeconfig.json'), env, node);
  assert.equal(viaKubeconfig.status, 200);
  assert.ok(
    viaKubeconfig.urls.some((u) => u.includes(CLIENT_NODE)),
    'the control: client-node is seen when loaded',
  );
});
