// bench:inject's KubeVirt rows: the injector as shipped, on the libvirt it
// meets in production. KubeVirt's virt-launcher runs a session-mode daemon
// as the non-root qemu user (107) in its own pod, not the host's system
// daemon the other rows use; e2e/support/session-libvirtd.ts replicates it
// (its virtqemud.conf, uid, mount namespace and socket modes) on a kubelet
// pod tree with the kubelet's modes and owners. The injector runs in the
// DaemonSet container's view of the node (bench/inject-kubevirt-child.ts:
// /pods, the manifest's user, groups and dropped capabilities) and is
// configured from manifests/daemonset.yaml's own arguments.
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { chmod, chown, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildSeedImage } from '../src/disk/seed-image.ts';
import { createKubeletTree } from '../e2e/support/kubelet-tree.ts';
import { startLauncher } from '../e2e/support/session-libvirtd.ts';
import { startKubevirtVm } from '../e2e/support/kubevirt-domain.ts';
import { agentViewArgv, ensurePodsMountPoint } from '../e2e/support/agent-view.ts';
import { readDaemonSetAgent } from '../e2e/support/daemonset-agent.ts';

// `ref`: the no-op `virsh version` timed in the same loop as the row, one
// per cycle; the row's ratio and target are taken against it (the machine's
// speed drifts over the minutes a run takes). Without it, the run's first
// reference row.
export interface Row {
  op: string;
  samples: number[];
  ref?: number[];
}

interface ChildResult {
  uri: string;
  domain: string;
  published: string;
  inject: number[];
  injectStaged: number[];
  eject: number[];
  view: number[];
  attach: number[];
  virshVersion: number[];
}

const CHILD = fileURLToPath(new URL('./inject-kubevirt-child.ts', import.meta.url));

function runChild(argv: string[]): Promise<ChildResult> {
  return new Promise((resolve, reject) => {
    const child = spawn(argv[0], argv.slice(1), {
      stdio: ['ignore', 'pipe', 'pipe'],
      cwd: fileURLToPath(new URL('..', import.meta.url)),
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (d) => (out += d));
    child.stderr.on('data', (d) => (err += d));
    child.on('error', reject);
    child.on('close', (code) => {
      if (code !== 0) return reject(new Error(`inject-kubevirt-child exited ${code}: ${err.slice(-3000)}`));
      try {
        resolve(JSON.parse(out.trim().split('\n').pop() ?? '') as ChildResult);
      } catch {
        reject(new Error(`inject-kubevirt-child printed no result: ${out.slice(-1000)} ${err.slice(-2000)}`));
      }
    });
  });
}

export async function benchKubevirtLauncher(cycles: number): Promise<Row[]> {
  const ds = readDaemonSetAgent();
  const tree = await createKubeletTree(1);
  const work = await mkdtemp(join(tmpdir(), 'vmseed-bench-kubevirt-'));
  try {
    const launcher = await startLauncher(tree.pods[0]);
    try {
      // The domain KubeVirt's converter builds for a small VMI (q35, its
      // controllers and disks), started paused as the seed gate meets it
      // (startStrategy: Paused); it stays paused: a SCSI disk comes and
      // goes without the guest.
      await startKubevirtVm(launcher, {
        namespace: 'bench',
        name: 'launcher',
        uuid: randomUUID(),
        cmdline: 'console=ttyS0',
      });
      // A real seed image (68 KiB, the store's minimum), in a state
      // directory owned by the agent's user as the init container leaves it.
      const image = buildSeedImage(
        {
          datasource: 'nocloud',
          metaData: { 'instance-id': 'iid-bench', 'local-hostname': 'bench' },
          userData: new TextEncoder().encode('#cloud-config\n{}\n'),
          warnings: [],
        },
        new Date(0),
      );
      const stateDir = join(work, 'seeds');
      await chmod(work, 0o755);
      await mkdir(stateDir, { mode: 0o755 });
      await chown(stateDir, ds.runAsUser, ds.runAsGroup);
      const imagePath = join(stateDir, `nocloud-${image.sha256.slice(0, 16)}.iso`);
      await writeFile(imagePath, image.bytes, { mode: 0o640 });
      await chown(imagePath, ds.runAsUser, ds.runAsGroup);

      await ensurePodsMountPoint();
      const user = { uid: ds.runAsUser, gid: ds.runAsGroup, groups: ds.supplementalGroups };
      const r = await runChild(
        agentViewArgv(tree.podsDir, user, [process.execPath, CHILD, tree.pods[0].uid, imagePath, String(cycles)]),
      );
      // Session libvirtd as 107 in the launcher; the manifest's args; the DaemonSet's user.
      const tag = 'kubevirt launcher, as shipped';
      return [
        {
          op: `${tag}: virsh version on the launcher's socket, in the same loop (the reference of the rows below)`,
          samples: r.virshVersion,
        },
        {
          op: `${tag}: rpc: injector.inject, a new seed (copy into the pod+domainView+attach sdzz)`,
          samples: r.inject,
          ref: r.virshVersion,
        },
        {
          op: `${tag}: rpc: injector.inject at the domain's start (copy left by the pass before it existed; domainView+attach)`,
          samples: r.injectStaged,
          ref: r.virshVersion,
        },
        {
          op: `${tag}: rpc: injector.eject (domainView+detach+event+unpublish)`,
          samples: r.eject,
          ref: r.virshVersion,
        },
        { op: `${tag}: rpc: domainView alone`, samples: r.view, ref: r.virshVersion },
        { op: `${tag}: rpc: attach-device alone (libvirt + QEMU)`, samples: r.attach, ref: r.virshVersion },
      ];
    } finally {
      await launcher.stop();
    }
  } finally {
    await rm(work, { recursive: true, force: true });
    await tree.remove();
  }
}
