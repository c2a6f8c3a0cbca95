// A node with hostile launchers beside normal VMIs, for bench/hostile-launcher.ts
// and test/hostile/launcher-attack.test.ts:
// - the fake API server (test/support/fake-kube.ts) serving `normal` VMIs of
//   the node, none with a launcher pod here yet (their seeds are written,
//   their injection waits for status.activePods), and `launchers` hostile
//   VMIs, each with a launcher pod in a kubelet tree with the kubelet's
//   modes (e2e/support/kubelet-tree.ts);
// - each hostile launcher's virtqemud-sock (0700, uid 107, as KubeVirt makes
//   it) served by a scripted daemon (test/support/fake-rpc-daemon.ts) that
//   completes the handshake and then runs one attack;
// - the agent as manifests/daemonset.yaml runs it (e2e/support/daemonset-agent.ts:
//   its args, env and NODE_OPTIONS, uid 107 with group 0, no capabilities,
//   the pods directory at /pods, a read-only root), with a compile cache
//   warmed as 107 the way the image build warms it.
import type { Socket } from 'node:net';
import { chmod, chown, link, mkdir, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { randomBytes } from 'node:crypto';
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { FakeKube } from '../support/fake-kube.ts';
import { handshakeDaemon, lifecycleFrame, reply, type Fake } from '../support/fake-rpc-daemon.ts';
import { drip, replyHead, send } from '../support/hostile-rpc-daemon.ts';
import { createKubeletTree, QEMU_GID, QEMU_UID, type KubeletTree } from '../../e2e/support/kubelet-tree.ts';
import {
  listenerUrls,
  LOOPBACK_LISTENERS,
  readDaemonSetAgent,
  setprivOptions,
  startDaemonSetAgent,
  waitHealthy,
  type DaemonSetAgentProcess,
} from '../../e2e/support/daemonset-agent.ts';
import { startClusterObjects } from '../support/cluster-objects.ts';
import { RemoteProc, writeDomain, type Packet } from '../../src/libvirt/rpc/protocol.ts';
import { XdrReader, XdrWriter } from '../../src/libvirt/rpc/xdr.ts';
import { ImageStore } from '../../src/disk/store.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import type { AgentStatusSnapshot } from '../../src/status/snapshot.ts';

const run = promisify(execFile);
const ROOT = new URL('../../', import.meta.url).pathname;
const MiB = 1024 * 1024;
export const NODE = 'hostile-node';

export const ATTACKS = ['drip-4mib', 'names-1mib', 'flood', 'xml-1mib', 'xml-2mib'] as const;
export type Attack = (typeof ATTACKS)[number];

export const ATTACK_WHAT: Record<Attack, string> = {
  'drip-4mib': 'a 4 MiB frame dripped a byte per millisecond after the handshake',
  'names-1mib': 'lifecycle events naming 1 MiB domains, back to back',
  flood: 'lifecycle events in bursts of 2,000, back to back',
  'xml-1mib': "domain XML just under 1 MiB, the most vmseed reads (5,300 disks), for every read of the VMI's domain",
  'xml-2mib': "2 MiB of domain XML (10,000 disks), over what vmseed reads, for every read of the VMI's domain",
};

const XML_DISKS: Partial<Record<Attack, number>> = { 'xml-1mib': 5_300, 'xml-2mib': 10_000 };

// A domain XML of `count` disks (5,300: 1.04 MB; 10,000: 1.97 MB), each a
// target the agent must look at when it picks its own.
function bigDomainXml(name: string, count: number): string {
  const disks: string[] = [];
  for (let i = 0; i < count; i++)
    disks.push(
      `<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='/var/run/kubevirt-private/vmi-disks/d${i}/disk.img'/><target dev='vd${i}' bus='virtio'/><alias name='ua-d${i}'/></disk>`,
    );
  return `<domain type='kvm'><name>${name}</name><uuid>0b4c2c4e-6f0e-4a4e-9d55-1f1f0c6e1a01</uuid><devices>${disks.join('')}</devices></domain>`;
}

// Answers for the agent's reads of its domain; anything else falls to the
// scripted daemon's error reply.
function domainReads(p: Packet, sock: Socket, xml: () => string): boolean {
  switch (p.header.proc) {
    case RemoteProc.DOMAIN_LOOKUP_BY_NAME: {
      const name = new XdrReader(p.payload).string(4096);
      reply(sock, p, writeDomain(new XdrWriter(), { name, uuid: Buffer.alloc(16, 9), id: 1 }).toBuffer());
      return true;
    }
    case RemoteProc.DOMAIN_GET_STATE:
      reply(sock, p, new XdrWriter().i32(1).i32(1).toBuffer());
      return true;
    case RemoteProc.DOMAIN_IS_PERSISTENT:
      reply(sock, p, new XdrWriter().i32(0).toBuffer());
      return true;
    case RemoteProc.DOMAIN_GET_XML_DESC:
      reply(sock, p, new XdrWriter().string(xml(), 4 * MiB).toBuffer());
      return true;
    default:
      return false;
  }
}

// What the daemon does once the agent has registered for events (its
// second registration), until the socket goes.
async function attackAfterHandshake(attack: Attack, sock: Socket): Promise<void> {
  switch (attack) {
    case 'drip-4mib': {
      const frame = Buffer.alloc(4 * MiB);
      replyHead(0, frame.length).copy(frame);
      await drip(sock, frame, 1);
      return;
    }
    case 'names-1mib':
      for (let i = 0; !sock.destroyed; i++)
        await send(sock, lifecycleFrame(`${i}`.padEnd(MiB, 'x'), Buffer.alloc(16, i & 0xff)));
      return;
    case 'flood': {
      const burst = Buffer.concat(
        Array.from({ length: 2_000 }, (_, i) => lifecycleFrame(`d${i % 50}`, Buffer.alloc(16, 1), i % 9)),
      );
      while (!sock.destroyed) {
        await send(sock, burst);
        await new Promise((r) => setImmediate(r));
      }
      return;
    }
    case 'xml-1mib':
    case 'xml-2mib':
      return;
  }
}

export interface HostileLauncher {
  podUid: string;
  daemon: Fake;
  // Connections the daemon accepted.
  connections(): number;
  close(): Promise<void>;
}

async function startHostileLauncher(tree: KubeletTree, index: number, attack: Attack): Promise<HostileLauncher> {
  const pod = tree.pods[index];
  const registered = new WeakMap<Socket, number>();
  const attacks: Array<Promise<void>> = [];
  let xml: string | undefined;
  const daemon = await handshakeDaemon([0], (p, sock) => {
    if (p.header.proc === RemoteProc.CONNECT_DOMAIN_EVENT_CALLBACK_REGISTER_ANY) {
      reply(sock, p, new XdrWriter().i32(p.header.serial).toBuffer());
      const n = (registered.get(sock) ?? 0) + 1;
      registered.set(sock, n);
      if (n === 2) attacks.push(attackAfterHandshake(attack, sock).catch(() => {}));
      return true;
    }
    const disks = XML_DISKS[attack];
    return disks !== undefined && domainReads(p, sock, () => (xml ??= bigDomainXml('x', disks)));
  });
  let connections = 0;
  daemon.server.on('connection', () => connections++);
  // As KubeVirt's launcher makes it: 0700, uid 107, in the libvirt-runtime
  // emptyDir (a hard link: the daemon listens on a short path, as a unix
  // socket address must fit 107 bytes).
  await chown(daemon.path, QEMU_UID, QEMU_GID);
  await chmod(daemon.path, 0o700);
  await link(daemon.path, join(pod.emptyDir('libvirt-runtime'), 'virtqemud-sock'));
  return {
    podUid: pod.uid,
    daemon,
    connections: () => connections,
    close: async () => {
      await daemon.close();
      await Promise.all(attacks);
    },
  };
}

let vmis = 0;

function vmi(name: string, activePods: Record<string, string> | undefined): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name,
      namespace: `ns-${vmis++ % 10}`,
      labels: { 'kubevirt.io/nodeName': NODE },
      annotations: {
        'vmseed.io/cloud-init': `userData: |\n  #cloud-config\n  hostname: ${name}\n  packages: [curl, jq]\n  runcmd:\n    - echo ${name} > /etc/motd\nnetworkData: |\n  version: 2\n  ethernets:\n    eth0: {dhcp4: true}\n`,
      },
    },
    spec: { hostname: name, domain: {} },
    status: { nodeName: NODE, phase: 'Running', ...(activePods ? { activePods } : {}) },
  };
}

