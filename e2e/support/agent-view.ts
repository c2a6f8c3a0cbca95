// What the vmseed DaemonSet's container sees of the node: the kubelet's pods
// directory mounted at /pods (hostPath /var/lib/kubelet/pods), the process
// running as a given uid/gid/groups with no capabilities. A private mount
// namespace per command, so the host's /pods stays an empty mount point.
//
// The short /pods matters: the launcher socket
// /pods/<uid>/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock
// is 105 bytes, within sun_path's 107; under the test's temp directory it
// would not fit.
import { mkdir } from 'node:fs/promises';
import { EMPTY_DIR, runCommand, setprivArgs, type RunResult } from './kubelet-tree.ts';

export const AGENT_PODS_DIR = '/pods';

export interface AgentUser {
  uid: number;
  gid: number;
  groups: number[];
}

export function agentSocketPath(podUid: string): string {
  return `${AGENT_PODS_DIR}/${podUid}/${EMPTY_DIR}/libvirt-runtime/virtqemud-sock`;
}

export function agentUri(podUid: string): string {
  return `qemu+unix:///session?socket=${agentSocketPath(podUid)}`;
}

export async function ensurePodsMountPoint(): Promise<void> {
  await mkdir(AGENT_PODS_DIR, { recursive: true, mode: 0o755 });
}

/** argv that runs `cmd` with podsDir at /pods, as `user`, capabilities dropped. */
export function agentViewArgv(podsDir: string, user: AgentUser, cmd: string[]): string[] {
  return [
    'unshare',
    '-m',
    '--propagation',
    'private',
    'sh',
    '-c',
    'set -e; mount --bind "$0" /pods; exec "$@"',
    podsDir,
    ...setprivArgs(user),
    'env',
    '-i',
    'PATH=/usr/sbin:/usr/bin:/sbin:/bin',
    'HOME=/nonexistent',
    'LIBVIRT_AUTOSTART=0',
    ...cmd,
  ];
}

export async function inAgentView(podsDir: string, user: AgentUser, cmd: string[]): Promise<RunResult> {
  await ensurePodsMountPoint();
  return runCommand(agentViewArgv(podsDir, user, cmd));
}
