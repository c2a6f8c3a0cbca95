// An operator's first install, end to end, for every variant in deploy/ and
// for the three components combined in an overlay of the operator's own
// (docs/operations.md's "Namespaced RBAC" overlay, with
// deploy/components/imds and deploy/components/webhook listed beside
// namespaced), as docs/operations.md's "Install" says:
// 1. `kubectl kustomize` renders the variant (and manifests/monitoring)
//    with no warning;
// 2. real `kubectl apply -f` (what `kubectl apply -k` sends) creates every
//    object on the fake API server over TLS, as a cluster admin, and
//    `kubectl create secret generic vmseed-datasource-key` the datasource
//    key;
// 3. the pod of the cluster component's Deployment (every variant but
//    single-tenant) as the API server stored it runs as the kubelet would
//    run it (test/support/kubelet.ts) on a node without VMs, in a pod
//    network namespace of its own joined to the agent's, with its own
//    service account, and is Ready (its certificate issued by itself, the
//    webhook's by cert-manager); then the DaemonSet's pod: the init container,
//    then the agent (and the imds variant's redirect) with its own command,
//    args, env, identity and mounts; each pod's token is authorized by the
//    RBAC objects applied for its own account, nothing else (a call they do
//    not allow is a 403, which fails the test); the agent reaches the
//    cluster component by its Service's name (test/support/cluster-dns.ts)
//    with its projected token, and never reads a Secret itself;
// 4. every container is Ready as its readiness probe sees it, the agent
//    first not Ready, with the documented reason, while what the node lacks
//    is missing;
// 5. the agent seeds VMIs of a namespace it serves from their owners'
//    Secrets (one created after the agent reported it missing, so it comes
//    through the agent's watch), records Events, leaves a namespace it does
//    not serve alone; Prometheus's scrape through the Service finds the
//    agent's metrics (and the redirect's); the webhook answers the API
//    server's call.
// Stand-ins, each for what this machine has no cluster part for: launcher
// pods without libvirt (the VMIs wait for KubeVirt to name their launcher
// pod, LAUNCHER_POD_UNKNOWN, so nothing is attached); the libvirt variant's
// host libvirtd is a daemon of the test's on its socket path that answers
// libvirt's handshake and refuses every other call
// (test/support/fake-rpc-daemon.ts); cert-manager, its CA injector, the API
// server's webhook call and Prometheus's scrape are test/support/
// cluster-stand-ins.ts. The redirect's nftables DNAT is real, in the pod's
// network namespace.
import { after, before, test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, readdirSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { request } from 'node:https';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import * as yaml from 'js-yaml';
import { ADMIN_USER, FakeKube } from '../support/fake-kube.ts';
import { resourceType, typeOfKind } from '../support/fake-kube-objects.ts';
import { kubectlVersion, kustomizeText, objectId, writeDocsNamespacedOverlay } from '../support/kustomize.ts';
import { ROOT, type KubeObject } from '../support/manifests.ts';
import { makePodNetns } from '../support/pod-netns.ts';
import {
  imageCompileCache,
  nodeAffinityMatches,
  startDaemonSetPod,
  startDeploymentPod,
  type DaemonSetPod,
  type Node,
} from '../support/kubelet.ts';
import { linkPodNetns } from '../support/pod-link.ts';
import { certManager, callWebhook, scrape } from '../support/cluster-stand-ins.ts';
import { testPki } from '../support/test-pki.ts';
import { vmi } from '../support/agent-harness.ts';
import { fixtureReview, patchOf } from '../support/webhook.ts';
import { handshakeDaemon } from '../support/fake-rpc-daemon.ts';
import { AuthType } from '../../src/libvirt/rpc/protocol.ts';

const run = promisify(execFile);
type Any = any;

const ADMIN_TOKEN = randomBytes(24).toString('base64url');
// The labels each variant's node affinity asks of a node: KubeVirt's
// virt-handler sets kubevirt.io/schedulable; plain libvirt nodes are
// labelled by hand (deploy/libvirt/args-patch.yaml).
const KUBEVIRT_NODE: Node = { name: 'node-a', labels: { 'kubevirt.io/schedulable': 'true' } };
const LIBVIRT_NODE: Node = { name: 'node-a', labels: { 'vmseed.io/libvirt': '' } };
// Where the cluster component runs: a node without VMs (no
// kubevirt.io/schedulable), which its node affinity asks for.
const CLUSTER_NODE: Node = { name: 'node-c', labels: {} };
const CLUSTER_USER = 'system:serviceaccount:vmseed:vmseed-cluster';

interface Variant {
  name: string;
  // The kustomization directory (written on demand for the operator's own).
  dir: () => Promise<string>;
  node: Node;
  // The VM owners' namespaces, there before the install; the test's VMIs
  // are in the first. `unserved`: one the agent must leave alone.
  vmNamespaces: string[];
  unserved?: string;
}

const temp: string[] = [];
async function tempDir(prefix: string): Promise<string> {
  const d = await mkdtemp(join(tmpdir(), prefix));
  temp.push(d);
  return d;
}
after(async () => {
  for (const d of temp) await rm(d, { recursive: true, force: true, maxRetries: 20, retryDelay: 50 });
});

const deploy = (name: string) => () => Promise.resolve(join(ROOT, 'deploy', name));
const VARIANTS: Variant[] = [
  { name: 'kubevirt', dir: deploy('kubevirt'), node: KUBEVIRT_NODE, vmNamespaces: ['default'] },
  { name: 'single-tenant', dir: deploy('single-tenant'), node: KUBEVIRT_NODE, vmNamespaces: ['default'] },
  { name: 'libvirt', dir: deploy('libvirt'), node: LIBVIRT_NODE, vmNamespaces: ['default'] },
  {
    name: 'namespaced',
    dir: deploy('namespaced'),
    node: KUBEVIRT_NODE,
    vmNamespaces: ['team-a', 'team-b', 'team-c'],
    unserved: 'team-c',
  },
  { name: 'imds', dir: deploy('imds'), node: KUBEVIRT_NODE, vmNamespaces: ['default'] },
  { name: 'webhook', dir: deploy('webhook'), node: KUBEVIRT_NODE, vmNamespaces: ['default'] },
  {
    name: 'namespaced + imds + webhook in an overlay of your own',
    dir: async () => {
      const d = await tempDir('vmseed-own-overlay-');
      await writeDocsNamespacedOverlay(d, ['imds', 'webhook']);
      return d;
    },
    node: KUBEVIRT_NODE,
    vmNamespaces: ['vms-prod', 'vms-dev', 'default'],
    unserved: 'default',
  },
];

let compileCache: string;
let monitoring: string;
before(async () => {
  process.stderr.write(`# ${await kubectlVersion()}\n`);
  const rendered = await kustomizeText(join(ROOT, 'manifests', 'monitoring'));
  assert.equal(rendered.stderr, '', 'kubectl kustomize manifests/monitoring printed a warning');
  monitoring = rendered.stdout;
  // The image build's warm-cache runs, whose cache the image ships.
  compileCache = await imageCompileCache();
  temp.push(compileCache);
});

// Each variant rendered once; kustomize's stderr must be empty.
const renders = new Map<string, Promise<{ text: string; objects: KubeObject[] }>>();
function render(variant: Variant): Promise<{ text: string; objects: KubeObject[] }> {
  let r = renders.get(variant.name);
  if (!r) {
    r = (async () => {
      const { stdout, stderr } = await kustomizeText(await variant.dir());
      assert.equal(stderr, '', `kubectl kustomize printed a warning for ${variant.name}`);
      return { text: stdout, objects: (yaml.loadAll(stdout) as KubeObject[]).filter(Boolean) };
    })();
    renders.set(variant.name, r);
  }
  return r;
}

async function kubectl(kubeconfig: string, cacheDir: string, args: string[], input?: string) {
  const p = run('kubectl', ['--kubeconfig', kubeconfig, '--cache-dir', cacheDir, ...args], { timeout: 60_000 });
  if (input !== undefined) p.child.stdin!.end(input);
  try {
    return await p;
  } catch (e) {
    const err = e as Error & { stdout?: string; stderr?: string };
    throw new Error(`kubectl ${args.join(' ')} failed: ${err.stderr ?? err.message}\n${err.stdout ?? ''}`, {
      cause: e,
    });
  }
}

interface Probed {
  status: number;
  body: string;
}

async function get(url: string): Promise<Probed> {
  try {
    const r = await fetch(url, { signal: AbortSignal.timeout(2000) });
    return { status: r.status, body: await r.text() };
  } catch (e) {
    return { status: 0, body: String((e as Error).cause ?? e) };
  }
}

// Polls until `done`; fails at once when a container of the pod exits.
async function until<T>(pod: DaemonSetPod, what: string, done: () => Promise<T | undefined> | T | undefined) {
  const deadline = Date.now() + 60_000;
  const inits = new Set(((pod.spec.initContainers ?? []) as Any[]).map((c) => c.name as string));
  for (;;) {
    for (const [name, c] of pod.containers)
      if (!inits.has(name) && c.exited())
        throw new Error(`container ${name} exited (${c.child.exitCode}) before ${what}\n${pod.logs()}`);
    const v = await done();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}\n${pod.logs()}`);
    await new Promise((r) => setTimeout(r, 100));
  }
}

// A container's readiness probe, until it answers as `want` says.
async function readiness(pod: DaemonSetPod, container: string, want: (r: Probed) => boolean): Promise<Probed> {
  const url = pod.probeUrl(container, 'readinessProbe');
  let last: Probed = { status: 0, body: '' };
  await until(pod, `${container}'s readiness (last: ${url} ${last.status})`, async () => {
    last = await get(url);
    return want(last);
  }).catch((e: Error) => {
    throw new Error(`${e.message}\nlast answer: ${last.status} ${last.body}`);
  });
  return last;
}

