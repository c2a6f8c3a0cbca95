// A hostile launcher swaps its libvirt socket for a symlink to another
// launcher's socket, over and over, while the agent dials it: every
// connection the agent gets must reach the launcher's own daemon (or fail).
// The kubelet tree has a real node's modes (pods/<uid> 0750 root:root, the
// libvirt-runtime emptyDir 2777 root:107, sockets 0700 107:107); the dialler
// and the swapper run as uid 107 with group 0 and no capabilities (the
// DaemonSet's and the launcher's user) when the test runs as root.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile, spawn } from 'node:child_process';
import { chmodSync, chownSync, linkSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { createServer, type Server, type Socket } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { FrameDecoder, RemoteProc } from '../../src/libvirt/rpc/protocol.ts';
import { reply, u64 } from '../support/fake-rpc-daemon.ts';
import { swapLoopScript } from './swap-loop.ts';

const run = promisify(execFile);
const CLIENT = new URL('../support/socket-swap-client.ts', import.meta.url).pathname;
const OPENS = 2_000;
// Both loops end by themselves by then, whatever else shares the CPU: a
// starved run counts fewer opens, it never hangs the suite.
const LOOP_SECONDS = 60;
const asRoot = process.getuid?.() === 0;
// The DaemonSet's security context: uid 107, supplementary group 0, no
// capabilities (setpriv drops them with the uid change and the bounding set).
const NO_CAPS = ['--inh-caps=-all', '--bounding-set=-all'];
const AS_AGENT = ['--reuid=107', '--regid=107', '--groups=0', ...NO_CAPS];
// The launcher: uid 107, its own group only; it works in its volume (its
// cwd), as it cannot get through the kubelet's 0750 directories.
const AS_LAUNCHER = ['--reuid=107', '--regid=107', '--groups=107', ...NO_CAPS];

// A daemon that answers CONNECT_GET_LIB_VERSION with its own number.
async function identityDaemon(path: string, id: bigint): Promise<{ server: Server; sockets: Set<Socket> }> {
  const sockets = new Set<Socket>();
  const server = createServer((sock) => {
    sockets.add(sock);
    sock.on('close', () => sockets.delete(sock));
    const d = new FrameDecoder();
    sock.on('data', (c: Buffer) => {
      for (const p of d.push(c)) if (p.header.proc === RemoteProc.CONNECT_GET_LIB_VERSION) reply(sock, p, u64(id));
    });
    sock.on('error', () => {});
  });
  await new Promise<void>((r) => server.listen(path, r));
  // Never what keeps the test's process alive.
  server.unref();
  return { server, sockets };
}

// The emptyDir is named `rt` (KubeVirt's is libvirt-runtime) and the pods
// directory is the temporary directory itself, so the socket path fits the
// 107 bytes of a unix socket address, as /pods/... does on a node.
function launcherRuntime(pods: string, uid: string): string {
  const dir = join(pods, uid, 'volumes', 'kubernetes.io~empty-dir', 'rt');
  mkdirSync(dir, { recursive: true });
  if (asRoot) {
    chmodSync(join(pods, uid), 0o750);
    chmodSync(join(pods, uid, 'volumes'), 0o750);
    chownSync(dir, 0, 107);
  }
  chmodSync(dir, 0o2777);
  return dir;
}

test(
  'a launcher swapping its socket for a symlink to another launcher: every connection reaches its own daemon',
  { timeout: 180_000 },
  async (t) => {
    const pods = mkdtempSync(join(tmpdir(), 'vs'));
    chmodSync(pods, 0o750);
    const hostile = launcherRuntime(pods, '0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01');
    const other = launcherRuntime(pods, '7d1e9a52-3c4b-4f6a-8e2d-9b0c1a2f3e4d');
    const sock = join(hostile, 'virtqemud-sock');
    const otherSock = join(other, 'virtqemud-sock');
    const own = await identityDaemon(sock, 1001n);
    const foreign = await identityDaemon(otherSock, 2002n);
    for (const s of [sock, otherSock]) {
      if (asRoot) chownSync(s, 107, 107);
      chmodSync(s, 0o700);
    }
    // The launcher keeps a second name for its socket to put back.
    const real = join(hostile, '.real-sock');
    linkSync(sock, real);
    if (asRoot) chownSync(real, 107, 107);

    const swapScript = swapLoopScript(otherSock, LOOP_SECONDS);
    const swapArgv = [process.execPath, '-e', swapScript];
    const swapper = asRoot
      ? spawn('setpriv', [...AS_LAUNCHER, ...swapArgv], { stdio: 'ignore', cwd: hostile })
      : spawn(swapArgv[0], swapArgv.slice(1), { stdio: 'ignore', cwd: hostile });
    swapper.unref();
    // One hook, in this order: while the swapper runs it keeps creating
    // names in the launcher's directory, and removing the tree under it
    // fails (ENOTEMPTY).
    const swapperGone = new Promise((r) => swapper.once('exit', r));
    t.after(async () => {
      swapper.kill('SIGKILL');
      await swapperGone;
      for (const d of [own, foreign]) {
        for (const s of d.sockets) s.destroy();
        d.server.close();
      }
      rmSync(pods, { recursive: true, force: true });
    });

    const clientArgv = [process.execPath, CLIENT, sock, String(OPENS), String(LOOP_SECONDS)];
    const { stdout } = asRoot
      ? await run('setpriv', [...AS_AGENT, ...clientArgv], { timeout: 120_000 })
      : await run(clientArgv[0], clientArgv.slice(1), { timeout: 120_000 });
    const tally = JSON.parse(stdout) as Record<string, number>;
    const opens = Object.values(tally).reduce((a, b) => a + b, 0);
    t.diagnostic(`${opens} opens during the swap loop: ${JSON.stringify(tally)}`);
    assert.ok(opens >= 200, `${opens} opens in ${LOOP_SECONDS} s: too few to show the race`);
    assert.equal(tally['daemon-2002'] ?? 0, 0, "connections that reached the other launcher's daemon");
    // The swap really raced the dialler: both outcomes happened.
    assert.ok((tally['daemon-1001'] ?? 0) > 0, 'some connections reached the launcher through its real socket');
    assert.ok((tally.LIBVIRT_ACCESS_DENIED ?? 0) > 0, 'some opens found the symlink and were refused');
  },
);
