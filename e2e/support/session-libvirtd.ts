// One virt-launcher's libvirt, replicated: `libvirtd` in session mode as uid
// 107 (Debian 12 has no virtqemud; the session daemon behaves the same for
// attach/detach, sockets and permissions), in a private mount namespace where
// the pod's emptyDirs sit at the launcher's paths, so QEMU (also 107) opens
// exactly what a launcher's QEMU opens:
//   private          -> /var/run/kubevirt-private
//   public           -> /var/run/kubevirt   (sockets, container-disks, hotplug-disks inside)
//   libvirt-runtime  -> /var/run/libvirt    (XDG_RUNTIME_DIR=/var/run, the daemon's socket)
//   ephemeral-disks  -> /var/run/kubevirt-ephemeral-disks
// KubeVirt starts virtqemud with -f /var/run/libvirt/virtqemud.conf and its
// socket is /var/run/libvirt/virtqemud-sock. libvirtd names its socket
// libvirt-sock, so the replica hard-links virtqemud-sock to it: same inode,
// owner and mode (srwx------ 107), and a real socket, not a symlink.
import { spawn, type ChildProcess } from 'node:child_process';
import { existsSync, openSync, closeSync, readFileSync, readdirSync } from 'node:fs';
import { chmod, chown, link, mkdir, rm, writeFile } from 'node:fs/promises';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { QEMU_GID, QEMU_UID, setprivArgs, type LauncherPodDir } from './kubelet-tree.ts';

export const LAUNCHER_SOCKET = '/var/run/libvirt/virtqemud-sock';
export const LAUNCHER_URI = `qemu+unix:///session?socket=${LAUNCHER_SOCKET}`;

// Launcher path prefix -> emptyDir, longest first.
const MOUNTS: Array<
  [
    string,
    'private' | 'public' | 'sockets' | 'container-disks' | 'hotplug-disks' | 'libvirt-runtime' | 'ephemeral-disks',
  ]
> = [
  ['/var/run/kubevirt/hotplug-disks', 'hotplug-disks'],
  ['/var/run/kubevirt/container-disks', 'container-disks'],
  ['/var/run/kubevirt/sockets', 'sockets'],
  ['/var/run/kubevirt-ephemeral-disks', 'ephemeral-disks'],
  ['/var/run/kubevirt-private', 'private'],
  ['/var/run/kubevirt', 'public'],
  ['/var/run/libvirt', 'libvirt-runtime'],
];

// Runs as root in the new namespace, then becomes 107 for good. /run gets a
// fresh tmpfs: the launcher has its own /var/run, and the host's libvirt
// sockets must not be visible in it.
const NAMESPACE_SCRIPT = `set -eu
mount -t tmpfs -o mode=0755 tmpfs /run
mkdir -p /run/kubevirt-private /run/kubevirt /run/libvirt /run/kubevirt-ephemeral-disks
mount --bind "$PRIVATE" /run/kubevirt-private
mount --bind "$PUBLIC" /run/kubevirt
mkdir -p /run/kubevirt/sockets /run/kubevirt/container-disks /run/kubevirt/hotplug-disks
mount --bind "$SOCKETS" /run/kubevirt/sockets
mount --bind "$CONTAINER_DISKS" /run/kubevirt/container-disks
mount --bind "$HOTPLUG_DISKS" /run/kubevirt/hotplug-disks
mount --bind "$LIBVIRT_RUNTIME" /run/libvirt
mount --bind "$EPHEMERAL_DISKS" /run/kubevirt-ephemeral-disks
exec "$@"
`;

// As virt-launcher sets them: the daemon's config (and QEMU's monitor
// sockets, whose paths must stay under 108 bytes) under the private emptyDir.
const LAUNCHER_HOME = '/var/run/kubevirt-private/home';

function launcherEnv(): string[] {
  return [
    'PATH=/usr/sbin:/usr/bin:/sbin:/bin',
    `HOME=${LAUNCHER_HOME}`,
    'XDG_RUNTIME_DIR=/var/run',
    'XDG_CONFIG_HOME=/var/run/kubevirt-private',
    'XDG_CACHE_HOME=/var/run/kubevirt-private/cache',
    'LIBVIRT_AUTOSTART=0',
  ];
}

export interface VirshError extends Error {
  stderr: string;
  code: number | null;
}

