// The deployment variants in deploy/ and the components they combine,
// rendered by the real `kubectl kustomize`. Each test reads the rendered
// objects, as `kubectl apply -k deploy/<variant>` would send them.
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { cp, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, relative } from 'node:path';
import { ROOT, findObject, loadYamlDocuments, validateBuiltin, type KubeObject } from '../support/manifests.ts';
import {
  COMBINABLE,
  COMPONENTS,
  OVERLAYS,
  kubectlVersion,
  kustomize,
  kustomizeText,
  objectId,
  writeDocsNamespacedOverlay,
  type Overlay,
} from '../support/kustomize.ts';

type Any = any;

const rendered = new Map<Overlay | 'base', KubeObject[]>();
// The base as `kubectl apply -f` reads its files: the node agents, the
// cluster component, the admission policy.
const base = ['daemonset.yaml', 'cluster.yaml', 'admission-policy.yaml'].flatMap((f) =>
  loadYamlDocuments(`manifests/${f}`),
);
// Bound to the node agent's ServiceAccount (not the cluster component's).
const AGENT_SA = { kind: 'ServiceAccount', name: 'vmseed', namespace: 'vmseed' };
const bindsAgent = (o: KubeObject): boolean =>
  ((o as Any).subjects ?? []).some((s: Any) => s.kind === AGENT_SA.kind && s.name === AGENT_SA.name);
const baseAgent = agentOf(base);

before(async () => {
  process.stderr.write(`# ${await kubectlVersion()}\n`);
  rendered.set('base', await kustomize(join(ROOT, 'manifests')));
  for (const o of OVERLAYS) rendered.set(o, await kustomize(join(ROOT, 'deploy', o)));
});

function daemonSetOf(objects: KubeObject[]): Any {
  return findObject(objects, 'DaemonSet', 'vmseed');
}
function agentOf(objects: KubeObject[]): Any {
  return daemonSetOf(objects).spec.template.spec.containers.find((c: Any) => c.name === 'agent');
}
function byId(objects: KubeObject[]): Map<string, KubeObject> {
  return new Map(objects.map((o) => [objectId(o), o]));
}
// Objects of `a` that differ from, or are missing in, `b`.
function changed(a: KubeObject[], b: KubeObject[]): string[] {
  const other = byId(b);
  return a
    .filter((o) => !isDeepStrictEqual(o, other.get(objectId(o))))
    .map(objectId)
    .sort();
}
function isDeepStrictEqual(x: unknown, y: unknown): boolean {
  try {
    assert.deepStrictEqual(x, y);
    return true;
  } catch {
    return false;
  }
}

test('every variant renders with kubectl kustomize into objects valid against the Kubernetes schema', async () => {
  for (const [name, objects] of rendered) {
    assert.ok(objects.length >= 7, name);
    for (const o of objects) await assert.doesNotReject(validateBuiltin(o), `${name}: ${objectId(o)}`);
    assert.equal(new Set(objects.map(objectId)).size, objects.length, `${name}: no object twice`);
  }
});

test('the base and the kubevirt variant are the files of manifests/ as `kubectl apply -f` reads them', () => {
  // kustomize parses YAML as kubectl does (YAML 1.1): any value that a YAML
  // 1.2 reader takes differently (a leading-zero octal mode) shows up here.
  for (const name of ['base', 'kubevirt'] as const) {
    const objects = rendered.get(name)!;
    assert.deepEqual(objects.map(objectId).sort(), base.map(objectId).sort(), name);
    assert.deepEqual(changed(objects, base), [], name);
  }
});

test('kubevirt: uid 107, gid 107, supplementary group 0, no capability, the kubelet pod tree at /pods', () => {
  const pod = daemonSetOf(rendered.get('kubevirt')!).spec.template.spec;
  assert.deepEqual(pod.securityContext, {
    runAsUser: 107,
    runAsGroup: 107,
    supplementalGroups: [0],
    runAsNonRoot: true,
    seccompProfile: { type: 'RuntimeDefault' },
  });
  const agent = agentOf(rendered.get('kubevirt')!);
  assert.deepEqual(agent.securityContext, {
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ['ALL'] },
  });
  assert.deepEqual(agent.args.slice(0, 2), ['--platform=kubevirt', '--pods-dir=/pods']);
  const mount = agent.volumeMounts.find((m: Any) => m.mountPath === '/pods');
  assert.deepEqual(pod.volumes.find((v: Any) => v.name === mount.name).hostPath, {
    path: '/var/lib/kubelet/pods',
    type: 'Directory',
  });
  assert.equal(mount.mountPropagation, 'HostToContainer');
  assert.ok(agent.args.includes('--status-listen=127.0.0.1:8090'));
  assert.ok(!agent.args.some((a: string) => a.startsWith('--namespaces')), 'cluster-wide');
});

