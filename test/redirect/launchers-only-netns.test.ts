// The redirect for VMs only, in network namespaces this test makes: a
// "node" namespace with a pod bridge (cni0), two pods on it (a KubeVirt
// launcher and a plain pod), the datasource listener on the node's address,
// and a stand-in for the cloud's metadata service listening on
// 169.254.169.254:80 in the node namespace (as the GKE metadata server or a
// cloud's link-local route answers pods). The agent's launcher file, written
// by its writer, decides which pod is redirected: the launcher's request
// reaches the datasource, the plain pod's reaches the cloud's service; once
// the launcher leaves the file its requests are not redirected any more, and
// once it is back they are again.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import pino from 'pino';
import { signToken } from '../../src/datasource/tokens.ts';
import { execNft, RedirectKeeper } from '../../src/redirect/keeper.ts';
import { LauncherFileWriter, readLauncherFile } from '../../src/redirect/launcher-file.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import { getFrom, sh, startNodeDatasource, stopChild, type PodNode } from '../support/netns.ts';

const CLOUD = `
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"cloud metadata service\\n"
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
s = http.server.HTTPServer(("169.254.169.254", 80), H)
print("ready", flush=True)
s.serve_forever()
`;

interface BridgeNode {
  node: string;
  launcher: string;
  plain: string;
  nodeAddress: string;
  launcherAddress: string;
  plainAddress: string;
  remove(): Promise<void>;
}