export interface Launcher {
  pod: LauncherPodDir;
  /** libvirtd's pid: its mount namespace is the launcher's. */
  pid: number;
  hostUuid: string;
  /** The socket as the agent reaches it: <podsDir>/<uid>/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock */
  socketOnHost: string;
  /** A launcher path (/var/run/...) on the host. */
  hostPath(launcherPath: string): string;
  /** virsh inside the launcher, as 107, on /var/run/libvirt/virtqemud-sock; `stdin` is what an argument `/dev/stdin` reads. Rejects with stderr. */
  virsh(args: string[], stdin?: string): Promise<string>;
  /** Any command inside the launcher's namespace as 107. */
  exec(cmd: string[], stdin?: string): Promise<{ code: number | null; stdout: string; stderr: string }>;
  /** checkIfDiskReadyToUse as the launcher runs it: exists and opens O_RDWR for 107 (a block device: O_RDONLY). */
  diskReady(launcherPath: string): Promise<boolean>;
  log(): string;
  stop(): Promise<void>;
}

function spawnCollect(
  cmd: string[],
  stdin: string | undefined,
  timeoutMs: number,
): Promise<{ code: number | null; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd[0], cmd.slice(1), { stdio: ['pipe', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => {
      child.kill('SIGKILL');
      reject(new Error(`${cmd.join(' ')}: no answer in ${timeoutMs} ms`));
    }, timeoutMs);
    child.on('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.on('close', (code) => {
      clearTimeout(timer);
      resolve({ code, stdout, stderr });
    });
    // A command that exits without reading its stdin (most virsh calls)
    // closes the pipe first: EPIPE then says nothing the exit code does not.
    child.stdin.on('error', (e: NodeJS.ErrnoException) => {
      if (e.code !== 'EPIPE') reject(e);
    });
    child.stdin.end(stdin);
  });
}

function alive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch {
    return false;
  }
}

async function killAndWait(pid: number, timeoutMs: number): Promise<void> {
  if (!alive(pid)) return;
  try {
    process.kill(pid, 'SIGTERM');
  } catch {
    return;
  }
  const deadline = Date.now() + timeoutMs;
  while (alive(pid) && Date.now() < deadline) await sleep(50);
  if (alive(pid)) {
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      /* gone */
    }
  }
}

// A daemonized process (virtlogd, QEMU) reparented to PID 1 stays a zombie
// in this container; "gone" means not running any more.
function running(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return !/^\d+ \(.*\) Z/.test(stat);
  } catch {
    return false;
  }
}

function pidFromFile(path: string): number | undefined {
  try {
    const n = Number(readFileSync(path, 'utf8').trim());
    return Number.isInteger(n) && n > 1 ? n : undefined;
  } catch {
    return undefined;
  }
}

