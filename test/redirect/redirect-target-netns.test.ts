// A redirect whose DNAT points at the wrong port, in network namespaces this
// test makes: the node runs the datasource on :8081 and another service on
// :8091. With the sidecar's target at :8091 the rule is there and a pod's
// `GET /v1/<token>/user-data` lands at the other service, so the keeper
// (checking its target with the datasource challenge) is not ready, says
// why, and the agent's status page shows "redirect reaches something else";
// pointed at :8081 it is ready and the page says "in place".
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { createInterface } from 'node:readline';
import pino from 'pino';
import { signToken } from '../../src/datasource/tokens.ts';
import { execNft, RedirectKeeper } from '../../src/redirect/keeper.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import { startRedirectHealth, type RedirectHealthServer } from '../../src/redirect/health-server.ts';
import { targetChecker } from '../../src/redirect/target-check.ts';
import { RedirectStatusPoller } from '../../src/redirect/status-poller.ts';
import { renderStatusPage, statusJson } from '../../src/http/status-page.ts';
import { sampleSnapshot } from '../support/fake-status.ts';
import { getFrom, makePodNode, startNodeDatasource, stopChild, type PodNode } from '../support/netns.ts';

// Answers 200 to anything and prints each request path.
const STAND_IN = `
import sys, http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        print("GET " + self.path, flush=True)
        self.send_response(200); self.send_header("Content-Length", "3"); self.end_headers(); self.wfile.write(b"ok\\n")
    def log_message(self, *a): pass
s = http.server.HTTPServer((sys.argv[1], int(sys.argv[2])), H)
print("ready", flush=True)
s.serve_forever()
`;

describe('a redirect pointed at the wrong port', () => {
  let env: PodNode;
  let ds: ChildProcess | undefined;
  let standIn: ChildProcess | undefined;
  const standInPaths: string[] = [];
  const key = randomBytes(32);
  const uid = 'uid-vm';
  const token = signToken(new Uint8Array(key), uid);
  const metrics = createRedirectMetrics();
  let keeper: RedirectKeeper | undefined;
  let health: RedirectHealthServer | undefined;

  before(async () => {
    env = await makePodNode();
    ds = await startNodeDatasource(env, key, uid);
    standIn = spawn('ip', ['netns', 'exec', env.node, '/usr/bin/python3', '-c', STAND_IN, env.nodeAddress, '8091'], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    const lines = createInterface({ input: standIn.stdout! });
    await new Promise<void>((resolve) =>
      lines.on('line', (l) => (l === 'ready' ? resolve() : standInPaths.push(l.replace(/^GET /, '')))),
    );
  });
  after(async () => {
    await keeper?.stop().catch(() => {});
    await health?.close();
    standIn?.kill('SIGTERM');
    await stopChild(ds);
    await env?.remove();
  });

  // The sidecar as `vmseed redirect --to NODE:port --datasource-key-file`
  // runs it, its nft and its challenge in the node namespace.
  async function sidecar(port: number): Promise<void> {
    await keeper?.stop();
    await health?.close();
    const to = { host: env.nodeAddress, port };
    keeper = new RedirectKeeper({
      spec: { table: 'vmseed', to, podInterfaces: ['veth*'], metadata: { address: '169.254.169.254', port: 80 } },
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      metrics,
      launchers: async () => [env.podAddress],
      verifyTarget: targetChecker({
        to,
        keys: async () => [new Uint8Array(key)],
        get: (url, timeoutMs) => getFrom(env.node, url, timeoutMs / 1000),
      }),
    });
    health = await startRedirectHealth({ listen: { host: '127.0.0.1', port: 0 }, keeper, metrics });
    await keeper.tick('start');
  }

  const readyz = async () => {
    const res = await fetch(`http://127.0.0.1:${health!.address.port}/readyz`, {
      headers: { accept: 'application/json' },
    });
    return { status: res.status, body: (await res.json()) as { inPlace: boolean; reason?: string; message?: string } };
  };
  const agentView = async () => {
    const poller = new RedirectStatusPoller({ url: `http://127.0.0.1:${health!.address.port}/readyz` });
    await poller.poll();
    const snap = { ...sampleSnapshot(), redirect: poller.status! };
    return {
      json: statusJson(snap, undefined, new Date()).redirect!,
      html: renderStatusPage(snap, { now: new Date() }),
    };
  };

  test('DNAT to :8091: the rule is in place, a guest request reaches the other service, and nothing says ready', async () => {
    await sidecar(8091);
    const got = await getFrom(env.pod, `http://169.254.169.254/v1/${token}/user-data`);
    assert.equal(got.body, 'ok\n', 'the stand-in answered the guest');
    assert.ok(standInPaths.includes(`/v1/${token}/user-data`));
    assert.equal(keeper!.inPlace, false);
    const r = await readyz();
    assert.equal(r.status, 503);
    assert.equal(r.body.reason, 'wrong-target');
    assert.match(r.body.message ?? '', /DNAT target 192\.0\.2\.1:8091 is not this node's datasource/);
    const text = await (await fetch(`http://127.0.0.1:${health!.address.port}/readyz`)).text();
    assert.match(text, /^redirect not in place: the DNAT target 192\.0\.2\.1:8091 is not this node's datasource/);
    assert.match(await metrics.registry.metrics(), /vmseed_redirect_in_place 0/);
    const view = await agentView();
    assert.equal(view.json.state, 'elsewhere');
    assert.match(view.json.reason ?? '', /^wrong-target: /);
    assert.match(view.html, /data-redirect="elsewhere"/);
    assert.match(view.html, /redirect reaches something else/);
  });

  test('DNAT to :8081, the datasource: ready, and the status page says in place', async () => {
    await sidecar(8081);
    assert.equal(keeper!.inPlace, true);
    assert.deepEqual(await readyz(), { status: 200, body: { inPlace: true } });
    assert.match(await metrics.registry.metrics(), /vmseed_redirect_in_place 1/);
    assert.equal((await agentView()).json.state, 'in-place');
    const md = await getFrom(env.pod, `http://169.254.169.254/v1/${token}/meta-data`);
    assert.equal(md.status, 200);
  });

  test('the datasource going away behind a rule still in place: not ready (target-unreachable) until it is back', async () => {
    await stopChild(ds);
    await keeper!.tick();
    const r = await readyz();
    assert.deepEqual([r.status, r.body.reason], [503, 'target-unreachable']);
    assert.equal((await agentView()).json.state, 'missing');
    ds = await startNodeDatasource(env, key, uid);
    await keeper!.tick();
    assert.equal((await readyz()).status, 200);
  });
});