test('libvirt: --platform=libvirt, the host libvirt socket directory instead of /pods, root without capabilities', () => {
  const objects = rendered.get('libvirt')!;
  assert.deepEqual(changed(objects, base), ['DaemonSet/vmseed/vmseed'], 'only the DaemonSet differs');
  const ds = daemonSetOf(objects);
  const pod = ds.spec.template.spec;
  const agent = agentOf(objects);
  // The args are the base's with exactly these substitutions.
  const expected = baseAgent.args
    .filter((a: string) => !a.startsWith('--pods-dir='))
    .map((a: string) =>
      a === '--platform=kubevirt'
        ? '--platform=libvirt'
        : a === '--kubevirt-volumes=ignore'
          ? '--kubevirt-volumes=own'
          : a,
    )
    .concat('--resume-via=virsh');
  assert.deepEqual(agent.args, expected);
  // A system-mode libvirtd's socket is root's (0700, or 0770 root:libvirt).
  assert.deepEqual(pod.securityContext, {
    runAsUser: 0,
    runAsGroup: 0,
    runAsNonRoot: false,
    seccompProfile: { type: 'RuntimeDefault' },
  });
  assert.deepEqual(agent.securityContext, baseAgent.securityContext, 'still drop ALL, no escalation, read-only root');
  // Mounts: the base's, less /pods, plus the socket directory read-only.
  const mounts = (c: Any) =>
    c.volumeMounts.map((m: Any) => `${m.name}:${m.mountPath}:${m.readOnly === true ? 'ro' : 'rw'}`).sort();
  assert.deepEqual(
    mounts(agent),
    [...mounts(baseAgent).filter((m: string) => !m.includes(':/pods:')), 'libvirt-run:/var/run/libvirt:ro'].sort(),
  );
  assert.equal(
    pod.volumes.some((v: Any) => v.hostPath?.path === '/var/lib/kubelet/pods'),
    false,
  );
  assert.deepEqual(pod.volumes.find((v: Any) => v.name === 'libvirt-run').hostPath, {
    path: '/var/run/libvirt',
    type: 'Directory',
  });
  // QEMU on the host opens the image where the agent wrote it: the state
  // directory is mounted at its host path.
  const seeds = pod.volumes.find((v: Any) => v.name === 'seeds');
  assert.equal(agent.volumeMounts.find((m: Any) => m.name === 'seeds').mountPath, seeds.hostPath.path);
  assert.ok(agent.args.includes(`--state-dir=${seeds.hostPath.path}`));
  // Root without CAP_DAC_OVERRIDE writes only into its own directories.
  const init = pod.initContainers.find((c: Any) => c.name === 'state-dir-owner');
  assert.deepEqual(init.command, ['chown', '-R', '0:0', seeds.hostPath.path, '/etc/vmseed/datasource']);
  assert.deepEqual(init.securityContext.capabilities, { drop: ['ALL'], add: ['CHOWN'] });
  const term = pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms;
  assert.deepEqual(term, [{ matchExpressions: [{ key: 'vmseed.io/libvirt', operator: 'Exists' }] }]);
});

test('namespaced: --namespaces and one RoleBinding per listed namespace; the ClusterRole is bound nowhere cluster-wide', () => {
  const objects = rendered.get('namespaced')!;
  const agent = agentOf(objects);
  assert.deepEqual(agent.args.slice(0, -1), baseAgent.args);
  const flag = agent.args.at(-1) as string;
  assert.match(flag, /^--namespaces=[a-z0-9-]+(,[a-z0-9-]+)*$/);
  const namespaces = flag.slice('--namespaces='.length).split(',');
  assert.ok(namespaces.length >= 2, 'the example lists more than one');
  assert.deepEqual(
    daemonSetOf(objects).spec.template.spec.securityContext,
    daemonSetOf(base).spec.template.spec.securityContext,
  );

  const account = findObject(objects, 'ServiceAccount', 'vmseed');
  const subject = { kind: 'ServiceAccount', name: account.metadata.name, namespace: account.metadata.namespace };
  const bindings = objects.filter((o) => o.kind === 'RoleBinding' && bindsAgent(o)) as Any[];
  assert.deepEqual(
    bindings.map((b) => b.metadata.namespace).sort(),
    [...namespaces].sort(),
    'the RoleBindings and --namespaces agree',
  );
  for (const b of bindings) {
    assert.deepEqual(b.subjects, [subject]);
    assert.deepEqual(b.roleRef, { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'vmseed-agent' });
  }
  assert.equal(
    objects.filter((o) => o.kind === 'ClusterRoleBinding' && bindsAgent(o)).length,
    0,
    'no cluster-wide binding of the agent: the base one is deleted',
  );
  assert.deepEqual(
    findObject(objects, 'ClusterRole', 'vmseed-agent'),
    findObject(base, 'ClusterRole', 'vmseed-agent'),
    'the same rules',
  );
  assert.deepEqual(
    changed(objects, base),
    ['DaemonSet/vmseed/vmseed', ...namespaces.map((ns) => `RoleBinding/${ns}/vmseed-agent`)].sort(),
  );
});