export interface HostileNode {
  fake: FakeKube;
  agent: DaemonSetAgentProcess;
  launchers: HostileLauncher[];
  healthz: string;
  statusUrl: string;
  // Adds a normal VMI; resolves its image directory's check.
  addVmi(name: string): () => Promise<boolean>;
  // Normal VMIs whose seed image is on disk.
  seeded(): Promise<number>;
  peak(): { hwmBytes: number; rssBytes: number };
  status(): Promise<AgentStatusSnapshot>;
  stop(): Promise<void>;
}

// Warms a compile cache for the agent's user, outside /tmp (an emptyDir in
// the agent's view hides it), as the image build does for its own.
async function warmCache(work: string): Promise<string> {
  const dir = await mkdtemp('/var/tmp/vmseed-hostile-cache-');
  await chown(dir, QEMU_UID, QEMU_GID);
  const spec = readDaemonSetAgent();
  const nodeOptions = spec.env.find((e) => e.name === 'NODE_OPTIONS')?.value ?? '';
  await run(
    'setpriv',
    [
      ...setprivOptions(spec),
      'env',
      `NODE_COMPILE_CACHE=${dir}`,
      `NODE_OPTIONS=${nodeOptions}`,
      `HOME=${work}`,
      join(ROOT, 'bin/vmseed'),
      'warm-cache',
    ],
    { timeout: 60_000 },
  );
  return dir;
}