// A request with the agent's service-account token, as the agent makes it.
function asAgent(fake: FakeKube, token: string, path: string): Promise<Probed> {
  return new Promise((resolve, reject) => {
    const req = request(
      `${fake.url}${path}`,
      { ca: fake.caCert, headers: { authorization: `Bearer ${token}` }, agent: false },
      (res) => {
        let body = '';
        res.on('data', (c: Buffer) => (body += c.toString()));
        res.on('end', () => resolve({ status: res.statusCode ?? 0, body }));
      },
    );
    req.on('error', reject);
    req.end();
  });
}

// Everything one install needs, torn down in reverse: containers stop
// before the API server closes and the namespace goes.
async function install(t: TestContext, variant: Variant) {
  const steps: Array<() => Promise<unknown>> = [];
  // What stands in for the node's own services, gone after the pod.
  const node: Array<() => Promise<unknown>> = [];
  t.after(async () => {
    for (const step of steps.reverse()) await step();
  });
  const dir = await tempDir('vmseed-operator-');
  const { text, objects: rendered } = await render(variant);

  const netns = await makePodNetns();
  steps.push(() => netns.remove());
  const fake = await FakeKube.start({
    host: netns.hostIP,
    pki: await testPki('operator-path', [netns.hostIP]),
    tokens: [],
    adminTokens: [ADMIN_TOKEN],
    rbac: 'applied',
  });
  steps.push(() => fake.close());
  steps.push(async () => {
    for (const stop of node) await stop();
  });
  for (const name of variant.vmNamespaces)
    if (!fake.objects.namespaceExists(name))
      fake.objects.create(
        resourceType('', 'namespaces')!,
        undefined,
        JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } }),
      );

  const kubeconfig = await fake.writeKubeconfig(dir, ADMIN_TOKEN);
  const cache = join(dir, 'kubectl-cache');
  const applied = await kubectl(
    kubeconfig,
    cache,
    ['apply', '--validate=false', '-f', '-'],
    `${text}---\n${monitoring}`,
  );
  assert.equal(applied.stderr, '', 'kubectl apply printed a warning');
  const lines = applied.stdout.trim().split('\n');
  const all = [...rendered, ...(yaml.loadAll(monitoring) as KubeObject[]).filter(Boolean)];
  assert.equal(lines.length, all.length, applied.stdout);
  assert.ok(
    lines.every((l) => l.endsWith(' created')),
    applied.stdout,
  );
  for (const o of all) {
    // ConfigMaps (the monitoring kustomization's dashboard) go where the
    // agent's reads find them.
    if (o.kind === 'ConfigMap') {
      assert.ok(fake.getConfigMap(o.metadata.namespace!, o.metadata.name), `stored: ${objectId(o)}`);
      continue;
    }
    const type = typeOfKind(o.apiVersion, o.kind);
    assert.ok(type && fake.objects.get(type, o.metadata.namespace, o.metadata.name), `stored: ${objectId(o)}`);
  }
  const key = randomBytes(32).toString('base64');
  const secret = await kubectl(kubeconfig, cache, [
    ...['-n', 'vmseed', 'create', 'secret', 'generic', 'vmseed-datasource-key'],
    `--from-literal=keys=${key}`,
  ]);
  assert.equal(secret.stdout.trim(), 'secret/vmseed-datasource-key created');

  const stopped = (p: DaemonSetPod) => async () => {
    const codes = await p.stop();
    for (const [name, code] of Object.entries(codes)) assert.equal(code, 0, `${name}'s exit code\n${p.logs()}`);
  };

  // The cluster component first, Ready before any agent asks it.
  const deployment = fake.objects.get(resourceType('apps', 'deployments')!, 'vmseed', 'vmseed-cluster');
  let cluster: DaemonSetPod | undefined;
  if (deployment) {
    const spec = (deployment as Any).spec.template.spec;
    assert.equal(nodeAffinityMatches(spec, KUBEVIRT_NODE.labels), false, 'the cluster component stays off VM nodes');
    assert.equal(nodeAffinityMatches(spec, CLUSTER_NODE.labels), true, 'the cluster component runs on node-c');
    await assert.rejects(
      startDeploymentPod(fake, deployment, { node: KUBEVIRT_NODE, netns, dir: join(dir, 'refused') }),
      /no pod on node node-a/,
    );
    const clusterNetns = await makePodNetns();
    steps.push(() => clusterNetns.remove());
    await linkPodNetns(netns, clusterNetns);
    cluster = await startDeploymentPod(fake, deployment, {
      node: CLUSTER_NODE,
      netns: clusterNetns,
      dir: join(dir, 'cluster-pod'),
      compileCache,
    });
    steps.push(stopped(cluster));
    const webhook = ((cluster.spec.containers[0].args ?? []) as string[]).some(
      (a) => a.startsWith('--webhook-listen=') && a !== '--webhook-listen=off',
    );
    // Not Ready until cert-manager has issued the webhook's certificate.
    if (webhook) {
      await readiness(cluster, 'cluster', (r) => r.status === 503 && /webhook certificate missing/.test(r.body));
      await certManager(fake);
      await cluster.syncSecretVolumes();
    }
    for (const c of cluster.spec.containers as Any[])
      if (c.readinessProbe) await readiness(cluster, c.name, (r) => r.status === 200);
    assert.ok(fake.getConfigMap('vmseed', 'vmseed-cluster-ca'), 'the cluster component published its CA');
  }

  const ds = fake.objects.get(resourceType('apps', 'daemonsets')!, 'vmseed', 'vmseed');
  assert.ok(ds, 'the DaemonSet vmseed/vmseed');
  const pod = await startDaemonSetPod(fake, ds, {
    node: variant.node,
    netns,
    dir: join(dir, 'agent-pod'),
    compileCache,
  });
  steps.push(stopped(pod));
  return { fake, pod, cluster, node };
}

