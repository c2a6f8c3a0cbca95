// What the DaemonSet's security context can and cannot do on a node, tried
// with real processes: a kubelet pod tree with the kubelet's modes and
// owners (pods, pods/<uid>, pods/<uid>/volumes 0750 root:root; launcher
// emptyDirs 2777 root:107), a launcher's libvirt socket (0700, owned by
// 107), and a child process started under the identity read from the
// rendered variant (user, group, supplementary groups, capabilities) with
// setpriv. Needs root to build the tree and switch users, as CI runs.
import { before, after, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, rm, stat, writeFile } from 'node:fs/promises';
import { createServer, type Server } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { ROOT, type KubeObject } from '../support/manifests.ts';
import { daemonSetAgentOf, setprivOptions } from '../../e2e/support/daemonset-agent.ts';
import { kustomize } from '../support/kustomize.ts';

// The agent container's identity in a rendered variant, as setpriv options.
const identity = (objects: KubeObject[]) => setprivOptions(daemonSetAgentOf(objects));

const run = promisify(execFile);

// Shorter than a real pod UID: under a temp directory a 36-character UID
// would not leave the socket path inside sun_path (the DaemonSet's /pods does).
const POD_UID = 'pod-1';
let dir = '';
let pods = '';
const servers: Server[] = [];
let kubevirt: KubeObject[] = [];
let libvirt: KubeObject[] = [];

async function mkdirOwned(path: string, mode: number, uid: number, gid: number): Promise<void> {
  await mkdir(path);
  await chown(path, uid, gid);
  await chmod(path, mode);
}

async function listen(path: string, uid: number, gid: number, mode: number): Promise<void> {
  const server = createServer((s) => s.end('hello\n'));
  await new Promise<void>((resolve, reject) => server.once('error', reject).listen(path, resolve));
  servers.push(server);
  await chown(path, uid, gid);
  await chmod(path, mode);
}

before(async () => {
  assert.equal(process.getuid?.(), 0, 'run as root: the test builds a root-owned pod tree and switches users');
  kubevirt = await kustomize(join(ROOT, 'deploy', 'kubevirt'));
  libvirt = await kustomize(join(ROOT, 'deploy', 'libvirt'));
  dir = await mkdtemp(join(tmpdir(), 'vmseed-secctx-'));
  await chmod(dir, 0o755);
  // The kubelet's tree (setupDataDirs, makePodDataDirs) and a launcher pod's emptyDirs.
  pods = join(dir, 'pods');
  await mkdirOwned(pods, 0o750, 0, 0);
  await mkdirOwned(join(pods, POD_UID), 0o750, 0, 0);
  await mkdirOwned(join(pods, POD_UID, 'volumes'), 0o750, 0, 0);
  const emptyDirs = join(pods, POD_UID, 'volumes', 'kubernetes.io~empty-dir');
  await mkdirOwned(emptyDirs, 0o755, 0, 0);
  for (const d of ['libvirt-runtime', 'ephemeral-disks']) await mkdirOwned(join(emptyDirs, d), 0o2777, 0, 107);
  await listen(join(emptyDirs, 'libvirt-runtime', 'virtqemud-sock'), 107, 107, 0o700);
  // A host libvirtd in system mode (Debian: 0770 root:libvirt; 0700 is the stricter case).
  await mkdirOwned(join(dir, 'libvirt'), 0o755, 0, 0);
  await listen(join(dir, 'libvirt', 'libvirt-sock'), 0, 0, 0o700);
  // A state directory an earlier KubeVirt deployment handed to 107.
  await mkdirOwned(join(dir, 'seeds-107'), 0o755, 107, 107);
  await mkdirOwned(join(dir, 'seeds-root'), 0o755, 0, 0);
});

after(async () => {
  for (const s of servers) s.close();
  if (dir) await rm(dir, { recursive: true, force: true });
});

