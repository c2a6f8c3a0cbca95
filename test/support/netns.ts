// Network namespaces a test makes for itself (and removes): a "node" and a
// "launcher pod" joined by a veth, the pod's default route through the node.
// Addresses are from TEST-NET-1 (192.0.2.0/24) and exist only inside these
// namespaces; nothing leaves them.
import { execFile, spawn, type ChildProcess } from 'node:child_process';
import assert from 'node:assert/strict';
import { createInterface } from 'node:readline';
import { randomBytes } from 'node:crypto';
import { promisify } from 'node:util';

const exec = promisify(execFile);

export async function sh(
  args: string[],
  options: { input?: string; timeoutMs?: number } = {},
): Promise<{ stdout: string; stderr: string }> {
  try {
    const p = exec(args[0], args.slice(1), { timeout: options.timeoutMs ?? 30_000, maxBuffer: 8 * 1024 * 1024 });
    if (options.input !== undefined) p.child.stdin?.end(options.input);
    return await p;
  } catch (e) {
    const err = e as Error & { stderr?: string };
    throw new Error(`${args.join(' ')} failed: ${(err.stderr ?? err.message).trim()}`, { cause: e });
  }
}

export interface PodNode {
  node: string;
  pod: string;
  nodeAddress: string; // on the node's veth
  podAddress: string;
  nodeVeth: string;
  inNode(args: string[]): string[];
  inPod(args: string[]): string[];
  remove(): Promise<void>;
}

export async function makePodNode(): Promise<PodNode> {
  const id = randomBytes(3).toString('hex');
  const node = `vmseed-${id}-node`;
  const pod = `vmseed-${id}-pod`;
  const nodeVeth = `veth${id}`;
  const made: string[] = [];
  const remove = async () => {
    for (const ns of made.reverse()) await exec('ip', ['netns', 'del', ns]).catch(() => {});
  };
  try {
    for (const ns of [node, pod]) {
      await sh(['ip', 'netns', 'add', ns]);
      made.push(ns);
      await sh(['ip', '-n', ns, 'link', 'set', 'lo', 'up']);
    }
    await sh(['ip', '-n', node, 'link', 'add', nodeVeth, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', pod]);
    await sh(['ip', '-n', node, 'addr', 'add', '192.0.2.1/24', 'dev', nodeVeth]);
    await sh(['ip', '-n', node, 'link', 'set', nodeVeth, 'up']);
    await sh(['ip', '-n', pod, 'addr', 'add', '192.0.2.2/24', 'dev', 'eth0']);
    await sh(['ip', '-n', pod, 'link', 'set', 'eth0', 'up']);
    await sh(['ip', '-n', pod, 'route', 'add', 'default', 'via', '192.0.2.1']);
  } catch (e) {
    await remove();
    throw e;
  }
  return {
    node,
    pod,
    nodeAddress: '192.0.2.1',
    podAddress: '192.0.2.2',
    nodeVeth,
    inNode: (args) => ['ip', 'netns', 'exec', node, ...args],
    inPod: (args) => ['ip', 'netns', 'exec', pod, ...args],
    remove,
  };
}

// One HTTP GET made from inside a namespace (python's urllib: no proxy, a
// short timeout). Status 0 = no answer (refused, reset, timed out).
const GET = `
import sys, urllib.request, urllib.error
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
try:
    r = opener.open(sys.argv[1], timeout=float(sys.argv[2]))
    sys.stdout.write("%d\\n" % r.status); sys.stdout.flush(); sys.stdout.buffer.write(r.read())
except urllib.error.HTTPError as e:
    sys.stdout.write("%d\\n" % e.code); sys.stdout.flush(); sys.stdout.buffer.write(e.read())
except Exception as e:
    sys.stdout.write("0\\n" + type(e).__name__)
`;

export async function getFrom(ns: string, url: string, timeoutS = 3): Promise<{ status: number; body: string }> {
  const { stdout } = await sh(['ip', 'netns', 'exec', ns, '/usr/bin/python3', '-c', GET, url, String(timeoutS)], {
    timeoutMs: (timeoutS + 10) * 1000,
  });
  const nl = stdout.indexOf('\n');
  return { status: Number(stdout.slice(0, nl)), body: stdout.slice(nl + 1) };
}

// The datasource listener (test/redirect/node-datasource.ts) in the node
// namespace, on the node's address: the agent on the host network.
const NODE = './node_modules/.bin/node';

export async function startNodeDatasource(
  env: PodNode,
  key: Buffer,
  uid: string,
  port = 8081,
  bench?: { vmis: number },
): Promise<ChildProcess> {
  const mode = bench ? ['bench', String(bench.vmis)] : [];
  const child = spawn(
    'ip',
    [
      'netns',
      'exec',
      env.node,
      NODE,
      'test/redirect/node-datasource.ts',
      env.nodeAddress,
      String(port),
      key.toString('base64'),
      uid,
      ...mode,
    ],
    {
      stdio: ['ignore', 'pipe', 'inherit'],
    },
  );
  const line = await new Promise<string>((resolve, reject) => {
    const rl = createInterface({ input: child.stdout });
    rl.once('line', resolve);
    child.once('exit', (code) => reject(new Error(`datasource child exited ${code}`)));
  });
  assert.match(line, /^ready \d+$/);
  return child;
}

export function stopChild(child: ChildProcess | undefined): Promise<void> {
  if (!child || child.exitCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    child.once('exit', () => resolve());
    child.kill('SIGTERM');
  });
}
