// The kubelet's part of an install, for a DaemonSet an API server (the fake)
// holds: its pod on one node, from the pod template as stored, not from a
// file. What would keep the pod from running fails here with the reason
// Kubernetes would give: a selector that does not match the template, a
// node affinity the node's labels do not meet, a missing ServiceAccount,
// PriorityClass or (not optional) Secret, an init container that fails.
// Then, as the kubelet does:
// - the service-account volume (token the fake accepts for that account,
//   its CA, the namespace; in-cluster.ts) and KUBERNETES_SERVICE_HOST/PORT;
// - hostPath volumes as directories of the test (the kubelet's pods
//   directory is a kubelet-tree.ts tree with two launcher pods'),
//   Secret volumes written from the Secrets the fake holds (items,
//   defaultMode; an optional one absent is an empty directory, filled by
//   `syncSecretVolumes()` as the kubelet's periodic sync does);
// - init containers in order, each to exit 0, then every container, each
//   with its command, args, env (Downward API), security context and
//   mounts (e2e/support/daemonset-agent.ts), in one network namespace
//   (pod-netns.ts) that stands for the pod's, or the node's for a
//   hostNetwork pod (status.hostIP is its address either way).
// Not replicated: resource limits (cgroups), probes' restarts, the image
// (bin/vmseed of this checkout stands for `vmseed`, without tini).
import { execFile } from 'node:child_process';
import { once } from 'node:events';
import { chmod, chown, mkdir, mkdtemp, rename, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { startDaemonSetAgent, type DaemonSetAgentProcess } from '../../e2e/support/daemonset-agent.ts';
import { createKubeletTree, type KubeletTree } from '../../e2e/support/kubelet-tree.ts';
import type { FakeKube } from './fake-kube.ts';
import { resourceType, type StoredObject } from './fake-kube-objects.ts';
import { serviceAccountVolume } from './in-cluster.ts';
import type { PodNetns } from './pod-netns.ts';
import { ROOT } from './manifests.ts';

const run = promisify(execFile);

type Any = any;

export const KUBELET_PODS = '/var/lib/kubelet/pods';

export interface Node {
  name: string;
  labels: Record<string, string>;
}

export interface DaemonSetPod {
  podIP: string;
  // The pod template's labels and spec.
  labels: Record<string, string>;
  spec: Any;
  containers: Map<string, DaemonSetAgentProcess>;
  // Stand-ins of the hostPath volumes, by path on the node.
  hostPaths: Record<string, string>;
  // The kubelet's pods directory, for launcher pods.
  kubelet: KubeletTree;
  // The URL of a container's probe ('readinessProbe', 'livenessProbe').
  probeUrl(container: string, probe: 'readinessProbe' | 'livenessProbe'): string;
  // The container port of that name.
  port(container: string, name: string): number;
  syncSecretVolumes(): Promise<void>;
  logs(): string;
  // Containers get SIGTERM; resolves with their exit codes.
  stop(): Promise<Record<string, number | null>>;
}

// requiredDuringSchedulingIgnoredDuringExecution: any term whose every
// expression the node's labels meet.
export function nodeAffinityMatches(podSpec: Any, labels: Record<string, string>): boolean {
  const terms: Any[] =
    podSpec.affinity?.nodeAffinity?.requiredDuringSchedulingIgnoredDuringExecution?.nodeSelectorTerms;
  const selector = Object.entries((podSpec.nodeSelector ?? {}) as Record<string, string>);
  if (!selector.every(([k, v]) => labels[k] === v)) return false;
  if (terms === undefined) return true;
  return terms.some((term) =>
    ((term.matchExpressions ?? []) as Any[]).every((e) => {
      const has = Object.hasOwn(labels, e.key);
      switch (e.operator) {
        case 'Exists':
          return has;
        case 'DoesNotExist':
          return !has;
        case 'In':
          return has && (e.values as string[]).includes(labels[e.key]);
        case 'NotIn':
          return !has || !(e.values as string[]).includes(labels[e.key]);
        default:
          throw new Error(`node affinity operator ${e.operator} is not replicated`);
      }
    }),
  );
}

function stored(fake: FakeKube, group: string, resource: string, namespace: string | undefined, name: string) {
  return fake.objects.get(resourceType(group, resource)!, namespace, name);
}

// The image build's `vmseed warm-cache`, for root and for uid 107 (the
// Dockerfile's two runs), into a directory of the test's: the containers
// get it where the image has it (`compileCache`). The caller removes it.
export async function imageCompileCache(): Promise<string> {
  const cache = await mkdtemp(join(tmpdir(), 'vmseed-compile-cache-'));
  await chmod(cache, 0o755);
  const vmseed = join(ROOT, 'bin', 'vmseed');
  const env = { ...process.env, NODE_COMPILE_CACHE: cache };
  await run(vmseed, ['warm-cache'], { env, timeout: 120_000 });
  await chown(cache, 107, 107);
  await run('setpriv', ['--reuid=107', '--regid=107', '--clear-groups', vmseed, 'warm-cache'], {
    env,
    timeout: 120_000,
  });
  return cache;
}

export async function startDaemonSetPod(
  fake: FakeKube,
  ds: StoredObject,
  o: { node: Node; netns: PodNetns; dir: string; compileCache?: string },
): Promise<DaemonSetPod> {
  const namespace = ds.metadata.namespace!;
  const where = `DaemonSet ${namespace}/${ds.metadata.name}`;
  const spec = (ds as Any).spec.template.spec;
  const templateLabels: Record<string, string> = (ds as Any).spec.template.metadata?.labels ?? {};
  for (const [k, v] of Object.entries((ds as Any).spec.selector?.matchLabels ?? {}))
    if (templateLabels[k] !== v) throw new Error(`${where}: selector does not match template labels (${k})`);
  if (!nodeAffinityMatches(spec, o.node.labels))
    throw new Error(`${where}: no pod on node ${o.node.name} (labels ${JSON.stringify(o.node.labels)})`);
  const account = spec.serviceAccountName ?? 'default';
  if (!stored(fake, '', 'serviceaccounts', namespace, account))
    throw new Error(`${where}: error looking up service account ${namespace}/${account}: not found`);
  if (
    spec.priorityClassName &&
    !stored(fake, 'scheduling.k8s.io', 'priorityclasses', undefined, spec.priorityClassName)
  )
    throw new Error(`${where}: no PriorityClass with name ${spec.priorityClassName} was found`);
  if (`${namespace}:${account}` !== fake.user.replace(/^system:serviceaccount:/, ''))
    throw new Error(`${where}: runs as ${namespace}/${account}, the fake authenticates only ${fake.user}`);

  const sa = await serviceAccountVolume(fake, o.dir, { namespace });
  const kubelet = await createKubeletTree(2);
  const hostPaths: Record<string, string> = {};
  const secrets: Record<string, string> = {};
  const secretVolumes: Any[] = [];
  for (const v of (spec.volumes ?? []) as Any[]) {
    if (v.hostPath?.path === KUBELET_PODS) hostPaths[v.hostPath.path] = kubelet.podsDir;
    else if (v.hostPath) {
      const dir = join(o.dir, 'node', v.hostPath.path);
      await mkdir(dir, { recursive: true });
      hostPaths[v.hostPath.path] = dir;
    } else if (v.secret) {
      const dir = join(o.dir, 'volumes', v.name);
      await mkdir(dir, { recursive: true, mode: 0o755 });
      secrets[v.secret.secretName] = dir;
      secretVolumes.push(v);
    }
  }
  const syncSecretVolumes = async () => {
    for (const v of secretVolumes) {
      const secret = fake.getSecret(namespace, v.secret.secretName);
      if (!secret) {
        if (v.secret.optional) continue;
        throw new Error(
          `${where}: MountVolume.SetUp failed for volume "${v.name}": secret "${v.secret.secretName}" not found`,
        );
      }
      const data = secret.data ?? {};
      const items: Array<{ key: string; path: string }> =
        v.secret.items ?? Object.keys(data).map((key) => ({ key, path: key }));
      for (const { key, path } of items) {
        if (data[key] === undefined) {
          if (v.secret.optional) continue;
          throw new Error(`${where}: secret ${v.secret.secretName} has no key ${key}`);
        }
        const file = join(secrets[v.secret.secretName], path);
        await writeFile(`${file}.tmp`, Buffer.from(data[key], 'base64'));
        await chmod(`${file}.tmp`, v.secret.defaultMode ?? 0o644);
        await rename(`${file}.tmp`, file);
      }
    }
  };
  await syncSecretVolumes();

  const containers = new Map<string, DaemonSetAgentProcess>();
  const start = (container: string) =>
    startDaemonSetAgent({
      objects: [ds],
      container,
      hostPaths,
      secrets,
      nodeName: o.node.name,
      hostIP: o.netns.podIP,
      netns: o.netns.name,
      kube: { inCluster: { host: fake.host, port: fake.port, saDir: sa.path } },
      overrides: {},
      ...(o.compileCache ? { compileCache: o.compileCache } : {}),
    });
  const logs = () => [...containers].map(([name, c]) => `--- ${name}\n${c.log().slice(-4000)}`).join('\n');
  const stop = async () => {
    const codes: Record<string, number | null> = {};
    for (const [name, c] of containers) codes[name] = await c.stop();
    await kubelet.remove();
    return codes;
  };
  try {
    for (const init of (spec.initContainers ?? []) as Any[]) {
      const c = await start(init.name);
      containers.set(init.name, c);
      if (c.child.exitCode === null && c.child.signalCode === null) await once(c.child, 'exit');
      if (c.child.exitCode !== 0)
        throw new Error(`${where}: init container ${init.name} exited with ${c.child.exitCode}\n${c.log()}`);
    }
    for (const c of (spec.containers ?? []) as Any[]) containers.set(c.name, await start(c.name));
  } catch (e) {
    await stop();
    throw e;
  }
  const port = (container: string, name: string): number => {
    const c = (spec.containers as Any[]).find((x) => x.name === container);
    const p = ((c?.ports ?? []) as Any[]).find((x) => x.name === name || x.containerPort === name);
    if (!p) throw new Error(`${where}: container ${container} has no port ${name}`);
    return p.containerPort as number;
  };
  return {
    podIP: o.netns.podIP,
    labels: templateLabels,
    spec,
    containers,
    hostPaths,
    kubelet,
    probeUrl: (container, probe) => {
      const get = (spec.containers as Any[]).find((x) => x.name === container)?.[probe]?.httpGet;
      if (!get) throw new Error(`${where}: container ${container} has no httpGet ${probe}`);
      return `http://${o.netns.podIP}:${port(container, get.port)}${get.path}`;
    },
    port,
    syncSecretVolumes,
    logs,
    stop,
  };
}