// node: cni0 192.0.2.1/24; each pod a veth on the bridge, its default route
// through the node.
async function makeBridgeNode(): Promise<BridgeNode> {
  const id = randomBytes(3).toString('hex');
  const node = `vmseed-${id}-node`;
  const pods = { launcher: `vmseed-${id}-launcher`, plain: `vmseed-${id}-plain` };
  const made: string[] = [];
  const remove = async () => {
    for (const ns of made.reverse()) await sh(['ip', 'netns', 'del', ns]).catch(() => {});
  };
  try {
    for (const ns of [node, pods.launcher, pods.plain]) {
      await sh(['ip', 'netns', 'add', ns]);
      made.push(ns);
      await sh(['ip', '-n', ns, 'link', 'set', 'lo', 'up']);
    }
    await sh(['ip', '-n', node, 'link', 'add', 'cni0', 'type', 'bridge']);
    await sh(['ip', '-n', node, 'addr', 'add', '192.0.2.1/24', 'dev', 'cni0']);
    await sh(['ip', '-n', node, 'link', 'set', 'cni0', 'up']);
    // The cloud's metadata address, local to the node.
    await sh(['ip', '-n', node, 'addr', 'add', '169.254.169.254/32', 'dev', 'lo']);
    for (const [i, ns] of [pods.launcher, pods.plain].entries()) {
      const veth = `veth${id}${i}`;
      await sh(['ip', '-n', node, 'link', 'add', veth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', ns]);
      await sh(['ip', '-n', node, 'link', 'set', veth, 'master', 'cni0']);
      await sh(['ip', '-n', node, 'link', 'set', veth, 'up']);
      await sh(['ip', '-n', ns, 'addr', 'add', `192.0.2.${10 + i}/24`, 'dev', 'eth0']);
      await sh(['ip', '-n', ns, 'link', 'set', 'eth0', 'up']);
      await sh(['ip', '-n', ns, 'route', 'add', 'default', 'via', '192.0.2.1']);
    }
  } catch (e) {
    await remove();
    throw e;
  }
  return {
    node,
    launcher: pods.launcher,
    plain: pods.plain,
    nodeAddress: '192.0.2.1',
    launcherAddress: '192.0.2.10',
    plainAddress: '192.0.2.11',
    remove,
  };
}

describe('169.254.169.254 redirected for launcher pods only', () => {
  let env: BridgeNode;
  let ds: ChildProcess | undefined;
  let cloud: ChildProcess | undefined;
  let shared: string;
  let keeper: RedirectKeeper;
  let writer: LauncherFileWriter;
  const key = randomBytes(32);
  const uid = 'uid-vm';
  const seedUrl = `http://169.254.169.254/v1/${signToken(new Uint8Array(key), uid)}/meta-data`;
  // What the agent knows of its launchers; the writer reads it.
  let launchers = new Set<string>();
  const file = () => join(shared, 'launcher-addresses');

  before(async () => {
    env = await makeBridgeNode();
    shared = await mkdtemp(join(tmpdir(), 'vmseed-launchers-'));
    const asPodNode = { node: env.node, nodeAddress: env.nodeAddress } as PodNode;
    ds = await startNodeDatasource(asPodNode, key, uid);
    cloud = spawn('ip', ['netns', 'exec', env.node, '/usr/bin/python3', '-c', CLOUD], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    await new Promise<void>((resolve, reject) => {
      createInterface({ input: cloud!.stdout! }).once('line', () => resolve());
      cloud!.once('exit', (code) => reject(new Error(`cloud metadata stand-in exited ${code}`)));
    });
    launchers = new Set([env.launcherAddress]);
    writer = new LauncherFileWriter({
      path: file(),
      launcherAddresses: () => launchers,
      onError: (e) => assert.fail(e),
      intervalMs: 60_000,
    });
    await writer.poke();
    keeper = new RedirectKeeper({
      spec: {
        table: 'vmseed',
        to: { host: env.nodeAddress, port: 8081 },
        podInterfaces: ['veth*', 'cni0'],
        metadata: { address: '169.254.169.254', port: 80 },
      },
      runner: execNft({ prefix: ['ip', 'netns', 'exec', env.node] }),
      logger: pino({ level: 'silent' }),
      metrics: createRedirectMetrics(),
      // Short, so the interval alone picks up the file's changes.
      intervalMs: 200,
      launchers: async () => (await readLauncherFile(file())).addresses,
    });
    await keeper.start();
    assert.equal(keeper.inPlace, true);
  });
  after(async () => {
    await writer?.close();
    await keeper?.stop().catch(() => {});
    await stopChild(ds);
    await stopChild(cloud);
    await env?.remove();
    await rm(shared, { recursive: true, force: true });
  });

  // Until `pred` holds for what `from` gets at `url` (the keeper reads the
  // file every 200 ms).
  async function until(ns: string, url: string, pred: (r: { status: number; body: string }) => boolean) {
    let r = { status: 0, body: '' };
    for (const deadline = Date.now() + 10_000; Date.now() < deadline; await new Promise((s) => setTimeout(s, 100))) {
      r = await getFrom(ns, url, 2);
      if (pred(r)) break;
    }
    return r;
  }
  const fromCloud = (r: { body: string }) => r.body === 'cloud metadata service\n';

  test("the launcher pod reaches vmseed's datasource; the plain pod the cloud's metadata service", async () => {
    const md = await getFrom(env.launcher, seedUrl);
    assert.equal(md.status, 200);
    assert.equal(JSON.parse(md.body)['instance-id'], 'iid-vm');
    const plain = await getFrom(env.plain, seedUrl);
    assert.equal(plain.status, 200);
    assert.ok(fromCloud(plain), plain.body);
    assert.ok(fromCloud(await getFrom(env.plain, 'http://169.254.169.254/computeMetadata/v1/')));
    // The node itself keeps it too.
    assert.ok(fromCloud(await getFrom(env.node, 'http://169.254.169.254/latest/meta-data/')));
    const set = (await sh(['ip', 'netns', 'exec', env.node, 'nft', 'list', 'set', 'ip', 'vmseed', 'launchers'])).stdout;
    assert.match(set, /192\.0\.2\.10/);
    assert.doesNotMatch(set, /192\.0\.2\.11/);
  });

  test('the launcher gone from the agent: its requests are not redirected any more; back, they are again', async () => {
    launchers = new Set();
    await writer.poke();
    assert.deepEqual((await readLauncherFile(file())).addresses, []);
    const after = await until(env.launcher, seedUrl, fromCloud);
    assert.ok(fromCloud(after), `the former launcher got ${after.status} ${after.body}`);
    assert.ok(fromCloud(await getFrom(env.plain, seedUrl)));
    launchers = new Set([env.launcherAddress]);
    await writer.poke();
    const back = await until(env.launcher, seedUrl, (r) => r.status === 200 && r.body.includes('iid-vm'));
    assert.match(back.body, /iid-vm/);
    assert.ok(fromCloud(await getFrom(env.plain, seedUrl)));
  });

  test('the set survives `nft flush ruleset`: re-applied with the launchers in it', async () => {
    await sh(['ip', 'netns', 'exec', env.node, 'nft', 'flush', 'ruleset']);
    const r = await until(env.launcher, seedUrl, (x) => x.status === 200 && x.body.includes('iid-vm'));
    assert.match(r.body, /iid-vm/);
    assert.ok(fromCloud(await getFrom(env.plain, seedUrl)));
  });
});