export async function startHostileNode(o: {
  normal: number;
  launchers: number;
  attack: Attack | undefined;
}): Promise<HostileNode> {
  const cleanups: Array<() => Promise<unknown>> = [];
  const stop = async () => {
    for (const c of cleanups.reverse()) await c().catch(() => {});
  };
  try {
    const fake = await FakeKube.start();
    cleanups.push(() => fake.close());
    const work = await mkdtemp('/tmp/vmseed-hostile-node-');
    cleanups.push(() => rm(work, { recursive: true, force: true }));
    await chmod(work, 0o755);
    const cache = await warmCache(work);
    cleanups.push(() => rm(cache, { recursive: true, force: true }));
    const tree = await createKubeletTree(Math.max(1, o.launchers));
    cleanups.push(() => tree.remove());
    const launchers: HostileLauncher[] = [];
    if (o.attack)
      for (let i = 0; i < o.launchers; i++) {
        const l = await startHostileLauncher(tree, i, o.attack);
        launchers.push(l);
        cleanups.push(() => l.close());
      }
    // The DaemonSet's hostPath state directory, handed to 107 by its init
    // container; the datasource key Secret as the kubelet projects it.
    const stateDir = join(work, 'seeds');
    await mkdir(stateDir);
    await chown(stateDir, QEMU_UID, QEMU_GID);
    // Secrets and the unpause through the cluster component's object
    // service, as the default manifests run the agent.
    const objects = await startClusterObjects(fake, NODE);
    cleanups.push(() => objects.close());
    const keyDir = join(work, 'datasource-key');
    await mkdir(keyDir, { mode: 0o755 });
    await writeFile(join(keyDir, 'keys'), `${randomBytes(32).toString('base64')}\n`, { mode: 0o444 });

    const normal: VmiObject[] = [];
    for (let i = 0; i < o.normal; i++) normal.push(fake.applyVmi(vmi(`vm-${String(i).padStart(5, '0')}`, undefined)));
    for (const l of launchers) fake.applyVmi(vmi(`hostile-${l.podUid.slice(0, 8)}`, { [l.podUid]: NODE }));
    const kubeconfig = await fake.writeKubeconfig(work);

    const agent = await startDaemonSetAgent({
      hostPaths: {
        '/var/lib/kubelet/pods': tree.podsDir,
        '/var/lib/vmseed/seeds': stateDir,
        '/var/lib/vmseed/keys': keyDir,
      },
      volumeDirs: objects.volumeDirs,
      nodeName: NODE,
      kube: { kubeconfig },
      overrides: {
        ...objects.overrides,
        ...LOOPBACK_LISTENERS,
        // Info logs a line per seed: kept, as shipped.
      },
      extraEnv: { NODE_COMPILE_CACHE: cache },
    });
    cleanups.push(() => agent.stop());
    const urls = await listenerUrls(agent, 90_000);
    const healthz = `${urls.probes}/healthz`;
    await waitHealthy(agent, healthz, 60_000);
    const store = new ImageStore({ root: stateDir });
    const hasImage = async (v: VmiObject) => {
      const dir = store.dirFor({ namespace: v.metadata.namespace!, name: v.metadata.name, uid: v.metadata.uid! });
      return (await readdir(dir).catch(() => [] as string[])).some((n) => n.endsWith('.iso'));
    };
    const pid = agent.child.pid!;
    return {
      fake,
      agent,
      launchers,
      healthz,
      statusUrl: `${urls.status}/status.json`,
      addVmi: (name) => {
        const v = fake.applyVmi(vmi(name, undefined));
        return () => hasImage(v);
      },
      seeded: async () => {
        let n = 0;
        for (const v of normal) if (await hasImage(v)) n++;
        return n;
      },
      peak: () => {
        const status = readFileSync(`/proc/${pid}/status`, 'utf8');
        const kb = (k: string) => Number(new RegExp(`^${k}:\\s+(\\d+) kB$`, 'm').exec(status)?.[1] ?? NaN) * 1024;
        return { hwmBytes: kb('VmHWM'), rssBytes: kb('VmRSS') };
      },
      status: async () => (await (await fetch(`${urls.status}/status.json`)).json()) as AgentStatusSnapshot,
      stop,
    };
  } catch (e) {
    await stop();
    throw e;
  }
}

// One /healthz request from outside the agent: its latency, or why it failed.
export async function probeHealthz(url: string, timeoutMs: number): Promise<{ ms: number; ok: boolean; why?: string }> {
  const t0 = performance.now();
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(timeoutMs) });
    await r.arrayBuffer();
    return { ms: performance.now() - t0, ok: r.status === 200, ...(r.status === 200 ? {} : { why: `${r.status}` }) };
  } catch (e) {
    return { ms: performance.now() - t0, ok: false, why: (e as Error).name };
  }
}
