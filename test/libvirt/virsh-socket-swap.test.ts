// The socket-swap attack against virsh mode, with the real virsh and two
// replica launchers (libvirtd in session mode as uid 107, each in its pod's
// emptyDirs, e2e/support/session-libvirtd.ts): the hostile launcher swaps
// its virtqemud-sock for a symlink to the other launcher's socket, over and
// over, while virsh runs on its URI as the DaemonSet runs it (uid 107,
// group 0, no capabilities, the kubelet's pods directory at /pods). Every
// virsh call must reach the launcher's own daemon or fail; virsh given the
// path by name would follow the symlink.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { link } from 'node:fs/promises';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  createKubeletTree,
  setprivArgs,
  QEMU_GID,
  QEMU_UID,
  type KubeletTree,
} from '../../e2e/support/kubelet-tree.ts';
import { startLauncher, type Launcher } from '../../e2e/support/session-libvirtd.ts';
import { AGENT_PODS_DIR, agentUri, agentViewArgv, ensurePodsMountPoint } from '../../e2e/support/agent-view.ts';
import { AGENT } from '../../e2e/support/replica-seed.ts';
import { swapLoopScript } from './swap-loop.ts';

const run = promisify(execFile);
const CLIENT = new URL('./virsh-swap-client.ts', import.meta.url).pathname;
const CALLS = 400;
// Both loops end by themselves by then, whatever else shares the CPU: a
// starved run counts fewer calls, it never hangs the suite.
const LOOP_SECONDS = 40;

let tree: KubeletTree;
let launchers: Launcher[] = [];

before(async () => {
  tree = await createKubeletTree(2);
  launchers = await Promise.all(tree.pods.map((p) => startLauncher(p)));
});

after(async () => {
  await Promise.allSettled(launchers.map((l) => l.stop()));
  await tree?.remove();
});

test(
  "a launcher swapping its socket for a symlink to another launcher's: every virsh call reaches its own libvirtd or fails",
  { timeout: 240_000 },
  async (t) => {
    const [hostile, other] = launchers;
    const runtime = hostile.pod.emptyDir('libvirt-runtime');
    // The launcher keeps its socket under a second name to put back.
    await link(join(runtime, 'libvirt-sock'), join(runtime, '.real-sock'));
    // The target as the agent sees the node (/pods), where virsh resolves it.
    const target = `${AGENT_PODS_DIR}/${other.pod.uid}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`;
    const swapScript = swapLoopScript(target, LOOP_SECONDS);
    // The launcher: uid 107, its own group only, in its volume.
    const [setpriv, ...asLauncher] = setprivArgs({ uid: QEMU_UID, gid: QEMU_GID, groups: [QEMU_GID] });
    const swapper = spawn(setpriv, [...asLauncher, process.execPath, '-e', swapScript], {
      stdio: 'ignore',
      cwd: runtime,
    });
    swapper.unref();
    const swapperGone = new Promise((r) => swapper.once('exit', r));
    t.after(async () => {
      swapper.kill('SIGKILL');
      await swapperGone;
    });

    await ensurePodsMountPoint();
    const argv = agentViewArgv(tree.podsDir, AGENT, [
      process.execPath,
      CLIENT,
      agentUri(hostile.pod.uid),
      String(CALLS),
      String(LOOP_SECONDS),
    ]);
    const { stdout } = await run(argv[0], argv.slice(1), { timeout: 120_000 });
    const tally = JSON.parse(stdout) as Record<string, number>;
    const calls = Object.values(tally).reduce((a, b) => a + b, 0);
    t.diagnostic(`${calls} virsh calls during the swap loop: ${JSON.stringify(tally)}`);
    assert.ok(calls >= 50, `${calls} virsh calls in ${LOOP_SECONDS} s: too few to show the race`);
    assert.equal(tally[`host-${other.hostUuid}`] ?? 0, 0, "virsh calls that reached the other launcher's libvirtd");
    assert.ok((tally[`host-${hostile.hostUuid}`] ?? 0) > 0, 'some calls reached the launcher through its real socket');
    assert.ok((tally.LIBVIRT_ACCESS_DENIED ?? 0) > 0, 'some calls found the symlink and were refused');
  },
);
