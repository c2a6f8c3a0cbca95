// A KubeVirt-mode seed made by vmseed's own code on the replica node, step by
// step as the agent makes it: renderSeed with the cluster defaults (the
// vmseed.io/cloud-init annotation, or a volume the webhook adopted; KubeVirt's
// own volumes ignored), the ISO writer, the image store, then the injector
// (agent-injector-main.ts) as the DaemonSet's user through /pods. Only the agent's informer and reconciler
// are left out (e2e/kubevirt-node-agent.test.ts runs the whole agent).
import { chown, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import type { Datasource, RefResolver, VmiObject } from '../../src/api/objects.ts';
import { MemoryResolver } from '../../src/cloudinit/refs/memory-resolver.ts';
import { DEFAULT_RENDER_OPTIONS, renderSeed } from '../../src/cloudinit/render.ts';
import type { Seed } from '../../src/cloudinit/seed.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import type { InjectionResult, InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import { agentViewArgv, ensurePodsMountPoint } from './agent-view.ts';
import { runCommand, type KubeletTree } from './kubelet-tree.ts';
import { E2E_LIBVIRT } from './libvirt-mode.ts';
import { AGENT } from './replica-seed.ts';

const MAIN = new URL('./agent-injector-main.ts', import.meta.url).pathname;

export const REPLICA_NODE = 'replica-node';

/** A VMI as KubeVirt reports it for startStrategy Paused, seeded through vmseed's annotation, running in launcher pod `pod`. */
export function annotatedVmi(o: {
  namespace: string;
  name: string;
  uid: string;
  pod: string;
  userData: string;
}): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      namespace: o.namespace,
      name: o.name,
      uid: o.uid,
      annotations: { 'vmseed.io/cloud-init': JSON.stringify({ userData: o.userData }) },
    },
    spec: { startStrategy: 'Paused', domain: { firmware: { uuid: o.uid } } },
    status: { nodeName: REPLICA_NODE, phase: 'Running', activePods: { [o.pod]: REPLICA_NODE } },
  };
}

export interface AgentSeed {
  seed: Seed;
  /** The store's image (`<datasource>-<sha16>.iso`), owned by the agent's user. */
  path: string;
  sha256: string;
  cleanup(): Promise<void>;
}

/** Renders `vmi` (its Secrets from `refs`) and writes its image into a store of its own, as the agent's state directory holds it. */
export async function agentSeed(vmi: VmiObject, refs: RefResolver = new MemoryResolver({})): Promise<AgentSeed> {
  const outcome = await renderSeed(vmi, refs, {
    ...DEFAULT_RENDER_OPTIONS,
    kubevirtVolumes: 'ignore',
  });
  if (outcome.kind !== 'seed') throw new Error(`vmseed renders no seed for the VMI: ${outcome.reason}`);
  const image = buildSeedImage(outcome.seed, new Date());
  const root = await mkdtemp(join(tmpdir(), 'vmseed-agent-seeds-'));
  const cleanup = () => rm(root, { recursive: true, force: true });
  try {
    const store = new ImageStore({ root });
    const { namespace, name, uid } = vmi.metadata;
    const key = { namespace: namespace!, name: name, uid: uid! };
    const { path } = await store.write(key, outcome.seed.datasource, image.bytes, {
      sha256: image.sha256,
      fsync: false,
    });
    // The DaemonSet's user owns its state directory.
    await chownTree(root, AGENT.uid, AGENT.gid);
    return { seed: outcome.seed, path, sha256: image.sha256, cleanup };
  } catch (e) {
    await cleanup();
    throw e;
  }
}

async function chownTree(dir: string, uid: number, gid: number): Promise<void> {
  await chown(dir, uid, gid);
  for (const e of await readdir(dir, { withFileTypes: true })) {
    const p = join(dir, e.name);
    if (e.isDirectory()) await chownTree(p, uid, gid);
    else await chown(p, uid, gid);
  }
}

/** vmseed's injector from the kubevirt preset, run as the agent (uid 107, group 0, the pods tree at /pods), attaches `imagePath` to the VMI's domain in its launcher pod. */
export async function injectAsAgent(
  tree: KubeletTree,
  vmi: VmiObject,
  imagePath: string,
  datasource: Datasource = 'nocloud',
): Promise<InjectionResult> {
  const { namespace, name, uid, annotations } = vmi.metadata;
  const target: InjectionTarget = {
    namespace: namespace!,
    name: name,
    uid: uid!,
    datasource,
    annotations: annotations ?? {},
    launcherPods: Object.keys(vmi.status?.activePods ?? {}),
  };
  await ensurePodsMountPoint();
  const argv = agentViewArgv(tree.podsDir, AGENT, [
    process.execPath,
    MAIN,
    E2E_LIBVIRT,
    JSON.stringify(target),
    imagePath,
  ]);
  // Node's start and the type stripping of the injector's modules, on a loaded machine.
  const r = await runCommand(argv, { timeoutMs: 120_000 });
  if (r.code !== 0) throw new Error(`vmseed's injector as the agent exited ${r.code}: ${r.stderr}`);
  return JSON.parse(r.stdout) as InjectionResult;
}
