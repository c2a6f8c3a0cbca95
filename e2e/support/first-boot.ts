// A VMI's first boot on the replica node without the seed gate, with the
// agent as shipped (DaemonSet security context, manifest args, in-cluster
// config to the fake API server): the VMI first seen without activePods,
// then, in the order a run asks and with its delays, the launcher pod named
// in the VMI's status, the launcher's libvirt socket appearing, and the
// domain defined; the domain is started last, not paused. The busybox guest
// looks for its seed once at boot. Used by e2e/kubevirt-first-boot.test.ts
// and bench/first-boot.ts.
import { randomBytes, randomUUID } from 'node:crypto';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createKubeletTree, runCommand, QEMU_GID, QEMU_UID, type KubeletTree } from './kubelet-tree.ts';
import { startLauncher, type Launcher } from './session-libvirtd.ts';
import { defineKubevirtVm, type KubevirtVm } from './kubevirt-domain.ts';
import { consoleOf } from './replica-seed.ts';
import {
  listenerUrls,
  LOOPBACK_LISTENERS,
  startDaemonSetAgent,
  waitHealthy,
  type DaemonSetAgentProcess,
} from './daemonset-agent.ts';
import { busyboxCmdline } from './guest/busybox.ts';
import { parseConsole } from './guest/console.ts';
import { cloudInitFinished, ensureDebianGuest } from './guest/debian.ts';
import type { GuestKind } from './kubevirt-domain.ts';
import { waitUntil } from './agent-process.ts';
import { FakeKube } from '../../test/support/fake-kube.ts';
import { serviceAccountVolume } from '../../test/support/in-cluster.ts';
import { startClusterObjects } from '../../test/support/cluster-objects.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { RpcLibvirtClient } from '../../src/libvirt/rpc/rpc-client.ts';
import { kubevirtSeedDisk } from './replica-seed.ts';
import type { VmiStatusRecord } from '../../src/status/snapshot.ts';

export const NODE = 'replica-node';
export const NS = 'first-boot';

export type Step = 'pod' | 'socket' | 'define';

export interface FirstBootNode {
  tree: KubeletTree;
  fake: FakeKube;
  agent: DaemonSetAgentProcess;
  statusUrl: string;
  detail(): Promise<string>;
  stop(): Promise<void>;
}

export interface FirstBootRun {
  name: string;
  // Epoch ms on this host: `virsh start` issued and returned.
  startIssuedAt: number;
  startReturnedAt: number;
  // The agent's record of it (status.json).
  firstBoot: NonNullable<VmiStatusRecord['firstBoot']>;
  // The guest's one look at boot found the seed's files.
  guestFound: boolean;
  console: string;
}

// One kubelet pod tree with `pods` launcher pod directories (no launcher
// running yet), the fake API server and the agent.
export async function startFirstBootNode(pods: number): Promise<FirstBootNode> {
  const tree = await createKubeletTree(pods);
  const fake = await FakeKube.start();
  const work = await mkdtemp(join(tmpdir(), 'vmseed-first-boot-'));
  let closeObjects = async () => {};
  const cleanup = async () => {
    await closeObjects();
    await fake.close();
    await rm(work, { recursive: true, force: true });
    await tree.remove();
  };
  try {
    const stateDir = join(work, 'seeds');
    await runCommand(['install', '-d', '-o', String(QEMU_UID), '-g', String(QEMU_GID), '-m', '0755', stateDir]);
    // Secrets and the unpause through the cluster component's object
    // service, as the default manifests run the agent.
    const objects = await startClusterObjects(fake, NODE);
    closeObjects = () => objects.close();
    const keyDir = join(work, 'datasource-key');
    await runCommand(['install', '-d', '-m', '0755', keyDir]);
    await writeFile(join(keyDir, 'keys'), `${randomBytes(32).toString('base64')}\n`, { mode: 0o444 });
    await chmod(work, 0o755);
    const agent = await startDaemonSetAgent({
      hostPaths: {
        '/var/lib/kubelet/pods': tree.podsDir,
        '/var/lib/vmseed/seeds': stateDir,
        '/var/lib/vmseed/keys': keyDir,
      },
      volumeDirs: objects.volumeDirs,
      nodeName: NODE,
      kube: { inCluster: { host: '127.0.0.1', port: fake.port, saDir: (await serviceAccountVolume(fake, work)).path } },
      overrides: { ...LOOPBACK_LISTENERS, ...objects.overrides },
    });
    let statusUrl = '';
    const detail = async () => {
      const status = await fetch(statusUrl)
        .then((r) => r.text())
        .catch((e: unknown) => String(e));
      return `agent log tail:\n${agent.log().split('\n').slice(-20).join('\n')}\nstatus: ${status.slice(0, 3000)}`;
    };
    try {
      const urls = await listenerUrls(agent, 90_000);
      statusUrl = `${urls.status}/status.json`;
      await waitHealthy(agent, `${urls.probes}/healthz`, 60_000);
      await waitUntil(
        'the VMI list',
        () => fake.requests.some((r) => r.resource === 'virtualmachineinstances' && r.verb === 'list'),
        30_000,
        detail,
      );
    } catch (e) {
      await agent.stop();
      throw e;
    }
    return {
      tree,
      fake,
      agent,
      statusUrl,
      detail,
      stop: async () => {
        await agent.stop();
        await cleanup();
      },
    };
  } catch (e) {
    await cleanup();
    throw e;
  }
}

