// IMDS's endpoints through the 169.254.169.254 redirect, in network
// namespaces this test makes: the datasource listener on the "node"
// address, vmseed's DNAT in the node namespace, a "launcher pod" namespace
// whose address an IMDS VMI reports. From the pod: cloud-init's own
// OpenStack MetadataReader reads the VMI's tree at http://169.254.169.254
// (its EC2 probe included, answered 404), /v1/identity and /v1/token answer
// as IMDS does, forwarding headers are refused, and the node
// itself (not a pod interface) reaches nothing.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import pino from 'pino';
import { execNft, RedirectKeeper } from '../../src/redirect/keeper.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import { makePodNode, sh, stopChild, type PodNode } from '../support/netns.ts';
import { launcherJwt, projectedToken } from '../datasource/imds-support.ts';

const POD_UID = '44444444-4444-4444-8444-444444444444';
const TOKEN = launcherJwt({ exp: 1_700_000_000 }, { namespace: 'tenant', serviceAccount: 'sa-vm', pod: POD_UID });

// One request from the pod with headers (python urllib, no proxy).
const GET = `
import sys, json, urllib.request, urllib.error
req = urllib.request.Request(sys.argv[1], headers=json.loads(sys.argv[2]))
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(req, timeout=3)
    print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except Exception as e:
    print(json.dumps({"status": 0, "body": type(e).__name__}))
`;

const READ_V2 = `
import base64, json, sys
from cloudinit.sources.helpers import openstack
r = openstack.MetadataReader(sys.argv[1], timeout=5, retries=0)
try:
    res = r.read_v2()
    print(json.dumps({"ok": True, "metadata": res["metadata"], "userdata": base64.b64encode(res["userdata"]).decode(), "vendordata": res.get("vendordata"), "ec2": res.get("ec2-metadata")}))
except Exception as e:
    print(json.dumps({"ok": False, "error": type(e).__name__ + ": " + str(e)}))
`;

describe('IMDS endpoints through the 169.254.169.254 redirect', { timeout: 180_000 }, () => {
  let env: PodNode;
  let ds: ChildProcess | undefined;
  let keeper: RedirectKeeper;
  let podsDir: string;

  before(async () => {
    podsDir = await mkdtemp(join(tmpdir(), 'vmseed-pods-'));
    await projectedToken(podsDir, POD_UID, TOKEN);
    env = await makePodNode();
    ds = spawn(
      'ip',
      [
        ...['netns', 'exec', env.node, './node_modules/.bin/node', 'test/redirect/imds-node-datasource.ts'],
        ...[env.nodeAddress, '8081', env.podAddress, podsDir, POD_UID],
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const line = await new Promise<string>((resolve, reject) => {
      createInterface({ input: ds!.stdout! }).once('line', resolve);
      ds!.once('exit', (code) => reject(new Error(`datasource child exited ${code}`)));
    });
    assert.match(line, /^ready \d+$/);
    keeper = new RedirectKeeper({
      spec: {
        table: 'vmseed',
        to: { host: env.nodeAddress, port: 8081 },
        podInterfaces: ['veth*'],
        metadata: { address: '169.254.169.254', port: 80 },
      },
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      metrics: createRedirectMetrics(),
      intervalMs: 60_000,
      // The pod is a launcher: the only sources redirected.
      launchers: async () => [env.podAddress],
    });
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
  });
  after(async () => {
    await keeper?.stop().catch(() => {});
    await stopChild(ds);
    await env?.remove();
    await rm(podsDir, { recursive: true, force: true });
  });

  const from = async (ns: string, url: string, headers: Record<string, string> = {}) => {
    const { stdout } = await sh([
      'ip',
      'netns',
      'exec',
      ns,
      '/usr/bin/python3',
      '-c',
      GET,
      url,
      JSON.stringify(headers),
    ]);
    return JSON.parse(stdout) as { status: number; body: string };
  };

  test("cloud-init's OpenStack MetadataReader reads the IMDS VMI's tree at 169.254.169.254", async () => {
    const { stdout } = await sh(env.inPod(['/usr/bin/python3', '-c', READ_V2, 'http://169.254.169.254']), {
      timeoutMs: 60_000,
    });
    const r = JSON.parse(stdout) as {
      ok: boolean;
      error?: string;
      metadata: Record<string, unknown>;
      userdata: string;
    };
    assert.ok(r.ok, r.error);
    assert.equal(r.metadata.uuid, 'iid-vm');
    assert.equal(r.metadata['instance-id'], 'iid-vm');
    assert.match(Buffer.from(r.userdata, 'base64').toString(), /secret-of-vm/);
  });

  test('identity and token as IMDS answers them; forwarding headers are refused', async () => {
    const id = await from(env.pod, 'http://169.254.169.254/v1/identity', { Metadata: 'true' });
    assert.equal(id.status, 200);
    assert.equal(id.body, '{"namespace":"tenant","serviceAccountName":"sa-vm","vmName":"vm"}\n');
    const forwarded = await from(env.pod, 'http://169.254.169.254/v1/token', {
      Metadata: 'true',
      'X-Forwarded-For': '192.0.2.99',
    });
    assert.equal(forwarded.status, 400);
    assert.ok(!forwarded.body.includes(TOKEN));
    const tok = await from(env.pod, 'http://169.254.169.254/v1/token', { Metadata: 'true', 'X-Real-IP': '192.0.2.99' });
    assert.equal(tok.body, `{"token":"${TOKEN}","expirationTimestamp":"2023-11-14T22:13:20Z"}\n`);
    const bare = await from(env.pod, 'http://169.254.169.254/v1/token');
    assert.equal(bare.status, 400);
    assert.match(bare.body, /missing_header/);
    // From the node's own namespace the VMI's address is not the source:
    // not redirected, and the listener itself answers that address nothing.
    assert.equal((await from(env.node, 'http://169.254.169.254/v1/identity', { Metadata: 'true' })).status, 0);
    const direct = await from(env.node, `http://${env.nodeAddress}:8081/v1/token`, {
      Metadata: 'true',
      'X-Real-IP': env.podAddress,
    });
    assert.equal(direct.status, 404);
    assert.ok(!direct.body.includes(TOKEN));
  });
});
