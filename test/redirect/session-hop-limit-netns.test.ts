// --session-hop-limit on the wire, in network namespaces this test makes:
// the datasource listener (sessions required) on the "node" address with
// the redirect's real ruleset (hop limit 1), a "launcher pod" namespace
// one routed hop away, and a "nested" namespace behind it (a container in
// the guest: one more routed hop, masqueraded to the launcher's address as
// KubeVirt's masquerade binding and a guest's container runtime do). The
// launcher's PUT /v1/session completes and its token opens /v1/identity;
// the nested one's PUT never gets its answer (the TTL runs out at the
// launcher's forward) while its plain GETs still work. The TTL is read on
// the wire by counters in the launcher namespace, before it forwards.
import { after, before, describe, test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn, type ChildProcess } from 'node:child_process';
import { createInterface } from 'node:readline';
import pino from 'pino';
import { execNft, RedirectKeeper } from '../../src/redirect/keeper.ts';
import { createRedirectMetrics } from '../../src/redirect/redirect-metrics.ts';
import { SESSION_TTL_CHAIN, renderRuleset, type RedirectSpec } from '../../src/redirect/nft-ruleset.ts';
import { makePodNode, sh, stopChild, type PodNode } from '../support/netns.ts';

const HOPS = 1;
const NESTED_NET = { launcher: '198.51.100.1', nested: '198.51.100.2' };

// One request from a namespace (python urllib, no proxy): status 0 when no
// answer came within the timeout.
const REQUEST = `
import sys, json, urllib.request, urllib.error
method, url, headers, timeout = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), float(sys.argv[4])
req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "PUT" else None)
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(req, timeout=timeout)
    print(json.dumps({"status": r.status, "body": r.read().decode()}))
except urllib.error.HTTPError as e:
    print(json.dumps({"status": e.code, "body": e.read().decode()}))
except Exception as e:
    print(json.dumps({"status": 0, "body": type(e).__name__}))
`;

// Raw bytes to 169.254.169.254:80, each argument one segment (TCP_NODELAY,
// a pause between): what came back within 2 s, or "" (nothing).
const RAW = `
import socket, sys, time
s = socket.create_connection(("169.254.169.254", 80), timeout=2)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
for part in sys.argv[1:]:
    s.sendall(part.encode("latin1"))
    time.sleep(0.2)
got = b""
try:
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
except socket.timeout:
    pass
sys.stdout.write(got.decode("latin1"))
`;