function vmiObject(name: string, uid: string, activePods: Record<string, string> | undefined): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name,
      namespace: NS,
      uid,
      labels: { 'kubevirt.io/nodeName': NODE },
      annotations: { 'vmseed.io/cloud-init': JSON.stringify({ userData: `#cloud-config\n# ${uid}\n` }) },
    },
    spec: { domain: { firmware: { uuid: uid } } },
    // Scheduled, its pod not created yet; then Running with the pod.
    status: activePods
      ? { nodeName: NODE, phase: 'Running', activePods }
      : { nodeName: NODE, phase: 'Scheduled', activePods: {} },
  };
}

async function vmiStatus(node: FirstBootNode, name: string): Promise<VmiStatusRecord | undefined> {
  const s = (await fetch(node.statusUrl).then((r) => r.json())) as { vmis: VmiStatusRecord[] };
  return s.vmis.find((v) => v.namespace === NS && v.name === name);
}

// One VM's first boot on the node's pod `podIndex` (a fresh launcher each
// time): steps in `order` with `delayMs` before each, then the start.
export async function firstBootRun(
  node: FirstBootNode,
  podIndex: number,
  o: { order: Step[]; delayMs: number[]; startDelayMs: number; readTimeoutMs?: number; guest?: GuestKind },
): Promise<FirstBootRun> {
  const guest = o.guest ?? 'busybox';
  const pod = node.tree.pods[podIndex];
  const name = `vm${podIndex}`;
  const uid = randomUUID();
  let launcher: Launcher | undefined;
  let vm: KubevirtVm | undefined;
  node.fake.applyVmi(vmiObject(name, uid, undefined));
  try {
    await waitUntil('the VMI seen', async () => (await vmiStatus(node, name)) !== undefined, 30_000, node.detail);
    for (const [i, step] of o.order.entries()) {
      await sleep(o.delayMs[i] ?? 0);
      if (step === 'pod') node.fake.applyVmi(vmiObject(name, uid, { [pod.uid]: NODE }));
      else if (step === 'socket') launcher = await startLauncher(pod);
      else {
        if (!launcher) throw new Error('define before the socket');
        vm = await defineKubevirtVm(launcher, {
          namespace: NS,
          name,
          uuid: uid,
          cmdline:
            guest === 'debian'
              ? (await ensureDebianGuest()).cmdline
              : busyboxCmdline({ files: ['user-data', 'meta-data'], waitSeconds: 0, after: 'stay' }),
          guest,
        });
      }
    }
    if (!launcher || !vm) throw new Error('the order must hold socket and define');
    await sleep(o.startDelayMs);
    const startIssuedAt = Date.now();
    await launcher.virsh(['start', vm.domain]);
    const startReturnedAt = Date.now();
    const l = launcher;
    const v = vm;
    const firstBoot = await waitUntil(
      `${name}: the seed read by the guest, in the agent's status`,
      async () => {
        const f = (await vmiStatus(node, name))?.firstBoot;
        return f && f.watch !== 'polling' ? f : undefined;
      },
      o.readTimeoutMs ?? 90_000,
      async () => `${await node.detail()}\nconsole: ${consoleOf(l, v).slice(-1500)}`,
    );
    const { console, guestFound } = guest === 'debian' ? await cloudInitLook(l, v, name) : await guestLook(l, v, name);
    return { name, startIssuedAt, startReturnedAt, firstBoot, guestFound, console };
  } finally {
    node.fake.deleteVmi(NS, name);
    if (vm && launcher) {
      await launcher.virsh(['destroy', vm.domain]).catch(() => {});
      await launcher.virsh(['undefine', vm.domain]).catch(() => {});
    }
    await launcher?.stop();
  }
}

