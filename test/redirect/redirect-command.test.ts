// `vmseed redirect` as the sidecar runs it, inside the test's "node"
// namespace: /readyz turns 200 once the rule is in, a pod's request reaches
// the datasource while it is in --launchers-file and not once the agent's
// file leaves it out, SIGTERM removes the table and exits 0. Bad flags exit 2.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { signToken } from '../../src/datasource/tokens.ts';
import { writeLauncherFile } from '../../src/redirect/launcher-file.ts';
import { getFrom, makePodNode, sh, startNodeDatasource } from '../support/netns.ts';
import { runCli } from '../support/cli.ts';

test(
  'vmseed redirect: ready when in place, serves the pod through the DNAT, removes its table on SIGTERM',
  { timeout: 60_000 },
  async (t) => {
    const env = await makePodNode();
    t.after(() => env.remove());
    const key = randomBytes(32);
    const ds = await startNodeDatasource(env, key, 'uid-1');
    t.after(() => void ds.kill('SIGTERM'));
    const shared = mkdtempSync(join(tmpdir(), 'vmseed-launchers-'));
    t.after(() => rmSync(shared, { recursive: true, force: true }));
    const launchers = join(shared, 'launcher-addresses');
    await writeLauncherFile(launchers, [env.podAddress]);
    const child = spawn(
      'ip',
      [
        'netns',
        'exec',
        env.node,
        './node_modules/.bin/node',
        'src/main.ts',
        'redirect',
        '--to',
        `${env.nodeAddress}:8081`,
        '--pod-interface',
        'veth*',
        '--listen',
        '127.0.0.1:18082',
        '--interval',
        '60',
        '--launchers-file',
        launchers,
      ],
      {
        stdio: ['ignore', 'ignore', 'pipe'],
      },
    );
    let stderr = '';
    child.stderr.on('data', (c: Buffer) => (stderr += c.toString()));
    const exited = new Promise<number | null>((r) => child.once('exit', (code) => r(code)));
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline && (await getFrom(env.node, 'http://127.0.0.1:18082/readyz', 1)).status !== 200)
      await new Promise((r) => setTimeout(r, 200));
    assert.equal((await getFrom(env.node, 'http://127.0.0.1:18082/readyz')).status, 200, stderr);
    const md = await getFrom(env.pod, `http://169.254.169.254/v1/${signToken(new Uint8Array(key), 'uid-1')}/meta-data`);
    assert.equal(md.status, 200);
    assert.match((await getFrom(env.node, 'http://127.0.0.1:18082/metrics')).body, /vmseed_redirect_in_place 1/);
    // The agent's file without the pod: followed on change (the interval is
    // a minute), and the pod is redirected no more.
    await writeLauncherFile(launchers, []);
    const gone = Date.now() + 10_000;
    while (
      Date.now() < gone &&
      (await sh(env.inNode(['nft', 'list', 'set', 'ip', 'vmseed', 'launchers']))).stdout.includes(env.podAddress)
    )
      await new Promise((r) => setTimeout(r, 100));
    assert.doesNotMatch(
      (await sh(env.inNode(['nft', 'list', 'set', 'ip', 'vmseed', 'launchers']))).stdout,
      /192\.0\.2\.2/,
    );
    assert.equal(
      (await getFrom(env.pod, `http://169.254.169.254/v1/${signToken(new Uint8Array(key), 'uid-1')}/meta-data`, 1))
        .status,
      0,
    );
    child.kill('SIGTERM');
    assert.equal(await exited, 0, stderr);
    assert.doesNotMatch((await sh(env.inNode(['nft', 'list', 'tables']))).stdout, /vmseed/);
    assert.match(stderr, /redirect removed/);
  },
);

test(
  'vmseed redirect --datasource-key-file: ready only while --to answers the challenge; a target without the datasource is 503',
  { timeout: 60_000 },
  async (t) => {
    const env = await makePodNode();
    t.after(() => env.remove());
    const key = randomBytes(32);
    const ds = await startNodeDatasource(env, key, 'uid-1');
    t.after(() => void ds.kill('SIGTERM'));
    const dir = mkdtempSync(join(tmpdir(), 'vmseed-redirect-key-'));
    t.after(() => rmSync(dir, { recursive: true, force: true }));
    writeFileSync(join(dir, 'keys'), `${key.toString('base64')}\n`);
    const sidecar = async (port: number, listen: number) => {
      const child = spawn(
        'ip',
        [
          ...env.inNode(['./node_modules/.bin/node', 'src/main.ts', 'redirect']),
          `--to=${env.nodeAddress}:${port}`,
          '--pod-interface=veth*',
          `--listen=127.0.0.1:${listen}`,
          '--interval=0.2',
          `--datasource-key-file=${join(dir, 'keys')}`,
        ].slice(1),
        { stdio: 'ignore' },
      );
      const exited = new Promise((r) => child.once('exit', r));
      const url = `http://127.0.0.1:${listen}/readyz`;
      let last = { status: 0, body: '' };
      for (const deadline = Date.now() + 30_000; Date.now() < deadline; await new Promise((r) => setTimeout(r, 200))) {
        last = await getFrom(env.node, url, 1);
        if (last.status === 200 || /DNAT target .*:/.test(last.body)) break;
      }
      child.kill('SIGTERM');
      await exited;
      return last;
    };
    const wrong = await sidecar(8091, 18083);
    assert.equal(wrong.status, 503);
    assert.match(wrong.body, /nothing answers at the DNAT target 192\.0\.2\.1:8091/);
    const right = await sidecar(8081, 18084);
    assert.deepEqual(right, { status: 200, body: 'redirect in place\n' });
  },
);

test('vmseed redirect: usage errors exit 2 with one line', async () => {
  const r = await runCli(['redirect', '--to', 'example.com:80', '--print'], process.cwd());
  assert.equal(r.code, 2);
  assert.match(r.err, /must be an IPv4 address/);
  const none = await runCli(['redirect', '--print'], process.cwd());
  assert.equal(none.code, 2);
  assert.match(none.err, /--to HOST:PORT is required/);
  const ok = await runCli(['redirect', '--to', '192.0.2.1:8081', '--print'], process.cwd());
  assert.equal(ok.code, 0);
  assert.match(ok.out.toString(), /dnat to 192\.0\.2\.1:8081/);
});
