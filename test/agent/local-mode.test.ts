// `vmseed agent --local DIR` as a real subprocess: files dropped into the
// directory become images, edits change them, deletions remove them; the
// status page serves them; SIGTERM stops it with exit 0.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { mkdir, rename, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { isoFilesUnder, tempDir, waitFor } from '../support/agent-harness.ts';

const ROOT = new URL('../../', import.meta.url).pathname;
const NODE_BIN = process.execPath;

function vmiYaml(name: string, hostname: string, extra = ''): string {
  return `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: ${name}
  namespace: default
  annotations:
    vmseed.io/cloud-init: |
      ${extra || `userData: |\n        #cloud-config\n        hostname: ${hostname}`}
spec:
  domain: {}
`;
}

// Write beside, then rename: editors and `kubectl`-style tools replace files
// atomically, and a half-written file would be a parse error.
async function put(path: string, text: string): Promise<void> {
  await writeFile(`${path}.partial`, text);
  await rename(`${path}.partial`, path);
}

const findImages = isoFilesUnder;

function isoFile(image: string, file: string): string {
  return execFileSync('isoinfo', ['-i', image, '-R', '-x', `/${file}`], { encoding: 'utf8' });
}

test('local mode end to end: images appear, change and disappear with the files', { timeout: 180_000 }, async (t) => {
  const dir = await tempDir('vmseed-local-');
  const manifests = join(dir.path, 'manifests');
  const state = join(dir.path, 'seeds');
  await mkdir(manifests);
  await put(join(manifests, 'one.yaml'), vmiYaml('one', 'first-host'));

  const child = spawn(
    NODE_BIN,
    [
      join(ROOT, 'src/main.ts'),
      'agent',
      '--local',
      manifests,
      '--state-dir',
      state,
      '--listen',
      '127.0.0.1:0',
      '--log-level',
      'debug',
    ],
    {
      cwd: dir.path,
      stdio: ['ignore', 'pipe', 'pipe'],
    },
  );
  let log = '';
  child.stdout.on('data', (d) => (log += d));
  child.stderr.on('data', (d) => (log += d));
  const exited = new Promise<number | null>((r) => child.on('exit', (code) => r(code)));
  t.after(async () => {
    if (child.exitCode === null) child.kill('SIGKILL');
    await dir.remove();
  });

  await waitFor('first image', () => findImages(state).length === 1, 60_000);
  const first = join(state, findImages(state)[0]);
  assert.match(isoFile(first, 'user-data'), /hostname: first-host/);
  assert.match(first, /default\/one_[0-9a-f-]+\/nocloud-[0-9a-f]{16}\.iso$/);

  // the status page lists it
  const url = await waitFor('listen url', () => /"url":"(http:\/\/127\.0\.0\.1:\d+)"/.exec(log)?.[1]);
  const status = (await (await fetch(`${url}/status.json`)).json()) as {
    version: string;
    config: { listen: string };
    vmis: Array<{ name: string; state: string }>;
  };
  // The version `vmseed --version` prints, here and in vmseed_build_info.
  const version = (JSON.parse(readFileSync(join(ROOT, 'package.json'), 'utf8')) as { version: string }).version;
  assert.equal(status.version, version);
  assert.ok(
    (await (await fetch(`${url}/metrics`)).text())
      .split('\n')
      .includes(`vmseed_build_info{version="${version}",nodejs_version="${process.version}"} 1`),
    'vmseed_build_info names the version and Node.js',
  );
  assert.deepEqual(
    status.vmis.map((v) => [v.name, v.state]),
    [['one', 'ready']],
  );
  // --listen 127.0.0.1:0: the page names the port actually bound.
  assert.equal(status.config.listen, new URL(url).host);

  // add: a second file with a VMI, its Secret in another, multi-document
  await put(
    join(manifests, 'two.yaml'),
    `apiVersion: v1
kind: Secret
metadata: {name: two-ud, namespace: default}
stringData:
  userdata: |
    #cloud-config
    hostname: from-secret
---
${vmiYaml('two', '', 'secretRef: {name: two-ud}')}`,
  );
  await waitFor('second image', () => findImages(state).length === 2, 60_000);
  const second = join(
    state,
    findImages(state).find((p) => p.includes('/two_'))!,
  );
  const imageOf = (vmi: string) =>
    findImages(state)
      .filter((p) => p.includes(`/${vmi}_`))
      .map((p) => join(state, p));
  assert.match(isoFile(second, 'user-data'), /hostname: from-secret/);

  // edit: a new content-addressed image; the old one is pruned (no libvirt)
  await put(join(manifests, 'one.yaml'), vmiYaml('one', 'edited-host'));
  await waitFor('edited image', () => imageOf('one').length === 1 && imageOf('one')[0] !== first, 60_000);
  const edited = imageOf('one')[0];
  assert.match(isoFile(edited, 'user-data'), /edited-host/);
  assert.equal(existsSync(first), false);

  // editing the Secret re-seeds the VMI that uses it
  await put(
    join(manifests, 'two.yaml'),
    readFileSync(join(manifests, 'two.yaml'), 'utf8').replace('hostname: from-secret', 'hostname: secret-edited'),
  );
  await waitFor('secret edit applied', () => imageOf('two').length === 1 && imageOf('two')[0] !== second, 60_000);
  assert.match(isoFile(imageOf('two')[0], 'user-data'), /secret-edited/);

  // a broken VMI is reported, the others stay
  await put(join(manifests, 'bad.yaml'), vmiYaml('bad', '', 'userDataBase64: "not base64 at all!"'));
  await waitFor('error logged', () => log.includes('USERDATA_BASE64_INVALID'), 60_000);
  assert.equal(findImages(state).length, 2);

  // delete: the image goes
  await rm(join(manifests, 'one.yaml'));
  await waitFor('image removed', () => !existsSync(edited), 60_000);
  assert.equal(findImages(state).length, 1);

  child.kill('SIGTERM');
  assert.equal(await exited, 0);
  assert.match(log, /vmseed agent stopped/);
  assert.ok(!log.includes('from-secret') && !log.includes('secret-edited'), 'no user-data in the log');
});

test('bad flags: one line on stderr, exit 2', async () => {
  for (const args of [
    ['--concurrency', 'lots'],
    ['--kubevirt-volumes', 'mine'],
    ['--local', '.', '--listen', 'nowhere'],
    ['--bogus'],
  ]) {
    const r = await new Promise<{ code: number | null; stderr: string }>((resolve) => {
      const c = spawn(NODE_BIN, [join(ROOT, 'src/main.ts'), 'agent', ...args], {
        stdio: ['ignore', 'ignore', 'pipe'],
        env: { ...process.env, NODE_NAME: 'n1' },
      });
      let stderr = '';
      c.stderr.on('data', (d) => (stderr += d));
      c.on('exit', (code) => resolve({ code, stderr }));
    });
    assert.equal(r.code, 2, args.join(' '));
    assert.equal(r.stderr.trim().split('\n').length, 1, r.stderr);
    assert.match(r.stderr, /^vmseed agent: /);
  }
});