test('every variant ships the same NetworkPolicy, and nothing in deploy/ points into hotplug-disks', async () => {
  const policy = findObject(base, 'NetworkPolicy', 'vmseed-agent');
  for (const o of OVERLAYS) {
    assert.deepEqual(findObject(rendered.get(o)!, 'NetworkPolicy', 'vmseed-agent'), policy, o);
    assert.doesNotMatch(JSON.stringify(rendered.get(o)), /hotplug-disks/, o);
  }
});

// The overlays patch the base's args by position; their JSON-patch "test"
// ops must make a reordered base fail to build instead of patching the wrong
// flag. Build a copy whose first two args are swapped.
test('a base whose flags moved fails to build (the overlays never patch the wrong flag)', async () => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-kustomize-'));
  try {
    await cp(join(ROOT, 'manifests'), join(dir, 'manifests'), { recursive: true });
    await cp(join(ROOT, 'deploy'), join(dir, 'deploy'), { recursive: true });
    const file = join(dir, 'manifests', 'daemonset.yaml');
    const text = await readFile(file, 'utf8');
    const swapped = text
      .replace('- --platform=kubevirt\n', '- --PLACEHOLDER\n')
      .replace('- --pods-dir=/pods\n', '- --platform=kubevirt\n')
      .replace('- --PLACEHOLDER\n', '- --pods-dir=/pods\n');
    assert.notEqual(swapped, text);
    await writeFile(file, swapped);
    // The copy itself is sound: the unpatched variant still builds.
    await kustomize(join(dir, 'deploy', 'kubevirt'));
    await assert.rejects(kustomize(join(dir, 'deploy', 'libvirt')), /kustomize .*libvirt failed/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

// The contract with src/config/config.ts, per variant: the rendered args and
// environment load as they are.
test("the agent's config parser accepts every variant's args and environment", async () => {
  const { loadConfig } = await import('../../src/config/config.ts');
  const load = (objects: KubeObject[]) => {
    const agent = agentOf(objects);
    const env: NodeJS.ProcessEnv = {};
    for (const e of agent.env) env[e.name] = e.valueFrom ? 'node-a' : e.value;
    return loadConfig(agent.args, env, '/')!;
  };
  const kubevirt = load(rendered.get('kubevirt')!);
  assert.deepEqual(
    [kubevirt.libvirt.platform, kubevirt.kubevirtVolumes, kubevirt.libvirt.resumeVia, kubevirt.libvirt.podsDir],
    ['kubevirt', 'ignore', 'kubevirt', '/pods'],
  );
  assert.equal(kubevirt.namespaces, undefined);
  const libvirt = load(rendered.get('libvirt')!);
  assert.deepEqual(
    [libvirt.libvirt.platform, libvirt.kubevirtVolumes, libvirt.libvirt.resumeVia, libvirt.mode],
    ['libvirt', 'own', 'virsh', 'kubernetes'],
  );
  const single = load(rendered.get('single-tenant')!);
  assert.equal(single.objects, undefined, 'single-tenant: the agent reads the API server itself');
  assert.equal(kubevirt.objects?.url, 'https://vmseed-cluster.vmseed.svc:8444');
  const namespaced = load(rendered.get('namespaced')!);
  const bound = rendered
    .get('namespaced')!
    .filter((o) => o.kind === 'RoleBinding' && bindsAgent(o))
    .map((o) => o.metadata.namespace!);
  assert.deepEqual([...namespaced.namespaces!].sort(), bound.sort());
});

test('every directory in deploy/ is a variant tested here (or beside) and documented in docs/operations.md', async () => {
  const { readdir, readFile: read } = await import('node:fs/promises');
  const dirs = (await readdir(join(ROOT, 'deploy'), { withFileTypes: true }))
    .filter((d) => d.isDirectory())
    .map((d) => d.name);
  // deploy/webhook holds cert-manager kinds; test/deploy/webhook-overlay.test.ts renders it.
  assert.deepEqual(dirs.sort(), [...OVERLAYS, 'components', 'webhook'].sort());
  const components = (await readdir(join(ROOT, 'deploy', 'components'), { withFileTypes: true }))
    .filter((d) => d.isDirectory())
    .map((d) => d.name);
  assert.deepEqual(components.sort(), [...COMPONENTS].sort());
  const docs = await read(join(ROOT, 'docs', 'operations.md'), 'utf8');
  const section = docs.slice(
    docs.indexOf('\n## Deployment variants\n'),
    docs.indexOf('\n### ', docs.indexOf('\n## Deployment variants\n')),
  );
  const rows = [...section.matchAll(/^\| `deploy\/([a-z-]+)` \|/gm)].map((m) => m[1]);
  assert.deepEqual(rows.sort(), [...OVERLAYS, 'webhook'].sort());
  for (const c of components) assert.match(section, new RegExp(`\`deploy/components/${c}\``), `component ${c}`);
});

// kustomize prints deprecation warnings on stderr (and kubectl apply -k
// shows them): none for any variant, nor for the components combined.
test('kubectl kustomize prints no warning for any variant or for all components combined', async (t) => {
  for (const o of OVERLAYS) {
    const { stderr } = await kustomizeText(join(ROOT, 'deploy', o));
    assert.equal(stderr, '', o);
  }
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-components-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeFile(
    join(dir, 'kustomization.yaml'),
    [
      'apiVersion: kustomize.config.k8s.io/v1beta1',
      'kind: Kustomization',
      'resources:',
      `  - ${relative(dir, join(ROOT, 'deploy', 'kubevirt'))}`,
      'components:',
      ...COMBINABLE.map((c) => `  - ${relative(dir, join(ROOT, 'deploy', 'components', c))}`),
      '',
    ].join('\n'),
  );
  const { stdout, stderr } = await kustomizeText(dir);
  assert.equal(stderr, '');
  const objects = (await import('js-yaml')).loadAll(stdout) as KubeObject[];
  const pod = daemonSetOf(objects).spec.template.spec;
  // Each component's change is there: host network and the redirect
  // container (imds), no cluster-wide binding (namespaced), the admission
  // webhook (webhook).
  assert.equal(pod.hostNetwork, true);
  assert.ok(pod.containers.some((c: Any) => c.name === 'redirect'));
  assert.equal(objects.filter((o) => o.kind === 'ClusterRoleBinding' && bindsAgent(o)).length, 0);
  assert.ok(objects.some((o) => o.kind === 'MutatingWebhookConfiguration'));
  // cert-manager's kinds are not Kubernetes' own (webhook-overlay.test.ts
  // checks them).
  for (const o of objects.filter((o) => !o.apiVersion.startsWith('cert-manager.io/')))
    await assert.doesNotReject(validateBuiltin(o), objectId(o));
});

// docs/operations.md shows the overlay an operator writes for their own
// namespaces; rendered as written, with nothing in the repository edited.
test("namespaced RBAC for the operator's own namespaces: the overlay in the docs renders and agrees with itself", async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-namespaced-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await writeDocsNamespacedOverlay(dir);
  const { stdout, stderr } = await kustomizeText(dir);
  assert.equal(stderr, '');
  const objects = (await import('js-yaml')).loadAll(stdout) as KubeObject[];
  const { loadConfig } = await import('../../src/config/config.ts');
  const agent = agentOf(objects);
  const config = loadConfig(agent.args, { NODE_NAME: 'node-a' }, '/')!;
  const bound = objects.filter((o) => o.kind === 'RoleBinding' && bindsAgent(o)).map((o) => o.metadata.namespace!);
  assert.ok(bound.length >= 1);
  assert.deepEqual([...config.namespaces!].sort(), bound.sort());
  assert.equal(objects.filter((o) => o.kind === 'ClusterRoleBinding' && bindsAgent(o)).length, 0);
});

// A VM node holds only what its own VMs need: in every variant but the
// single-tenant one, the node agent's account has no rule on Secrets or
// ConfigMaps and no unpause, the cluster component is there to serve them,
// and the admission policy keeps the agent's VMI writes to its own node.
test('every split variant: no Secret, ConfigMap or unpause rule for the node agent; the cluster component and the admission policy present', async () => {
  const { rulesOfServiceAccount } = await import('../support/rbac.ts');
  for (const o of OVERLAYS) {
    const objects = rendered.get(o)!;
    const rules = rulesOfServiceAccount(objects, { namespace: 'vmseed', name: 'vmseed' }).flatMap((s) => s.rules);
    const reaches = (resource: string) =>
      rules.some((r) =>
        (r.resources ?? []).some((x) => x === resource || x === '*' || x === `${resource.split('/')[0]}/*`),
      );
    const split = o !== 'single-tenant';
    for (const resource of ['secrets', 'configmaps', 'virtualmachineinstances/unpause'])
      assert.equal(reaches(resource), !split, `${o}: ${resource}`);
    assert.equal(
      objects.some((x) => x.kind === 'Deployment' && x.metadata.name === 'vmseed-cluster'),
      split,
      o,
    );
    assert.ok(
      objects.some((x) => x.kind === 'ValidatingAdmissionPolicy'),
      `${o}: the admission policy`,
    );
    const args: string[] = agentOf(objects).args;
    assert.equal(
      args.some((a) => a.startsWith('--objects-url=')),
      split,
      `${o}: --objects-url`,
    );
  }
});
