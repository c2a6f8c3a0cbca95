// The kubelet's part of an install, for a DaemonSet or a Deployment an API
// server (the fake) holds: one pod of it on one node (a Deployment: one
// replica), from the pod template as stored, not from a file. What would keep the pod from running fails here with the reason
// Kubernetes would give: a selector that does not match the template, a
// node affinity the node's labels do not meet, a missing ServiceAccount,
// PriorityClass or (not optional) Secret, an init container that fails.
// Then, as the kubelet does:
// - the service-account volume (token the fake accepts for that account,
//   its CA, the namespace; in-cluster.ts) and KUBERNETES_SERVICE_HOST/PORT;
// - the pod itself on the fake (setPod: name, uid, node), and `projected`
//   serviceAccountToken volumes: a token at `path`, registered for the
//   fake's TokenReview as the kubelet's TokenRequest makes it (the
//   account's user, the audience, the pod's name, uid and node as extra);
// - configMap volumes (items or every key, defaultMode; an optional one
//   absent is an empty directory, filled by `syncSecretVolumes()` too);
// - cluster DNS for Service names (cluster-dns.ts: the Ready pods a Service
//   selects), for every pod started against one fake;
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
import { randomBytes, randomUUID } from 'node:crypto';
import { chmod, chown, mkdir, mkdtemp, rename, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { startDaemonSetAgent, type DaemonSetAgentProcess } from '../../e2e/support/daemonset-agent.ts';
import { createKubeletTree, type KubeletTree } from '../../e2e/support/kubelet-tree.ts';
import type { FakeKube } from './fake-kube.ts';
import { resourceType, type StoredObject } from './fake-kube-objects.ts';
import { serviceAccountVolume } from './in-cluster.ts';
import { clusterDnsOf } from './cluster-dns.ts';
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
  // The pod's name and uid on the fake (setPod).
  name: string;
  uid: string;
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
  // The kubelet's periodic sync of Secret and ConfigMap volumes.
  syncSecretVolumes(): Promise<void>;
  logs(): string;
  // Containers get SIGTERM; resolves with their exit codes.
  stop(): Promise<Record<string, number | null>>;
}

// A pod of either workload (the name is the DaemonSet's, kept for callers).
export type Pod = DaemonSetPod;

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

export interface PodOptions {
  node: Node;
  netns: PodNetns;
  // The test's directory for this pod's volumes (one per pod).
  dir: string;
  compileCache?: string;
}

export function startDaemonSetPod(fake: FakeKube, ds: StoredObject, o: PodOptions): Promise<DaemonSetPod> {
  if (ds.kind !== 'DaemonSet') throw new Error(`startDaemonSetPod: ${ds.kind} ${ds.metadata.name} is no DaemonSet`);
  return startPod(fake, ds, o);
}

// One replica of the Deployment, on `node` when its affinity allows.
export function startDeploymentPod(fake: FakeKube, deployment: StoredObject, o: PodOptions): Promise<DaemonSetPod> {
  if (deployment.kind !== 'Deployment')
    throw new Error(`startDeploymentPod: ${deployment.kind} ${deployment.metadata.name} is no Deployment`);
  return startPod(fake, deployment, o);
}

const suffix = (n: number) => [...randomBytes(n)].map((b) => 'bcdfghjklmnpqrstvwxz2456789'[b % 27]).join('');