// The guest's one look at boot, over once it printed its result.
async function guestLook(l: Launcher, v: KubevirtVm, name: string): Promise<{ console: string; guestFound: boolean }> {
  const console = await waitUntil(
    `${name}: the guest's look at boot`,
    () => {
      const text = consoleOf(l, v);
      const c = parseConsole(text);
      return c.done || c.labelTimeout || c.missing.length > 0 ? text : undefined;
    },
    60_000,
    async () => consoleOf(l, v).slice(-1500),
  );
  const c = parseConsole(console);
  return { console, guestFound: c.files.has('user-data') && c.files.has('meta-data') && !c.labelTimeout };
}

// Debian: cloud-init's run is over once it printed its final line; the seed
// was found when that line names the NoCloud datasource (with no seed it
// names DataSourceNone).
async function cloudInitLook(
  l: Launcher,
  v: KubevirtVm,
  name: string,
): Promise<{ console: string; guestFound: boolean }> {
  const console = await waitUntil(
    `${name}: cloud-init finished`,
    () => {
      const text = consoleOf(l, v);
      return cloudInitFinished(text) ? text : undefined;
    },
    900_000,
    async () => consoleOf(l, v).slice(-1500),
  );
  return { console, guestFound: /finished at .*Datasource DataSourceNoCloud/.test(console) };
}

export interface ReferenceBootRun {
  // From the start event as this process received it to the attach's return.
  attachAfterEventMs: number;
  guestFound: boolean;
  console: string;
}

// The floor under the agent's figure: the same launcher, domain, disk and
// guest, with no VMI and no agent in the path. This process subscribes to the
// launcher's libvirt before the start (its own RPC connection) and sends the
// seed's attach from the start event itself. What is left is libvirt's and
// QEMU's attach while the guest's vCPU starts.
export async function referenceBootRun(
  node: FirstBootNode,
  podIndex: number,
  iso: { path: string; basename: string },
): Promise<ReferenceBootRun> {
  const pod = node.tree.pods[podIndex];
  const name = `ref${podIndex}`;
  const launcher = await startLauncher(pod);
  const client = new RpcLibvirtClient({ timeoutMs: 30_000 });
  let vm: KubevirtVm | undefined;
  try {
    const r = await runCommand([
      'install',
      '-D',
      '-o',
      String(QEMU_UID),
      '-g',
      String(QEMU_GID),
      '-m',
      '0444',
      iso.path,
      launcher.hostPath(`/var/run/kubevirt-ephemeral-disks/vmseed/${iso.basename}`),
    ]);
    if (r.code !== 0) throw new Error(`install the reference image: ${r.stderr}`);
    vm = await defineKubevirtVm(launcher, {
      namespace: NS,
      name,
      uuid: randomUUID(),
      cmdline: busyboxCmdline({ files: ['user-data', 'meta-data'], waitSeconds: 0, after: 'stay' }),
    });
    const domain = vm.domain;
    const uri = `qemu+unix:///session?socket=${launcher.socketOnHost}`;
    const xml = kubevirtSeedDisk(iso.basename);
    let attached: Promise<number> | undefined;
    client.onEvent((e) => {
      if (e.type !== 'lifecycle' || e.domain !== domain || e.event !== 'started' || attached) return;
      const t0 = performance.now();
      attached = client
        .attachDevice(uri, domain, xml, { live: true, config: false })
        .then(() => performance.now() - t0);
    });
    client.watch(uri);
    await waitUntil('the reference subscribed', () => client.version(uri).then(() => true), 30_000);
    await sleep(1000);
    await launcher.virsh(['start', domain]);
    await waitUntil('the start event', () => attached !== undefined, 30_000);
    const attachAfterEventMs = await attached!;
    const { console, guestFound } = await guestLook(launcher, vm, name);
    return { attachAfterEventMs, guestFound, console };
  } finally {
    await client.close();
    if (vm) {
      await launcher.virsh(['destroy', vm.domain]).catch(() => {});
      await launcher.virsh(['undefine', vm.domain]).catch(() => {});
    }
    await launcher.stop();
  }
}