for (const variant of VARIANTS) {
  test(
    `operator path, ${variant.name}: rendered, applied with kubectl, its pod Ready, VMIs seeded through the applied RBAC`,
    { timeout: 180_000 },
    async (t) => {
      const started = Date.now();
      const { fake, pod, cluster, node } = await install(t, variant);
      assert.equal(cluster === undefined, variant.name === 'single-tenant', 'a cluster component unless single-tenant');
      const webhook = fake.objects.all().some((o) => o.kind === 'MutatingWebhookConfiguration');
      const libvirtDir = pod.hostPaths['/var/run/libvirt'];

      // Not Ready until what the node lacks is there, saying what it is.
      if (libvirtDir !== undefined) {
        await readiness(pod, 'agent', (r) => r.status === 503 && /libvirt socket/.test(r.body)).then((r) =>
          assert.match(
            r.body,
            /libvirt socket (\/var)?\/run\/libvirt\/libvirt-sock \(for qemu:\/\/\/system\) does not exist: libvirtd/,
          ),
        );
        const libvirtd = await handshakeDaemon([AuthType.NONE], undefined, join(libvirtDir, 'libvirt-sock'));
        node.push(() => libvirtd.close());
      }
      for (const c of pod.spec.containers as Any[])
        if (c.readinessProbe) await readiness(pod, c.name, (r) => r.status === 200);
      const readyAt = Date.now() - started;

      // vm1's cloud-init from its owner's Secret; vm2's Secret is created
      // only after the agent reported it missing, and reaches the agent
      // through its watch of that name.
      const ns = variant.vmNamespaces[0];
      const userdata = (name: string) => ({
        metadata: { name: `${name}-userdata`, namespace: ns },
        stringData: { userdata: `#cloud-config\nhostname: ${name}\n` },
      });
      fake.setSecret(userdata('vm1'));
      const [vm1, vm2] = ['vm1', 'vm2'].map((name) =>
        fake.applyVmi(vmi(name, { namespace: ns, cloudInit: `secretRef: {name: ${name}-userdata}\n` })),
      );
      if (variant.unserved) fake.applyVmi(vmi('vm1', { namespace: variant.unserved }));
      const seeds = pod.hostPaths['/var/lib/vmseed/seeds'];
      const image = (v: typeof vm1) => () => {
        const d = join(seeds, ns, `${v.metadata.name}_${v.metadata.uid}`);
        return existsSync(d) && readdirSync(d).some((n) => /^nocloud-[0-9a-f]{16}\.iso$/.test(n));
      };
      await until(pod, "vm1's image in the node's seed directory", image(vm1));
      await until(pod, 'SeedFailed on vm2, its Secret missing', () =>
        fake.events().some((e) => e.involvedObject.uid === vm2.metadata.uid && e.reason === 'SeedFailed'),
      );
      fake.setSecret(userdata('vm2'));
      await until(pod, "vm2's image once its Secret is there", image(vm2));

      const calls = fake.requests.filter((r) => r.user !== ADMIN_USER);
      assert.deepEqual(
        calls
          .filter((r) => r.status === 401 || r.status === 403)
          .map((r) => `${r.user} ${r.method} ${r.path} ${r.status}`),
        [],
        'the applied RBAC allows every call the agent and the cluster component made',
      );
      const madeBy = (user: string) =>
        new Set(calls.filter((r) => r.user === user && r.status < 400).map((r) => `${r.resource}:${r.verb}`));
      const made = madeBy(fake.user);
      const reads = ['secrets:get', 'secrets:watch'];
      for (const c of ['virtualmachineinstances:list', 'virtualmachineinstances:watch', 'events:create'])
        assert.ok(made.has(c), `the agent made ${c} (${[...made].join(', ')})`);
      if (cluster) {
        // The Secrets through the cluster component, with its credential.
        assert.deepEqual(
          calls
            .filter((r) => r.user === fake.user && r.resource === 'secrets' && r.status === 200)
            .map((r) => `${r.method} ${r.path}`),
          [],
          "no Secret read with the agent's credential",
        );
        const byCluster = madeBy(CLUSTER_USER);
        for (const c of reads)
          assert.ok(byCluster.has(c), `the cluster component made ${c} (${[...byCluster].join(', ')})`);
      } else for (const c of reads) assert.ok(made.has(c), `the agent made ${c} (${[...made].join(', ')})`);
      if (variant.unserved) {
        assert.equal(existsSync(join(seeds, variant.unserved)), false, `nothing seeded in ${variant.unserved}`);
        assert.deepEqual(
          calls
            .filter((r) => r.user === fake.user)
            .filter((r) => r.namespace === variant.unserved || r.namespace === undefined)
            .map((r) => r.path),
          [],
          `no call of the agent outside the served namespaces`,
        );
      }

      const metrics = await scrape(fake, pod);
      assert.match(metrics.get('http-metrics') ?? '', /^vmseed_build_info\{/m);
      if (pod.containers.has('redirect'))
        assert.match(metrics.get('redirect-metrics') ?? '', /^vmseed_redirect_in_place 1$/m);
      if (webhook) {
        assert.ok(cluster, 'the webhook is served by the cluster component');
        const answer = await callWebhook(fake, cluster, await fixtureReview('vmi-direct'));
        assert.equal(answer.status, 200);
        assert.equal(answer.response.allowed, true);
        assert.ok(patchOf({ status: 200, body: '', json: answer })?.length, 'the webhook patched the VMI');
      }
      process.stderr.write(`# ${variant.name}: Ready after ${readyAt} ms, done after ${Date.now() - started} ms\n`);
    },
  );
}

// What makes the tests above fail on a call the manifests do not grant: the
// fake API server authorizes the agent's token with the RBAC objects
// applied to it, the way the API server's RBAC authorizer does, and answers
// anything else with its Forbidden Status.
test('the agent is authorized by the RBAC objects applied, nothing else', async (t) => {
  const token = randomBytes(24).toString('base64url');
  const fake = await FakeKube.start({ tokens: [token], adminTokens: [ADMIN_TOKEN], rbac: 'applied' });
  t.after(() => fake.close());
  const vmis = (ns?: string) =>
    `/apis/kubevirt.io/v1${ns ? `/namespaces/${ns}` : ''}/virtualmachineinstances?labelSelector=kubevirt.io%2FnodeName%3Dnode-a`;
  const before = await asAgent(fake, token, vmis());
  assert.equal(before.status, 403);
  assert.equal(
    JSON.parse(before.body).message,
    'virtualmachineinstances.kubevirt.io is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot list resource "virtualmachineinstances" in API group "kubevirt.io" at the cluster scope',
  );
  const namespaced = VARIANTS.find((v) => v.name === 'namespaced')!;
  for (const name of namespaced.vmNamespaces)
    fake.objects.create(
      resourceType('', 'namespaces')!,
      undefined,
      JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name } }),
    );
  for (const o of (await render(namespaced)).objects) {
    const created = fake.objects.create(typeOfKind(o.apiVersion, o.kind)!, o.metadata.namespace, JSON.stringify(o));
    assert.equal(created.code, 201, JSON.stringify(created.body));
  }
  assert.equal((await asAgent(fake, token, vmis('team-a'))).status, 200, 'granted by the RoleBinding in team-a');
  assert.equal((await asAgent(fake, token, vmis())).status, 403, 'no cluster-wide grant');
  assert.equal((await asAgent(fake, token, vmis('team-c'))).status, 403, 'no RoleBinding in team-c');
  assert.equal(
    (await asAgent(fake, token, '/api/v1/namespaces/team-a/pods/virt-launcher-x')).status,
    403,
    "pods: list and watch (the node's launchers), no get",
  );
  assert.equal(
    (await asAgent(fake, token, '/api/v1/namespaces/team-a/services')).status,
    403,
    'services are not granted',
  );
  assert.equal(
    (await asAgent(fake, token, '/api/v1/namespaces/team-a/secrets')).status,
    403,
    'Secrets: get and watch, no list',
  );
});