// Runs the probe script as `who`; returns one line per step: `ok` or the errno name.
const PROBE = String.raw`
import errno, os, socket, sys
def step(fn):
    try:
        fn(); print("ok")
    except OSError as e:
        print(errno.errorcode.get(e.errno, str(e.errno)))
def connect(path):
    s = socket.socket(socket.AF_UNIX); s.connect(path); s.recv(16); s.close()
def publish(d):
    os.makedirs(d, exist_ok=True)
    tmp = os.path.join(d, ".seed.tmp")
    with open(tmp, "w") as f: f.write("seed")
    os.chmod(tmp, 0o644)
    os.rename(tmp, os.path.join(d, "vmseed-nocloud-0123456789abcdef.iso"))
def write(d):
    with open(os.path.join(d, "probe"), "w") as f: f.write("x")
ACTIONS = {"connect": connect, "publish": publish, "write": write, "list": os.listdir}
for arg in sys.argv[1:]:
    kind, path = arg.split(":", 1)
    step(lambda: ACTIONS[kind](path))
`;

async function probe(who: string[], steps: string[]): Promise<string[]> {
  const { stdout } = await run('setpriv', [...who, '--', '/usr/bin/python3', '-c', PROBE, ...steps], {
    timeout: 30_000,
  });
  return stdout.trim().split('\n');
}

test('kubevirt: uid 107 with group 0 gets through the 0750 kubelet dirs, connects to the launcher socket and publishes into ephemeral-disks', async () => {
  const emptyDirs = join(pods, POD_UID, 'volumes', 'kubernetes.io~empty-dir');
  const vmseedDir = join(emptyDirs, 'ephemeral-disks', 'vmseed');
  const result = await probe(identity(kubevirt), [
    `list:${pods}`,
    `connect:${join(emptyDirs, 'libvirt-runtime', 'virtqemud-sock')}`,
    `publish:${vmseedDir}`,
    // The kubelet's own directories stay read-only to it.
    `write:${pods}`,
    `write:${join(pods, POD_UID)}`,
    `write:${join(pods, POD_UID, 'volumes')}`,
  ]);
  assert.deepEqual(result, ['ok', 'ok', 'ok', 'EACCES', 'EACCES', 'EACCES']);
  // Written as 107 into the setgid emptyDir: QEMU (107) owns and reads it.
  const image = await stat(join(vmseedDir, 'vmseed-nocloud-0123456789abcdef.iso'));
  assert.deepEqual([image.uid, image.gid], [107, 107]);
});

test('kubevirt without supplementalGroups [0]: uid 107 stops at the pods directory (why the group is there)', async () => {
  const who = identity(kubevirt).map((o) => (o.startsWith('--groups=') ? '--clear-groups' : o));
  assert.ok(who.includes('--clear-groups'));
  const socket = join(pods, POD_UID, 'volumes', 'kubernetes.io~empty-dir', 'libvirt-runtime', 'virtqemud-sock');
  assert.deepEqual(await probe(who, [`list:${pods}`, `connect:${socket}`]), ['EACCES', 'EACCES']);
});

test('libvirt: root without capabilities connects to a root-only libvirtd socket, and writes only into a root-owned state dir', async () => {
  const who = identity(libvirt);
  assert.ok(who.includes('--reuid=0') && who.includes('--clear-groups'));
  const result = await probe(who, [
    `connect:${join(dir, 'libvirt', 'libvirt-sock')}`,
    `write:${join(dir, 'seeds-root')}`,
    // Without CAP_DAC_OVERRIDE: why the variant's init container chowns the state dir to root.
    `write:${join(dir, 'seeds-107')}`,
  ]);
  assert.deepEqual(result, ['ok', 'ok', 'EACCES']);
  // The kubevirt identity cannot use the host's root socket at all.
  assert.deepEqual(await probe(identity(kubevirt), [`connect:${join(dir, 'libvirt', 'libvirt-sock')}`]), ['EACCES']);
});

test('the probe itself reports success and the errno (root with its capabilities writes into the 107-owned directory)', async () => {
  await writeFile(join(dir, 'seeds-107', 'keep'), '');
  assert.deepEqual(
    await probe(
      ['--reuid=0', '--regid=0', '--clear-groups'],
      [`write:${join(dir, 'seeds-107')}`, `list:${join(dir, 'nope')}`],
    ),
    ['ok', 'ENOENT'],
  );
});