export async function startLauncher(pod: LauncherPodDir, options: { startTimeoutMs?: number } = {}): Promise<Launcher> {
  const runtime = pod.emptyDir('libvirt-runtime');
  const hostUuid = randomUUID();
  // The launcher's virtqemud.conf, as KubeVirt writes it for a non-root
  // launcher; host_uuid differs per launcher so that libvirt lets the two
  // daemons on this one host migrate to each other.
  await writeFile(
    join(runtime, 'virtqemud.conf'),
    [
      'unix_sock_dir = "/var/run/libvirt"',
      'unix_sock_rw_perms = "0700"',
      'auth_unix_rw = "none"',
      `host_uuid = "${hostUuid}"`,
      'log_outputs = "2:stderr"',
      '',
    ].join('\n'),
    { mode: 0o644 },
  );
  const home = join(pod.emptyDir('private'), 'home');
  await mkdir(home);
  await chown(home, QEMU_UID, QEMU_GID);
  await chmod(home, 0o700);

  const logPath = join(pod.emptyDir('private'), 'vmseed-test-libvirtd.log');
  const logFd = openSync(logPath, 'a');
  const env: NodeJS.ProcessEnv = {
    PATH: '/usr/sbin:/usr/bin:/sbin:/bin',
    PRIVATE: pod.emptyDir('private'),
    PUBLIC: pod.emptyDir('public'),
    SOCKETS: pod.emptyDir('sockets'),
    CONTAINER_DISKS: pod.emptyDir('container-disks'),
    HOTPLUG_DISKS: pod.emptyDir('hotplug-disks'),
    LIBVIRT_RUNTIME: runtime,
    EPHEMERAL_DISKS: pod.emptyDir('ephemeral-disks'),
  };
  // unshare execs the shell (no --fork): the child's pid ends up being
  // libvirtd's, and this process reaps it.
  const child: ChildProcess = spawn(
    'unshare',
    [
      '-m',
      '--propagation',
      'private',
      'sh',
      '-c',
      NAMESPACE_SCRIPT,
      'sh',
      // The daemon dies with the test process even when no after hook runs.
      ...setprivArgs({ uid: QEMU_UID, gid: QEMU_GID, groups: [] }),
      '--pdeathsig',
      'KILL',
      'env',
      '-i',
      ...launcherEnv(),
      '/usr/sbin/libvirtd',
      '-f',
      '/var/run/libvirt/virtqemud.conf',
    ],
    { env, stdio: ['ignore', logFd, logFd] },
  );
  closeSync(logFd);
  const pid = child.pid!;
  const exited = new Promise<void>((r) => child.once('exit', () => r()));
  const log = () => (existsSync(logPath) ? readFileSync(logPath, 'utf8') : '');

  const hostPath = (p: string): string => {
    for (const [prefix, dir] of MOUNTS) {
      if (p === prefix || p.startsWith(`${prefix}/`)) return pod.emptyDir(dir) + p.slice(prefix.length);
    }
    throw new Error(`${p} is not under a launcher emptyDir`);
  };

  const exec = (cmd: string[], stdin?: string) =>
    spawnCollect(
      [
        'nsenter',
        '-t',
        String(pid),
        '-m',
        ...setprivArgs({ uid: QEMU_UID, gid: QEMU_GID, groups: [] }),
        'env',
        '-i',
        ...launcherEnv(),
        ...cmd,
      ],
      stdin,
      60_000,
    );

  // Node's stdin pipe is a socketpair, which virsh cannot open as
  // /dev/stdin (ENXIO): XML goes through a file in the private emptyDir.
  let xmlCounter = 0;
  const virsh = async (args: string[], stdin?: string): Promise<string> => {
    let file: string | undefined;
    if (stdin !== undefined && args.includes('/dev/stdin')) {
      file = `/var/run/kubevirt-private/vmseed-test-${process.pid}-${++xmlCounter}.xml`;
      await writeFile(hostPath(file), stdin, { mode: 0o644 });
      args = args.map((a) => (a === '/dev/stdin' ? file! : a));
    }
    const r = await exec(['virsh', '-q', '-c', LAUNCHER_URI, ...args], stdin).finally(() =>
      file ? rm(hostPath(file), { force: true }) : undefined,
    );
    if (r.code !== 0) {
      const err = new Error(
        `virsh ${args.join(' ')} (launcher ${pod.uid}): ${r.stderr.trim() || `exit ${r.code}`}`,
      ) as VirshError;
      err.stderr = r.stderr;
      err.code = r.code;
      throw err;
    }
    return r.stdout;
  };

  const stop = async (): Promise<void> => {
    if (alive(pid) && child.exitCode === null) {
      try {
        const names = (await virsh(['list', '--name']))
          .split('\n')
          .map((s) => s.trim())
          .filter(Boolean);
        for (const n of names) await virsh(['destroy', n]).catch(() => {});
      } catch {
        /* daemon already unhappy: the pids below still go */
      }
    }
    // QEMU pid files of a session daemon: $XDG_RUNTIME_DIR/libvirt/qemu/run.
    const qemuRun = join(runtime, 'qemu', 'run');
    const qemuPids = existsSync(qemuRun)
      ? readdirSync(qemuRun)
          .filter((f) => f.endsWith('.pid'))
          .map((f) => pidFromFile(join(qemuRun, f)))
      : [];
    const virtlogd = pidFromFile(join(runtime, 'virtlogd.pid'));
    if (child.exitCode === null) {
      child.kill('SIGTERM');
      const t = setTimeout(() => child.kill('SIGKILL'), 10_000);
      await exited;
      clearTimeout(t);
    }
    for (const p of [...qemuPids, virtlogd]) {
      if (p !== undefined && running(p)) await killAndWait(p, 10_000);
    }
  };

  // Ready: the socket exists and a virsh call answers (the first call waits
  // for QEMU's capabilities probe, a few seconds under TCG).
  const deadline = Date.now() + (options.startTimeoutMs ?? 60_000);
  const sock = join(runtime, 'libvirt-sock');
  const socketOnHost = join(runtime, 'virtqemud-sock');
  try {
    while (!existsSync(sock)) {
      if (child.exitCode !== null || Date.now() > deadline)
        throw new Error(`session libvirtd of pod ${pod.uid} did not create its socket; log:\n${log().slice(-3000)}`);
      await sleep(50);
    }
    await link(sock, socketOnHost);
    for (;;) {
      const r = await exec(['virsh', '-q', '-c', LAUNCHER_URI, 'uri']);
      if (r.code === 0) break;
      if (child.exitCode !== null || Date.now() > deadline)
        throw new Error(`session libvirtd of pod ${pod.uid} does not answer: ${r.stderr}\nlog:\n${log().slice(-3000)}`);
      await sleep(100);
    }
  } catch (e) {
    await stop();
    throw e;
  }

  return {
    pod,
    pid,
    hostUuid,
    socketOnHost,
    hostPath,
    virsh,
    exec,
    diskReady: async (launcherPath) => {
      const r = await exec([
        'sh',
        '-c',
        'if [ -b "$1" ]; then exec 3<"$1"; elif [ -f "$1" ]; then exec 3<>"$1"; else exit 1; fi',
        'sh',
        launcherPath,
      ]);
      return r.code === 0;
    },
    log,
    stop,
  };
}
