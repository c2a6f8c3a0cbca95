// A kubelet pod tree with the kubelet's modes and owners, for launcher pods
// of KubeVirt's non-root virt-launcher (fsGroup 107):
//   <root>                       stands for /var/lib/kubelet  0750 root:root (setupDataDirs)
//   <root>/pods                  0750 root:root
//   pods/<uid>, pods/<uid>/volumes  0750 root:root (makePodDataDirs)
//   volumes/kubernetes.io~empty-dir  0755 (0777 minus the kubelet's umask)
//   each emptyDir                2777 root:107 (fsGroup: setgid, group 107)
// The root itself is 0750 root:root like /var/lib/kubelet, so only root or a
// process in group 0 gets in: exactly why the agent needs supplementalGroups [0].
import { execFile } from 'node:child_process';
import { chmod, chown, mkdir, mkdtemp, rm, stat } from 'node:fs/promises';
import { randomUUID } from 'node:crypto';
import { join } from 'node:path';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const QEMU_UID = 107;
export const QEMU_GID = 107;
export const EMPTY_DIR = 'volumes/kubernetes.io~empty-dir';
// rendervolumes.go Volumes(): every launcher's emptyDirs, plus hotplug-disks
// (absent only with spec.domain.devices.disableHotplug).
export const LAUNCHER_EMPTY_DIRS = [
  'private',
  'public',
  'sockets',
  'virt-bin-share-dir',
  'libvirt-runtime',
  'ephemeral-disks',
  'container-disks',
  'hotplug-disks',
] as const;
export type LauncherEmptyDir = (typeof LAUNCHER_EMPTY_DIRS)[number];

export interface LauncherPodDir {
  uid: string;
  /** <root>/pods/<uid> */
  dir: string;
  emptyDir(name: LauncherEmptyDir): string;
}

export interface KubeletTree {
  /** Stands for /var/lib/kubelet. */
  root: string;
  /** Stands for /var/lib/kubelet/pods (the DaemonSet mounts it at /pods). */
  podsDir: string;
  pods: LauncherPodDir[];
  remove(): Promise<void>;
}

async function mkdirMode(path: string, mode: number, uid: number, gid: number): Promise<void> {
  await mkdir(path);
  await chown(path, uid, gid);
  // chmod after mkdir: the process umask must not decide the mode.
  await chmod(path, mode);
}

/**
 * The replica needs a passwd entry for 107, as the launcher image (qemu) and
 * the vmseed image (vmseed) have: libvirt's client and session daemon look
 * the uid up ("Failed to find user record for uid '107'").
 */
export async function ensureQemuUser(): Promise<void> {
  try {
    await run('getent', ['passwd', String(QEMU_UID)]);
    return;
  } catch {
    /* absent */
  }
  try {
    await run('useradd', [
      '--system',
      '--uid',
      String(QEMU_UID),
      '--gid',
      String(QEMU_GID),
      '--home-dir',
      '/nonexistent',
      '--no-create-home',
      '--shell',
      '/usr/sbin/nologin',
      'qemu',
    ]);
  } catch (e) {
    // Another test file may have added it meanwhile.
    await run('getent', ['passwd', String(QEMU_UID)]).catch(() => {
      throw e;
    });
  }
}

export async function createKubeletTree(podCount = 2): Promise<KubeletTree> {
  await ensureQemuUser();
  const root = await mkdtemp('/tmp/vmseed-kubelet-');
  const remove = () => rm(root, { recursive: true, force: true });
  try {
    await chown(root, 0, 0);
    await chmod(root, 0o750);
    const podsDir = join(root, 'pods');
    await mkdirMode(podsDir, 0o750, 0, 0);
    const pods: LauncherPodDir[] = [];
    for (let i = 0; i < podCount; i++) {
      const uid = randomUUID();
      const dir = join(podsDir, uid);
      await mkdirMode(dir, 0o750, 0, 0);
      await mkdirMode(join(dir, 'volumes'), 0o750, 0, 0);
      await mkdirMode(join(dir, EMPTY_DIR), 0o755, 0, 0);
      for (const name of LAUNCHER_EMPTY_DIRS) await mkdirMode(join(dir, EMPTY_DIR, name), 0o2777, 0, QEMU_GID);
      pods.push({ uid, dir, emptyDir: (name) => join(dir, EMPTY_DIR, name) });
    }
    return { root, podsDir, pods, remove };
  } catch (e) {
    await remove();
    throw e;
  }
}

export interface ModeOwner {
  mode: string;
  uid: number;
  gid: number;
}

export async function modeOwner(path: string): Promise<ModeOwner> {
  const s = await stat(path);
  return { mode: (s.mode & 0o7777).toString(8).padStart(4, '0'), uid: s.uid, gid: s.gid };
}

export interface RunResult {
  code: number;
  stdout: string;
  stderr: string;
}

/**
 * Runs a command as uid/gid 107 with exactly the given supplementary groups
 * and no capabilities (inheritable, bounding, and no privilege gain).
 */
export function setprivArgs(user: { uid: number; gid: number; groups: number[] }): string[] {
  return [
    'setpriv',
    '--reuid',
    String(user.uid),
    '--regid',
    String(user.gid),
    ...(user.groups.length > 0 ? ['--groups', user.groups.join(',')] : ['--clear-groups']),
    '--inh-caps',
    '-all',
    '--bounding-set',
    '-all',
    '--no-new-privs',
  ];
}

export async function runCommand(
  cmd: string[],
  options: { timeoutMs?: number; env?: NodeJS.ProcessEnv } = {},
): Promise<RunResult> {
  try {
    const { stdout, stderr } = await run(cmd[0], cmd.slice(1), {
      timeout: options.timeoutMs ?? 60_000,
      encoding: 'utf8',
      ...(options.env ? { env: options.env } : {}),
    });
    return { code: 0, stdout, stderr };
  } catch (e) {
    const err = e as { code?: unknown; stdout?: string; stderr?: string; killed?: boolean };
    if (err.killed) throw new Error(`${cmd.join(' ')}: killed after ${options.timeoutMs ?? 60_000} ms`, { cause: e });
    return {
      code: typeof err.code === 'number' ? err.code : -1,
      stdout: err.stdout ?? '',
      stderr: err.stderr ?? String(e),
    };
  }
}
