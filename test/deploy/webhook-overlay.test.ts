// deploy/webhook rendered by the real `kubectl kustomize`, without a warning:
// the base unchanged plus the cluster component's Deployment (off the VM
// nodes), the webhook's Service, MutatingWebhookConfiguration and
// cert-manager objects, whose names, ports and paths all meet: the flags
// load into `vmseed cluster`'s config, the Service selects the cluster
// component (never an agent) and reaches the port it listens on, the
// configuration calls the path it serves, the Secret cert-manager writes is
// the one mounted where it reads it.
// The component also combines with another variant (deploy/imds).
import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { cp, mkdir, mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { isDeepStrictEqual } from 'node:util';
import * as yaml from 'js-yaml';
import { ROOT, findObject, loadYamlDocuments, validateBuiltin, type KubeObject } from '../support/manifests.ts';
import { objectId } from '../support/kustomize.ts';
import { loadConfig } from '../../src/config/config.ts';
import { loadClusterConfig } from '../../src/config/cluster-config.ts';
import { ADOPT_PATH, WEBHOOK_PATH } from '../../src/cluster/webhook/webhook-server.ts';
import { ADOPT_ANNOTATION, ADOPT_NAMESPACE_LABEL } from '../../src/cluster/webhook/adopt.ts';
import { ADOPTED_ANNOTATION } from '../../src/cloudinit/kubevirt/adopted.ts';
import { evaluate, toCel } from '../support/admission-policy-eval.ts';
import { ANNOTATION } from '../../src/cloudinit/annotation/annotation.ts';
import { IMDS_ENABLED } from '../../src/cloudinit/annotation/imds-annotations.ts';
import { testPki } from '../support/test-pki.ts';

type Any = any;
const run = promisify(execFile);

async function render(dir: string): Promise<{ objects: KubeObject[]; stderr: string }> {
  const { stdout, stderr } = await run('kubectl', ['kustomize', dir], { maxBuffer: 16 * 1024 * 1024, timeout: 60_000 });
  return { objects: yaml.loadAll(stdout).filter((d) => d != null) as KubeObject[], stderr };
}

let objects: KubeObject[];
let stderr: string;
const base = ['daemonset.yaml', 'cluster.yaml', 'admission-policy.yaml'].flatMap((f) =>
  loadYamlDocuments(`manifests/${f}`),
);
const podOf = (o: KubeObject[]): Any => (findObject(o, 'DaemonSet', 'vmseed') as Any).spec.template.spec;
const agentOf = (o: KubeObject[]): Any => podOf(o).containers.find((c: Any) => c.name === 'agent');
const clusterOf = (o: KubeObject[]): Any =>
  (findObject(o, 'Deployment', 'vmseed-cluster') as Any).spec.template.spec.containers.find(
    (c: Any) => c.name === 'cluster',
  );

before(async () => {
  ({ objects, stderr } = await render(join(ROOT, 'deploy', 'webhook')));
});

test("renders without a warning; the base objects are unchanged but the cluster component's Deployment and NetworkPolicy, which the webhook joins", async () => {
  assert.equal(stderr.trim(), '', 'kubectl kustomize printed nothing on stderr (no deprecated field)');
  const ids = objects.map(objectId).sort();
  const added = ids.filter((id) => !base.some((b) => objectId(b) === id));
  assert.deepEqual(added, [
    'Certificate/vmseed/vmseed-webhook',
    'Issuer/vmseed/vmseed-webhook-selfsigned',
    'MutatingWebhookConfiguration//vmseed',
    'Service/vmseed/vmseed-webhook',
  ]);
  const changed = objects
    .filter((o) => base.some((b) => objectId(b) === objectId(o)))
    .filter(
      (o) =>
        !isDeepStrictEqual(
          o,
          base.find((b) => objectId(b) === objectId(o)),
        ),
    )
    .map(objectId)
    .sort();
  assert.deepEqual(
    changed,
    ['Deployment/vmseed/vmseed-cluster', 'NetworkPolicy/vmseed/vmseed-cluster'],
    'the DaemonSet and the agent NetworkPolicy are as in the base',
  );
  for (const o of objects.filter((x) => !x.apiVersion.startsWith('cert-manager.io/'))) await validateBuiltin(o);
});

test('the DaemonSet has no webhook args, port, volume or mount; the agent flags load', () => {
  const agent = agentOf(objects);
  assert.ok(!(agent.args as string[]).some((a) => a.startsWith('--webhook-')), (agent.args as string[]).join(' '));
  assert.ok(!agent.ports.some((p: Any) => p.name === 'webhook' || p.containerPort === 8443));
  assert.ok(!agent.volumeMounts.some((m: Any) => m.name === 'webhook-tls' || m.mountPath.includes('webhook')));
  assert.ok(!podOf(objects).volumes.some((v: Any) => v.secret?.secretName === 'vmseed-webhook-tls'));
  assert.ok(loadConfig(agent.args as string[], { NODE_NAME: 'node-a' }, '/'));
  const policy = findObject(objects, 'NetworkPolicy', 'vmseed-agent') as Any;
  assert.ok(!policy.spec.ingress.some((r: Any) => r.ports?.some((p: Any) => p.port === 8443)));
});

test('the cluster component: its flags load; the Service selects it and not the DaemonSet; listener, Service, configuration, Secret and mount all meet', () => {
  const deployment = findObject(objects, 'Deployment', 'vmseed-cluster') as Any;
  const pod = deployment.spec.template.spec;
  const container = clusterOf(objects);
  assert.deepEqual(container.command, ['tini', '--', 'vmseed', 'cluster']);
  const podIp = container.env.find((e: Any) => e.name === 'POD_IP');
  assert.equal(podIp.valueFrom.fieldRef.fieldPath, 'status.podIP', 'the listener is pinned to the pod address');
  assert.ok((container.args as string[]).includes('--webhook-listen=$(POD_IP):8443'));
  const config = loadClusterConfig(
    (container.args as string[]).map((a) => a.replaceAll('$(POD_IP)', '10.244.1.7')),
    {},
    '/',
  )!;
  assert.deepEqual(config.webhook, {
    listen: { host: '10.244.1.7', port: 8443 },
    certDir: '/etc/vmseed/webhook-tls',
    serial: 'nocloud-net',
  });
  const port = container.ports.find((p: Any) => p.name === 'webhook');
  assert.equal(port.containerPort, config.webhook.listen.port);
  const probePort = container.ports.find((p: Any) => p.name === 'http-metrics');
  assert.equal(probePort.containerPort, config.probeListen.port);
  assert.equal(container.readinessProbe.httpGet.path, '/readyz');
  assert.equal(container.livenessProbe.httpGet.path, '/healthz');
  const mount = container.volumeMounts.find((m: Any) => m.mountPath === config.webhook.certDir);
  assert.equal(mount.readOnly, true);
  const volume = pod.volumes.find((v: Any) => v.name === mount.name);
  const certificate = findObject(objects, 'Certificate', 'vmseed-webhook') as Any;
  assert.equal(volume.secret.secretName, certificate.spec.secretName);
  assert.equal(volume.secret.optional, true, 'the pod starts before the certificate is issued');
  assert.deepEqual(
    volume.secret.items.map((i: Any) => i.path),
    ['tls.crt', 'tls.key'],
  );
  // The webhook holds no key: its serials carry random tokens.
  assert.ok(!(container.args as string[]).some((a) => a.includes('datasource-key')));
  assert.ok(!pod.volumes.some((v: Any) => v.secret?.secretName === 'vmseed-datasource-key'), 'no datasource key');

  const service = findObject(objects, 'Service', 'vmseed-webhook') as Any;
  assert.equal(service.spec.ports[0].targetPort, 'webhook');
  assert.deepEqual(service.spec.selector, deployment.spec.selector.matchLabels);
  assert.deepEqual(deployment.spec.template.metadata.labels, deployment.spec.selector.matchLabels);
  const daemonSet = findObject(objects, 'DaemonSet', 'vmseed') as Any;
  const selects = (labels: Record<string, string>) =>
    Object.entries(service.spec.selector).every(([k, v]) => labels[k] === v);
  assert.equal(selects(daemonSet.spec.template.metadata.labels), false, 'the Service never selects an agent pod');
  const mwc = findObject(objects, 'MutatingWebhookConfiguration', 'vmseed') as Any;
  assert.equal(mwc.metadata.annotations['cert-manager.io/inject-ca-from'], `vmseed/${certificate.metadata.name}`);
  assert.ok(certificate.spec.dnsNames.includes(`${service.metadata.name}.${service.metadata.namespace}.svc`));
  const [hook] = mwc.webhooks;
  assert.deepEqual(hook.clientConfig.service, {
    namespace: service.metadata.namespace,
    name: service.metadata.name,
    path: WEBHOOK_PATH,
    port: service.spec.ports[0].port,
  });
});

test('the cluster component runs off the VM nodes, spread, unprivileged, with its own ServiceAccount and only its own roles', () => {
  const deployment = findObject(objects, 'Deployment', 'vmseed-cluster') as Any;
  assert.equal(deployment.spec.replicas, 2);
  const pod = deployment.spec.template.spec;
  assert.equal(pod.serviceAccountName, 'vmseed-cluster');
  assert.ok(findObject(objects, 'ServiceAccount', 'vmseed-cluster'));
  assert.deepEqual(
    objects
      .filter(
        (o: Any) =>
          (o.kind === 'RoleBinding' || o.kind === 'ClusterRoleBinding') &&
          o.subjects?.some((s: Any) => s.name === 'vmseed-cluster'),
      )
      .map((o: Any) => `${o.kind}/${o.roleRef.kind}/${o.roleRef.name}`)
      .sort(),
    ['ClusterRoleBinding/ClusterRole/vmseed-cluster', 'RoleBinding/Role/vmseed-cluster-cert'],
    'bound to its own roles only (test/deploy/rbac.test.ts checks their rules against its calls)',
  );
  // Each term is ORed: no kubevirt.io/schedulable label, or "false"; and
  // in both, no plain-libvirt VM node's vmseed.io/libvirt.
  const terms = pod.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms;
  const noLibvirt = { key: 'vmseed.io/libvirt', operator: 'DoesNotExist' };
  assert.deepEqual(
    terms.map((t: Any) => t.matchExpressions),
    [
      [{ key: 'kubevirt.io/schedulable', operator: 'DoesNotExist' }, noLibvirt],
      [{ key: 'kubevirt.io/schedulable', operator: 'In', values: ['false'] }, noLibvirt],
    ],
  );
  assert.deepEqual(
    pod.tolerations,
    [{ key: 'node-role.kubernetes.io/control-plane', operator: 'Exists', effect: 'NoSchedule' }],
    "tolerates the control plane's taint only, none a VM pool carries",
  );
  const [spread] = pod.affinity.podAntiAffinity.preferredDuringSchedulingIgnoredDuringExecution;
  assert.equal(spread.podAffinityTerm.topologyKey, 'kubernetes.io/hostname');
  assert.deepEqual(spread.podAffinityTerm.labelSelector.matchLabels, deployment.spec.selector.matchLabels);
  assert.equal(pod.hostNetwork, undefined);
  assert.equal(pod.securityContext.runAsNonRoot, true);
  assert.notEqual(pod.securityContext.runAsUser, 0);
  assert.equal(pod.securityContext.seccompProfile.type, 'RuntimeDefault');
  // The same container security context as the agent's.
  assert.deepEqual(clusterOf(objects).securityContext, agentOf(objects).securityContext);
  assert.deepEqual(clusterOf(objects).securityContext, {
    allowPrivilegeEscalation: false,
    readOnlyRootFilesystem: true,
    capabilities: { drop: ['ALL'] },
  });
  assert.ok(!pod.volumes.some((v: Any) => v.hostPath), 'nothing of a node');
});

test("the cluster component's NetworkPolicy: in on 8443, 8444 and the probe port only, out to the API server only", () => {
  const policy = findObject(objects, 'NetworkPolicy', 'vmseed-cluster') as Any;
  const deployment = findObject(objects, 'Deployment', 'vmseed-cluster') as Any;
  assert.deepEqual(policy.spec.podSelector.matchLabels, deployment.spec.selector.matchLabels);
  assert.deepEqual(policy.spec.policyTypes, ['Ingress', 'Egress']);
  const ports = policy.spec.ingress.flatMap((r: Any) => r.ports.map((p: Any) => p.port)).sort();
  assert.deepEqual(ports, [8080, 8443, 8444]);
  assert.deepEqual(policy.spec.egress.flatMap((r: Any) => r.ports.map((p: Any) => p.port)).sort(), [443, 6443]);
});

test('the configuration: CREATE of VMIs only, opted-in VMIs only, side effects only off dry runs, short timeout, reinvoked, Ignore', () => {
  const hooks = (findObject(objects, 'MutatingWebhookConfiguration', 'vmseed') as Any).webhooks;
  assert.deepEqual(
    hooks.map((h: Any) => [h.name, h.clientConfig.service.path]),
    [
      ['vmi.vmseed.io', WEBHOOK_PATH],
      ['adopt.vmi.vmseed.io', ADOPT_PATH],
    ],
  );
  for (const hook of hooks) {
    assert.deepEqual(hook.admissionReviewVersions, ['v1']);
    assert.deepEqual(hook.rules, [
      {
        apiGroups: ['kubevirt.io'],
        apiVersions: ['v1'],
        operations: ['CREATE'],
        resources: ['virtualmachineinstances'],
        scope: 'Namespaced',
      },
    ]);
    // The one side effect: the Event of an adoption left to KubeVirt, never on a dry run.
    assert.equal(hook.sideEffects, 'NoneOnDryRun');
    assert.equal(hook.reinvocationPolicy, 'IfNeeded');
    assert.ok(hook.timeoutSeconds >= 1 && hook.timeoutSeconds <= 10);
    // Never worse than KubeVirt: an unanswered review never refuses a VMI.
    assert.equal(hook.failurePolicy, 'Ignore');
  }
  const [condition] = hooks[0].matchConditions;
  // The opt-ins the webhook's own check (src/cluster/webhook/mutate.ts inScope, adopt.ts) reads.
  assert.ok(condition.expression.includes(`'${ANNOTATION}' in object.metadata.annotations`));
  assert.ok(condition.expression.includes(`object.metadata.annotations['${IMDS_ENABLED}'] == 'true'`));
  assert.ok(condition.expression.includes(`object.metadata.annotations['${ADOPT_ANNOTATION}'] == 'true'`));
  assert.deepEqual(hooks[1].namespaceSelector, { matchLabels: { [ADOPT_NAMESPACE_LABEL]: 'true' } });
});

// Which of the two webhooks the API server calls for a VMI: its
// namespaceSelector (labels of the VMI's namespace), then every
// matchCondition, evaluated with CEL as the API server does.
function called(vmi: Any, namespaceLabels: Record<string, string>): string[] {
  const hooks = (findObject(objects, 'MutatingWebhookConfiguration', 'vmseed') as Any).webhooks;
  return hooks
    .filter((h: Any) =>
      Object.entries((h.namespaceSelector?.matchLabels ?? {}) as Record<string, string>).every(
        ([k, v]) => namespaceLabels[k] === v,
      ),
    )
    .filter((h: Any) =>
      (h.matchConditions ?? []).every((c: Any) => evaluate(c.expression, { object: toCel(vmi) }) === true),
    )
    .map((h: Any) => h.name);
}

test("each VMI reaches one webhook at most: its own opt-in the first, its namespace's adoption the second", () => {
  const volume = { name: 'ci', cloudInitNoCloud: { userData: '#cloud-config' } };
  const vmi = (annotations?: Record<string, string>, volumes: unknown[] = [volume]): Any => ({
    metadata: { name: 'v', namespace: 'n', ...(annotations ? { annotations } : {}) },
    spec: { domain: { devices: {} }, volumes },
  });
  const labelled = { [ADOPT_NAMESPACE_LABEL]: 'true' };
  const cases: Array<[string, Any, Record<string, string>, string[]]> = [
    ['a plain VMI', vmi(), {}, []],
    ['a plain VMI in a labelled namespace', vmi(), labelled, ['adopt.vmi.vmseed.io']],
    ['no cloud-init volume in a labelled namespace', vmi(undefined, []), labelled, []],
    ['no volumes field in a labelled namespace', { metadata: { name: 'v' }, spec: {} }, labelled, []],
    ['its own adopt: "true"', vmi({ [ADOPT_ANNOTATION]: 'true' }), {}, ['vmi.vmseed.io']],
    ['its own adopt: "true" in a labelled namespace', vmi({ [ADOPT_ANNOTATION]: 'true' }), labelled, ['vmi.vmseed.io']],
    ['adopt: "false" in a labelled namespace', vmi({ [ADOPT_ANNOTATION]: 'false' }), labelled, []],
    [
      'the vmseed annotation in a labelled namespace',
      vmi({ [ANNOTATION]: 'userData: x' }),
      labelled,
      ['vmi.vmseed.io'],
    ],
    ['IMDS in a labelled namespace', vmi({ [IMDS_ENABLED]: 'true' }), labelled, ['vmi.vmseed.io']],
    ['already adopted (a reinvocation)', vmi({ [ADOPTED_ANNOTATION]: '{}' }, []), labelled, ['vmi.vmseed.io']],
  ];
  for (const [what, object, labels, want] of cases) assert.deepEqual(called(object, labels), want, what);
});

test("a fresh install: each agent creates its node's own datasource key, on the node's disk; no key Secret is shared", () => {
  const pod = podOf(base);
  assert.ok(!pod.volumes.some((v: Any) => v.secret?.secretName === 'vmseed-datasource-key'), 'no shared key Secret');
  const config = loadConfig(agentOf(base).args as string[], { NODE_NAME: 'node-a' }, '/')!;
  assert.equal(config.datasource?.keyCreate, true);
  const mount = agentOf(base).volumeMounts.find((m: Any) => config.datasource!.keyFile.startsWith(`${m.mountPath}/`));
  assert.notEqual(mount.readOnly, true, 'the agent writes its key there');
  const key = pod.volumes.find((v: Any) => v.name === mount.name);
  assert.ok(key.hostPath, 'kept across the pod restarts of this node only');
});

test('the component on top of deploy/imds: both variants in one agent', async (t) => {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-kustomize-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await cp(join(ROOT, 'manifests'), join(dir, 'manifests'), { recursive: true });
  await cp(join(ROOT, 'deploy'), join(dir, 'deploy'), { recursive: true });
  await writeFile(
    join(dir, 'deploy', 'kustomization.yaml'),
    'apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources: [imds]\ncomponents: [components/webhook]\n',
  );
  const { objects: both } = await render(join(dir, 'deploy'));
  const pod = podOf(both);
  assert.equal(pod.hostNetwork, true);
  const config = loadConfig(
    (agentOf(both).args as string[]).map((a) => a.replaceAll('$(HOST_IP)', '192.0.2.10')),
    { NODE_NAME: 'node-a' },
    '/',
  )!;
  assert.equal(config.datasource?.imdsCompat, true);
  assert.ok(!(agentOf(both).args as string[]).some((a) => a.startsWith('--webhook-')));
  assert.ok(findObject(both, 'Deployment', 'vmseed-cluster'));
  assert.ok(pod.containers.some((c: Any) => c.name === 'redirect'));
});

test("docs/webhook.md's certificates by hand: its kustomization renders without cert-manager's objects, with the caBundle", async (t) => {
  const doc = await readFile(join(ROOT, 'docs', 'webhook.md'), 'utf8');
  const from = doc.indexOf('and apply this kustomization');
  const block = /```yaml\n([\s\S]*?)```/.exec(doc.slice(from))![1];
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-kustomize-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  await cp(join(ROOT, 'manifests'), join(dir, 'manifests'), { recursive: true });
  await cp(join(ROOT, 'deploy'), join(dir, 'deploy'), { recursive: true });
  await mkdir(join(dir, 'deploy', 'by-hand'));
  await writeFile(join(dir, 'deploy', 'by-hand', 'kustomization.yaml'), block);
  const caBundle = Buffer.from((await testPki('webhook')).caCert).toString('base64');
  // What the documented printf writes.
  await writeFile(
    join(dir, 'deploy', 'by-hand', 'ca-bundle-patch.yaml'),
    `- op: add\n  path: /webhooks/0/clientConfig/caBundle\n  value: ${caBundle}\n`,
  );
  const { objects: manual, stderr: warnings } = await render(join(dir, 'deploy', 'by-hand'));
  assert.equal(warnings.trim(), '');
  assert.ok(!manual.some((o) => o.apiVersion.startsWith('cert-manager.io/')));
  const mwc = findObject(manual, 'MutatingWebhookConfiguration', 'vmseed') as Any;
  assert.equal(mwc.webhooks[0].clientConfig.caBundle, caBundle);
  assert.equal(mwc.metadata.annotations?.['cert-manager.io/inject-ca-from'], undefined);
  await validateBuiltin(mwc);
  assert.equal(
    (findObject(manual, 'Deployment', 'vmseed-cluster') as Any).spec.template.spec.volumes.find(
      (v: Any) => v.name === 'webhook-tls',
    ).secret.secretName,
    'vmseed-webhook-tls',
  );
});