export async function startPod(fake: FakeKube, workload: StoredObject, o: PodOptions): Promise<DaemonSetPod> {
  const namespace = workload.metadata.namespace!;
  const where = `${workload.kind} ${namespace}/${workload.metadata.name}`;
  const spec = (workload as Any).spec.template.spec;
  const templateLabels: Record<string, string> = (workload as Any).spec.template.metadata?.labels ?? {};
  for (const [k, v] of Object.entries((workload as Any).spec.selector?.matchLabels ?? {}))
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
  // The agent's account is the fake's `user` (its accepted tokens); any
  // other gets a token of its own from the fake.
  const agentAccount = `${namespace}:${account}` === fake.user.replace(/^system:serviceaccount:/, '');
  const name =
    workload.kind === 'Deployment'
      ? `${workload.metadata.name}-${suffix(10)}-${suffix(5)}`
      : `${workload.metadata.name}-${suffix(5)}`;
  const uid = randomUUID();
  fake.setPod(namespace, name, uid, o.node.name);

  const sa = await serviceAccountVolume(fake, o.dir, {
    namespace,
    ...(agentAccount ? {} : { account: { namespace, name: account } }),
  });
  const kubelet = await createKubeletTree(2);
  const hostPaths: Record<string, string> = {};
  const secrets: Record<string, string> = {};
  const volumeDirs: Record<string, string> = {};
  const secretVolumes: Any[] = [];
  const configMapVolumes: Any[] = [];
  const reviewTokens: string[] = [];
  const volumeDir = async (v: Any) => {
    const dir = join(o.dir, 'volumes', v.name);
    await mkdir(dir, { recursive: true, mode: 0o755 });
    await chmod(dir, 0o755);
    return dir;
  };
  for (const v of (spec.volumes ?? []) as Any[]) {
    if (v.hostPath?.path === KUBELET_PODS) hostPaths[v.hostPath.path] = kubelet.podsDir;
    else if (v.hostPath) {
      const dir = join(o.dir, 'node', v.hostPath.path);
      await mkdir(dir, { recursive: true });
      hostPaths[v.hostPath.path] = dir;
    } else if (v.secret) {
      secrets[v.secret.secretName] = await volumeDir(v);
      secretVolumes.push(v);
    } else if (v.configMap) {
      volumeDirs[v.name] = await volumeDir(v);
      configMapVolumes.push(v);
    } else if (v.projected) {
      const dir = (volumeDirs[v.name] = await volumeDir(v));
      for (const source of v.projected.sources as Any[]) {
        const t = source.serviceAccountToken;
        if (!t)
          throw new Error(`${where}: projected volume ${v.name}: only serviceAccountToken sources are replicated`);
        // The kubelet's TokenRequest for this pod: bound to it and its node.
        const token = `${randomBytes(24).toString('base64url')}.${randomBytes(24).toString('base64url')}`;
        fake.registerReviewToken(token, {
          username: `system:serviceaccount:${namespace}:${account}`,
          audiences: [t.audience ?? 'https://kubernetes.default.svc'],
          extra: {
            'authentication.kubernetes.io/pod-name': [name],
            'authentication.kubernetes.io/pod-uid': [uid],
            'authentication.kubernetes.io/node-name': [o.node.name],
          },
        });
        reviewTokens.push(token);
        const file = join(dir, t.path);
        await writeFile(file, token);
        await chmod(file, v.projected.defaultMode ?? 0o644);
      }
    }
  }
  const writeItems = async (
    kind: string,
    v: Any,
    source: Any,
    dir: string,
    data: Record<string, Buffer> | undefined,
  ) => {
    if (!data) {
      if (source.optional) return;
      throw new Error(
        `${where}: MountVolume.SetUp failed for volume "${v.name}": ${kind} "${source.secretName ?? source.name}" not found`,
      );
    }
    const items: Array<{ key: string; path: string }> =
      source.items ?? Object.keys(data).map((key) => ({ key, path: key }));
    for (const { key, path } of items) {
      if (data[key] === undefined) {
        if (source.optional) continue;
        throw new Error(`${where}: ${kind} ${source.secretName ?? source.name} has no key ${key}`);
      }
      const file = join(dir, path);
      await writeFile(`${file}.tmp`, data[key]);
      await chmod(`${file}.tmp`, source.defaultMode ?? 0o644);
      await rename(`${file}.tmp`, file);
    }
  };
  const decoded = (d: Record<string, string> | undefined, encoding: BufferEncoding) =>
    Object.fromEntries(Object.entries(d ?? {}).map(([k, x]) => [k, Buffer.from(x, encoding)]));
  const syncSecretVolumes = async () => {
    for (const v of secretVolumes) {
      const secret = fake.getSecret(namespace, v.secret.secretName);
      await writeItems('secret', v, v.secret, secrets[v.secret.secretName], secret && decoded(secret.data, 'base64'));
    }
    for (const v of configMapVolumes) {
      const cm = fake.getConfigMap(namespace, v.configMap.name);
      const data = cm && { ...decoded(cm.data, 'utf8'), ...decoded(cm.binaryData, 'base64') };
      await writeItems('configmap', v, v.configMap, volumeDirs[v.name], data);
    }
  };
  await syncSecretVolumes();

  const dns = await clusterDnsOf(fake);
  // The records as of this pod's start (the poll keeps them current).
  await dns.dns.poll();
  const containers = new Map<string, DaemonSetAgentProcess>();
  const start = (container: string) =>
    startDaemonSetAgent({
      objects: [workload],
      container,
      hostPaths,
      secrets,
      volumeDirs,
      nodeName: o.node.name,
      hostIP: o.netns.podIP,
      podIP: o.netns.podIP,
      netns: o.netns.name,
      dnsDir: dns.dns.dir,
      kube: { inCluster: { host: fake.host, port: fake.port, saDir: sa.path } },
      overrides: {},
      ...(o.compileCache ? { compileCache: o.compileCache } : {}),
    });
  const logs = () => [...containers].map(([n, c]) => `--- ${n}\n${c.log().slice(-4000)}`).join('\n');
  const port = (container: string, portName: string): number => {
    const c = (spec.containers as Any[]).find((x) => x.name === container);
    const p = ((c?.ports ?? []) as Any[]).find((x) => x.name === portName || x.containerPort === portName);
    if (!p) throw new Error(`${where}: container ${container} has no port ${portName}`);
    return p.containerPort as number;
  };
  const probeUrl = (container: string, probe: 'readinessProbe' | 'livenessProbe') => {
    const get = (spec.containers as Any[]).find((x) => x.name === container)?.[probe]?.httpGet;
    if (!get) throw new Error(`${where}: container ${container} has no httpGet ${probe}`);
    return `http://${o.netns.podIP}:${port(container, get.port)}${get.path}`;
  };
  const dnsPod = {
    namespace,
    labels: templateLabels,
    podIP: o.netns.podIP,
    readinessUrls: ((spec.containers ?? []) as Any[])
      .filter((c) => c.readinessProbe?.httpGet)
      .map((c) => probeUrl(c.name, 'readinessProbe')),
  };
  const stop = async () => {
    await dns.dns.remove(dnsPod);
    const codes: Record<string, number | null> = {};
    for (const [n, c] of containers) codes[n] = await c.stop();
    for (const token of reviewTokens) fake.forgetReviewToken(token);
    await dns.release();
    await kubelet.remove();
    await rm(join(o.dir, 'volumes'), { recursive: true, force: true });
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
  dns.dns.add(dnsPod);
  return {
    name,
    uid,
    podIP: o.netns.podIP,
    labels: templateLabels,
    spec,
    containers,
    hostPaths,
    kubelet,
    probeUrl,
    port,
    syncSecretVolumes,
    logs,
    stop,
  };
}
