// The redirect proven in network namespaces this test makes (nothing else
// is touched): a "node" namespace running the datasource listener on its
// own address and the redirect, a "launcher pod" namespace with a veth to
// the node and a default route through it. A request from the pod to
// 169.254.169.254:80 reaches the listener through the DNAT; cloud-init's
// own NoCloud reader gets the seed; a made-up token is 404; the rule
// survives `nft flush ruleset` (re-applied) and iptables-nft beside it;
// removing it makes /readyz fail and the agent's status page (polling the
// sidecar's /readyz) say "missing"; a clean stop removes it.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import pino from 'pino';
import { signToken } from '../../src/datasource/tokens.ts';
import { execNft, RedirectKeeper } from '../../src/redirect/keeper.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import { startRedirectHealth, type RedirectHealthServer } from '../../src/redirect/health-server.ts';
import type { RedirectSpec } from '../../src/redirect/nft-ruleset.ts';
import { RedirectStatusPoller } from '../../src/redirect/status-poller.ts';
import { renderStatusPage, statusJson } from '../../src/http/status-page.ts';
import { sampleSnapshot } from '../support/fake-status.ts';
import { getFrom, makePodNode, sh, startNodeDatasource, stopChild, type PodNode } from '../support/netns.ts';

describe('169.254.169.254 redirect in network namespaces', () => {
  let env: PodNode;
  let ds: ChildProcess | undefined;
  const key = randomBytes(32);
  const uid = 'uid-vm';
  const token = signToken(new Uint8Array(key), uid);
  let spec: RedirectSpec;
  let keeper: RedirectKeeper;
  const metrics = createRedirectMetrics();
  let health: RedirectHealthServer;

  before(async () => {
    env = await makePodNode();
    ds = await startNodeDatasource(env, key, uid);
    spec = {
      table: 'vmseed',
      to: { host: env.nodeAddress, port: 8081 },
      podInterfaces: ['veth*'],
      metadata: { address: '169.254.169.254', port: 80 },
    };
    keeper = new RedirectKeeper({
      spec,
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      metrics,
      intervalMs: 200,
      // The pod is a launcher: the only sources redirected.
      launchers: async () => [env.podAddress],
    });
    health = await startRedirectHealth({ listen: { host: '127.0.0.1', port: 0 }, keeper, metrics });
  });
  after(async () => {
    await keeper?.stop().catch(() => {});
    await health?.close();
    await stopChild(ds);
    await env?.remove();
  });

  const readyz = async () => (await fetch(`http://127.0.0.1:${health.address.port}/readyz`)).status;
  // What the agent's status page shows, from the poller it runs.
  const agentView = async () => {
    const poller = new RedirectStatusPoller({
      url: `http://127.0.0.1:${health.address.port}/readyz`,
      timeoutMs: 10_000,
    });
    await poller.poll();
    const snap = { ...sampleSnapshot(), redirect: poller.status! };
    return {
      json: statusJson(snap, undefined, new Date()).redirect!,
      html: renderStatusPage(snap, { now: new Date() }),
    };
  };
  const seedUrl = `http://169.254.169.254/v1/${token}/`;

  test('before the redirect: the pod reaches nothing at 169.254.169.254; /readyz is 503', async () => {
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`, 1)).status, 0);
    assert.equal(await readyz(), 503);
  });

  test("applied: the pod's request reaches the node's listener through the DNAT; cloud-init's reader gets the seed; a made-up token is 404", async () => {
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
    assert.equal(await readyz(), 200);
    const md = await getFrom(env.pod, `${seedUrl}meta-data`);
    assert.equal(md.status, 200);
    assert.deepEqual(JSON.parse(md.body), { 'instance-id': 'iid-vm', 'local-hostname': 'host-vm' });
    const { stdout } = await sh(
      env.inPod([
        '/usr/bin/python3',
        'test/datasource/nocloud_datasource.py',
        '',
        `ds=nocloud-net;s=${seedUrl}`,
        'NoCloudNet',
        '0',
      ]),
    );
    const r = JSON.parse(stdout.trim().split('\n').at(-1)!);
    assert.equal(r.claimed, true, r.error);
    assert.match(Buffer.from(r.userdata, 'base64').toString(), /hostname: host-vm/);
    const bogus = await getFrom(
      env.pod,
      `http://169.254.169.254/v1/${signToken(new Uint8Array(randomBytes(32)), uid)}/user-data`,
    );
    assert.equal(bogus.status, 404);
    assert.equal(bogus.body, 'not found\n');
    // Only port 80 of 169.254.169.254 is redirected.
    assert.equal((await getFrom(env.pod, `http://169.254.169.254:8081/v1/${token}/meta-data`, 1)).status, 0);
    // Traffic from the node itself (not a pod interface) is not redirected.
    assert.equal((await getFrom(env.node, `${seedUrl}meta-data`, 1)).status, 0);
  });

  test('applying again changes nothing (one table, one rule)', async () => {
    await keeper.apply('start');
    const { stdout } = await sh(env.inNode(['nft', 'list', 'ruleset']));
    assert.equal(stdout.match(/dnat to/g)?.length, 1);
    assert.equal(stdout.match(/table ip vmseed/g)?.length, 1);
  });

  test('beside iptables-nft: its nat table is untouched, and flushing it leaves the redirect', async () => {
    await sh(env.inNode(['iptables', '-t', 'nat', '-A', 'PREROUTING', '-p', 'tcp', '--dport', '9', '-j', 'ACCEPT']));
    await keeper.tick();
    const listed = (await sh(env.inNode(['iptables', '-t', 'nat', '-S', 'PREROUTING']))).stdout;
    assert.match(listed, /--dport 9 -j ACCEPT/);
    await sh(env.inNode(['iptables', '-t', 'nat', '-F']));
    assert.equal(await keeper.check(), true);
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`)).status, 200);
  });

  test('removed behind its back: /readyz fails at the next check; the next round re-applies it', async () => {
    await sh(env.inNode(['nft', 'delete', 'table', 'ip', 'vmseed']));
    assert.equal(await keeper.check(), false);
    assert.equal(await readyz(), 503);
    assert.match(
      await (await fetch(`http://127.0.0.1:${health.address.port}/metrics`)).text(),
      /vmseed_redirect_in_place 0/,
    );
    const view = await agentView();
    assert.deepEqual([view.json.state, view.json.reason], ['missing', 'missing']);
    assert.match(view.html, /data-redirect="missing"/);
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`, 1)).status, 0);
    await keeper.tick();
    assert.equal(await readyz(), 200);
    assert.equal((await agentView()).json.state, 'in-place');
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`)).status, 200);
  });

  test('`nft flush ruleset`: the running keeper puts the rule back by itself', async () => {
    void keeper.start();
    await sh(env.inNode(['nft', 'flush', 'ruleset']));
    const deadline = Date.now() + 20_000;
    while (Date.now() < deadline && (await getFrom(env.pod, `${seedUrl}meta-data`, 1)).status !== 200)
      await new Promise((r) => setTimeout(r, 100));
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`)).status, 200);
    const text = await (await fetch(`http://127.0.0.1:${health.address.port}/metrics`)).text();
    assert.match(text, /vmseed_redirect_applies_total\{reason="missing"\} [1-9]/);
    assert.match(text, /vmseed_redirect_in_place 1/);
  });

  test('clean stop: the table is removed, the pod reaches nothing', async () => {
    await keeper.stop();
    const { stdout } = await sh(env.inNode(['nft', 'list', 'tables']));
    assert.doesNotMatch(stdout, /vmseed/);
    assert.equal(await readyz(), 503);
    assert.deepEqual([(await agentView()).json.state, (await agentView()).json.reason], ['missing', 'stopped']);
    assert.equal((await getFrom(env.pod, `${seedUrl}meta-data`, 1)).status, 0);
  });
});