describe('the session hop limit through the 169.254.169.254 redirect', { timeout: 180_000 }, () => {
  let env: PodNode;
  let nested: string;
  let ds: ChildProcess | undefined;
  let keeper: RedirectKeeper;
  const spec: RedirectSpec = {
    table: 'vmseed',
    to: { host: '192.0.2.1', port: 8081 },
    podInterfaces: ['veth*'],
    metadata: { address: '169.254.169.254', port: 80 },
    sessionHopLimit: HOPS,
  };

  before(async () => {
    env = await makePodNode();
    // The nested namespace behind the launcher, masqueraded to its address.
    nested = `${env.pod.replace(/-pod$/, '')}-nested`;
    await sh(['ip', 'netns', 'add', nested]);
    await sh(['ip', '-n', nested, 'link', 'set', 'lo', 'up']);
    await sh(['ip', '-n', env.pod, 'link', 'add', 'inner', 'type', 'veth', 'peer', 'name', 'eth0', 'netns', nested]);
    await sh(['ip', '-n', env.pod, 'addr', 'add', `${NESTED_NET.launcher}/24`, 'dev', 'inner']);
    await sh(['ip', '-n', env.pod, 'link', 'set', 'inner', 'up']);
    await sh(['ip', '-n', nested, 'addr', 'add', `${NESTED_NET.nested}/24`, 'dev', 'eth0']);
    await sh(['ip', '-n', nested, 'link', 'set', 'eth0', 'up']);
    await sh(['ip', '-n', nested, 'route', 'add', 'default', 'via', NESTED_NET.launcher]);
    await sh(env.inPod(['sysctl', '-qw', 'net.ipv4.ip_forward=1']));
    // In the launcher: the NAT to its own address, and counters of the TTL
    // answers from 169.254.169.254:80 arrive with, before any forward; data
    // segments only (\`@ih,0,8 & 0 == 0\`: a byte of payload), as the
    // handshake's SYN-ACK leaves before the first request is judged.
    await sh(env.inPod(['nft', '-f', '-']), {
      input: `table ip launcher {
  chain post {
    type nat hook postrouting priority srcnat; policy accept;
    oifname "eth0" ip saddr ${NESTED_NET.nested} masquerade
  }
  chain wire {
    type filter hook prerouting priority raw; policy accept;
    iifname "eth0" ip saddr 169.254.169.254 tcp sport 80 @ih,0,8 & 0x0 == 0x0 ip ttl ${HOPS} counter comment "limited"
    iifname "eth0" ip saddr 169.254.169.254 tcp sport 80 @ih,0,8 & 0x0 == 0x0 ip ttl 64 counter comment "normal"
  }
}
`,
    });
    ds = spawn(
      'ip',
      [
        ...['netns', 'exec', env.node, './node_modules/.bin/node', 'test/redirect/session-node-datasource.ts'],
        ...[env.nodeAddress, '8081', env.podAddress],
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const line = await new Promise<string>((resolve, reject) => {
      createInterface({ input: ds!.stdout! }).once('line', resolve);
      ds!.once('exit', (code) => reject(new Error(`datasource child exited ${code}`)));
    });
    assert.match(line, /^ready \d+$/);
    keeper = new RedirectKeeper({
      spec,
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      metrics: createRedirectMetrics(),
      intervalMs: 60_000,
      launchers: async () => [env.podAddress],
    });
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
  });
  after(async () => {
    await keeper?.stop().catch(() => {});
    await stopChild(ds);
    if (nested) await sh(['ip', 'netns', 'del', nested]).catch(() => {});
    await env?.remove();
  });

  const from = async (ns: string, method: string, path: string, headers: Record<string, string> = {}, timeoutS = 3) => {
    const { stdout } = await sh(
      ['ip', 'netns', 'exec', ns, '/usr/bin/python3', '-c', REQUEST, method, `http://169.254.169.254${path}`].concat([
        JSON.stringify(headers),
        String(timeoutS),
      ]),
      { timeoutMs: (timeoutS + 10) * 1000 },
    );
    return JSON.parse(stdout) as { status: number; body: string };
  };
  // The launcher's counters of answers arriving with the limited and the normal TTL.
  const wire = async () => {
    const { stdout } = await sh(env.inPod(['nft', '-j', 'list', 'chain', 'ip', 'launcher', 'wire']));
    const doc = JSON.parse(stdout) as { nftables: Array<{ rule?: { comment?: string; expr: unknown[] } }> };
    const count = (comment: string) => {
      const rule = doc.nftables.find((i) => i.rule?.comment === comment)?.rule;
      const counter = rule?.expr.find((e) => (e as { counter?: unknown }).counter) as
        { counter: { packets: number } } | undefined;
      return counter?.counter.packets ?? NaN;
    };
    return { limited: count('limited'), normal: count('normal') };
  };
  const PUT = { 'X-Vmseed-Session-Ttl-Seconds': '60' };

  test('the launcher: its PUT completes with the hop-limited TTL on the wire; other answers keep the normal TTL', async () => {
    const before = await wire();
    const put = await from(env.pod, 'PUT', '/v1/session', PUT);
    assert.equal(put.status, 200, put.body);
    assert.match(put.body, /^[A-Za-z0-9_-]{43}$/);
    const mid = await wire();
    assert.ok(mid.limited > before.limited, `the session answer arrived with TTL ${HOPS}: ${JSON.stringify(mid)}`);
    assert.equal(mid.normal, before.normal, 'no data of the session connection kept the normal TTL');
    const id = await from(env.pod, 'GET', '/v1/identity', { Metadata: 'true', 'X-Vmseed-Session': put.body });
    assert.equal(id.status, 200, id.body);
    assert.equal(id.body, '{"namespace":"tenant","serviceAccountName":"sa-vm","vmName":"vm"}\n');
    const after = await wire();
    assert.ok(after.normal > mid.normal, 'the GET answered with the normal TTL');
    assert.equal(after.limited, mid.limited, 'and nothing of it hop-limited');
  });

  test('the nested container: its PUT gets no answer, its plain GETs do', async () => {
    const before = await wire();
    const put = await from(nested, 'PUT', '/v1/session', PUT, 2);
    assert.equal(put.status, 0, `no answer: ${JSON.stringify(put)}`);
    const mid = await wire();
    assert.ok(mid.limited > before.limited, 'the answer was sent, with the limited TTL, and died at the forward');
    const md = await from(nested, 'GET', '/v1/meta-data');
    assert.equal(md.status, 200);
    assert.match(md.body, /iid-vm/);
    // /v1/identity is reached too: without a session, required mode's 401.
    assert.equal((await from(nested, 'GET', '/v1/identity', { Metadata: 'true' })).status, 401);
  });

  test('the nested container cannot split or pipeline its way past the judgement', async () => {
    const raw = async (...segments: string[]) =>
      (await sh(['ip', 'netns', 'exec', nested, '/usr/bin/python3', '-c', RAW, ...segments], { timeoutMs: 15_000 }))
        .stdout;
    const put = 'PUT /v1/session HTTP/1.1\r\nHost: x\r\nX-Vmseed-Session-Ttl-Seconds: 60\r\n\r\n';
    // A first segment too short to tell: judged a session connection.
    assert.equal(await raw('P', put.slice(1)), '');
    assert.equal(await raw('PU', put.slice(2)), '');
    // A PUT pipelined behind a GET in one segment: the connection is plain, so
    // the listener refuses a PUT that does not open its connection.
    const pipelined = await raw(`GET /v1/meta-data HTTP/1.1\r\nHost: x\r\n\r\n${put}`);
    assert.match(pipelined, /^HTTP\/1\.1 200 /);
    assert.match(pipelined, /HTTP\/1\.1 400 [\s\S]*session_not_first/);
    assert.doesNotMatch(pipelined, /\r\n\r\n[A-Za-z0-9_-]{43}$/);
    // The same from the launcher completes: the bytes themselves are a good PUT.
    const direct = (await sh(env.inPod(['/usr/bin/python3', '-c', RAW, 'P', put.slice(1)]), { timeoutMs: 15_000 }))
      .stdout;
    assert.match(direct, /^HTTP\/1\.1 200 [\s\S]*\r\n\r\n[A-Za-z0-9_-]{43}$/);
  });

  test('the hop rules are kept: a deleted TTL chain is missing, and the next check puts it back', async () => {
    await sh(env.inNode(['nft', 'delete', 'chain', 'ip', 'vmseed', SESSION_TTL_CHAIN]));
    await keeper.tick();
    assert.equal(keeper.inPlace, true);
    const { stdout } = await sh(env.inNode(['nft', 'list', 'chain', 'ip', 'vmseed', SESSION_TTL_CHAIN]));
    assert.match(stdout, new RegExp(`ip ttl set ${HOPS}`));
    assert.equal((await from(env.pod, 'PUT', '/v1/session', PUT)).status, 200);
    assert.equal((await from(nested, 'PUT', '/v1/session', PUT, 2)).status, 0);
  });

  // The control: what stops the nested PUT is the TTL, nothing else of the topology.
  test('without --session-hop-limit the nested PUT completes', async () => {
    const { sessionHopLimit: _, ...plain } = spec;
    await sh(env.inNode(['nft', '-f', '-']), { input: renderRuleset(plain, [env.podAddress]) });
    const put = await from(nested, 'PUT', '/v1/session', PUT);
    assert.equal(put.status, 200, put.body);
  });
});
