// Seeds on the replica node made by hand, for the harness tests of the
// replica itself (e2e/kubevirt-node.test.ts): an ISO from genisoimage labelled
// cidata, published as uid 107 with group 0 through /pods (a temporary name,
// then a rename), attached with virsh through the launcher's socket under
// /pods. They check the replica and KubeVirt's reactions independently of
// vmseed's code; tests of vmseed's KubeVirt mode use agent-seed.ts.
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { EMPTY_DIR, type KubeletTree } from './kubelet-tree.ts';
import { agentUri, inAgentView, AGENT_PODS_DIR, type AgentUser } from './agent-view.ts';
import type { Launcher } from './session-libvirtd.ts';
import type { KubevirtVm } from './kubevirt-domain.ts';

const run = promisify(execFile);

// The DaemonSet's user: runAsUser 107, runAsGroup 107, supplementalGroups [0].
export const AGENT: AgentUser = { uid: 107, gid: 107, groups: [0] };
export const AGENT_WITHOUT_GROUP_0: AgentUser = { uid: 107, gid: 107, groups: [] };

export interface SeedIso {
  path: string;
  basename: string;
  cleanup(): Promise<void>;
}

/** A NoCloud ISO (label cidata) named as vmseed names its images. */
export async function seedIso(userData: string): Promise<SeedIso> {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-kv-seed-'));
  await writeFile(join(dir, 'user-data'), userData);
  await writeFile(join(dir, 'meta-data'), '{"instance-id": "replica"}\n');
  const path = join(dir, 'seed.iso');
  await run('genisoimage', [
    '-quiet',
    '-V',
    'cidata',
    '-J',
    '-r',
    '-o',
    path,
    join(dir, 'user-data'),
    join(dir, 'meta-data'),
  ]);
  await chmod(dir, 0o755);
  await chmod(path, 0o644);
  const sha16 = createHash('sha256').update(readFileSync(path)).digest('hex').slice(0, 16);
  return { path, basename: `vmseed-nocloud-${sha16}.iso`, cleanup: () => rm(dir, { recursive: true, force: true }) };
}

/** Publishes `src` as the agent does into `<emptyDir>/<subdir>/<basename>` of a launcher pod; returns the path under /pods. */
export async function publishAsAgent(
  tree: KubeletTree,
  pod: string,
  emptyDir: 'ephemeral-disks' | 'hotplug-disks',
  subdir: string,
  src: string,
  basename: string,
): Promise<string> {
  const dir = `${AGENT_PODS_DIR}/${pod}/${EMPTY_DIR}/${emptyDir}${subdir ? `/${subdir}` : ''}`;
  const r = await inAgentView(tree.podsDir, AGENT, [
    'sh',
    '-c',
    'mkdir -p "$1" && cp "$2" "$1/.$3.tmp" && chmod 0444 "$1/.$3.tmp" && mv "$1/.$3.tmp" "$1/$3"',
    'sh',
    dir,
    src,
    basename,
  ]);
  assert.equal(r.code, 0, r.stderr);
  return `${dir}/${basename}`;
}

/** virsh as the agent: 107 + group 0, the launcher's socket under /pods. */
export async function agentVirsh(tree: KubeletTree, pod: string, args: string[]): Promise<string> {
  const r = await inAgentView(tree.podsDir, AGENT, ['virsh', '-q', '-c', agentUri(pod), ...args]);
  if (r.code !== 0) throw new Error(`virsh ${args.join(' ')}: ${r.stderr}`);
  return r.stdout;
}

/** A disk XML file the agent-side virsh can read: in the tree root (0750 root:root, readable with group 0). */
export async function xmlFile(tree: KubeletTree, name: string, xml: string): Promise<string> {
  const p = join(tree.root, `${name}-${randomUUID()}.xml`);
  await writeFile(p, xml, { mode: 0o644 });
  return p;
}

/** A hand-written copy of the disk vmseed's KubeVirt mode attaches: ephemeral-disks, SCSI sdzz at drive target 7, alias ua-vmseed_seed. */
export function kubevirtSeedDisk(basename: string): string {
  return `<disk type='file' device='disk'>
  <driver name='qemu' type='raw'/>
  <source file='/var/run/kubevirt-ephemeral-disks/vmseed/${basename}'/>
  <target dev='sdzz' bus='scsi'/>
  <readonly/>
  <alias name='ua-vmseed_seed'/>
  <address type='drive' controller='0' bus='0' target='7' unit='0'/>
</disk>
`;
}

/** vmseed's seed as shipped before KubeVirt mode: hotplug-disks, virtio, the first free target, alias ua-vmseed. */
export function oldSeedDisk(basename: string, target: string): string {
  return `<disk type='file' device='disk'>
  <driver name='qemu' type='raw'/>
  <source file='/var/run/kubevirt/hotplug-disks/${basename}'/>
  <target dev='${target}' bus='virtio'/>
  <readonly/>
  <serial>cidata</serial>
  <alias name='ua-vmseed'/>
</disk>
`;
}

/** The guest's serial console so far. */
export function consoleOf(l: Launcher, vm: KubevirtVm): string {
  const p = l.hostPath(vm.consoleLog);
  return existsSync(p) ? readFileSync(p, 'utf8') : '';
}
