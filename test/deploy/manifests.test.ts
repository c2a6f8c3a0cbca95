import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import {
  ROOT,
  PROMETHEUS_RULE_SCHEMA,
  SERVICE_MONITOR_SCHEMA,
  checkSchema,
  findObject,
  loadYamlDocuments,
  validateBuiltin,
  type KubeObject,
} from '../support/manifests.ts';

const objects = loadYamlDocuments('manifests/daemonset.yaml');

// Narrow access into the DaemonSet without restating its whole type.
type Any = any;
const daemonSet = findObject(objects, 'DaemonSet', 'vmseed') as Any;
const podSpec = daemonSet.spec.template.spec;
const agent = podSpec.containers.find((c: Any) => c.name === 'agent');

test('daemonset.yaml holds the namespace, RBAC, PriorityClass, DaemonSet, Service and NetworkPolicy, each valid against the Kubernetes schema', async () => {
  assert.deepEqual(objects.map((o) => o.kind).sort(), [
    'ClusterRole',
    'ClusterRoleBinding',
    'DaemonSet',
    'Namespace',
    'NetworkPolicy',
    'PriorityClass',
    'Service',
    'ServiceAccount',
  ]);
  for (const o of objects) {
    await assert.doesNotReject(validateBuiltin(o), `${o.kind} ${o.metadata.name}`);
    if (!['Namespace', 'ClusterRole', 'ClusterRoleBinding', 'PriorityClass'].includes(o.kind))
      assert.equal(o.metadata.namespace, 'vmseed', o.kind);
  }
});

test('the schema validation really rejects invalid objects', async () => {
  const broken = structuredClone(daemonSet);
  broken.spec.template.spec.containers[0].ports[0].containerPort = 'eighty';
  await assert.rejects(validateBuiltin(broken), /containerPort/);

  const noSelector = structuredClone(daemonSet);
  delete noSelector.spec.selector;
  await assert.rejects(validateBuiltin(noSelector), /selector/);

  const role = structuredClone(findObject(objects, 'ClusterRole')) as Any;
  role.rules[0].verbs = 'list';
  await assert.rejects(validateBuiltin(role), /verbs/);

  const service = structuredClone(findObject(objects, 'Service')) as Any;
  service.spec.ports[0].port = '8080';
  await assert.rejects(validateBuiltin(service), /port/);

  await assert.rejects(
    validateBuiltin({ apiVersion: 'apps/v1', kind: 'NoSuchKind', metadata: { name: 'x' } }),
    /NoSuchKind/,
  );
});

test('the DaemonSet gets its node name from the Downward API and keeps seeds on a hostPath', () => {
  const nodeName = agent.env.find((e: Any) => e.name === 'NODE_NAME');
  assert.deepEqual(nodeName.valueFrom, { fieldRef: { fieldPath: 'spec.nodeName' } });
  const seeds = podSpec.volumes.find((v: Any) => v.name === 'seeds');
  assert.equal(seeds.hostPath.path, '/var/lib/vmseed/seeds');
  const mount = agent.volumeMounts.find((m: Any) => m.name === 'seeds');
  assert.ok(agent.args.includes(`--state-dir=${mount.mountPath}`), 'the agent writes where the hostPath is mounted');
  assert.ok(
    agent.args.includes('--kubevirt-volumes=ignore'),
    'beside KubeVirt, its own cloud-init volumes are not ours',
  );
});

// The KubeVirt preset's per-launcher socket (fixed with --platform=kubevirt):
// {podsDir}/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock.
const LAUNCHER_SOCKET = '/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock';
const argValue = (flag: string): string | undefined =>
  agent.args.find((a: string) => a.startsWith(`--${flag}=`))?.slice(flag.length + 3);

test('the KubeVirt preset: --pods-dir is the mount of the kubelet pod tree, and the launcher socket under it fits in sun_path', () => {
  assert.equal(argValue('platform'), 'kubevirt');
  const podsDir = argValue('pods-dir')!;
  const mount = agent.volumeMounts.find((m: Any) => m.mountPath === podsDir);
  assert.ok(mount, `nothing mounted at --pods-dir ${podsDir}`);
  const volume = podSpec.volumes.find((v: Any) => v.name === mount.name);
  assert.equal(volume.hostPath.path, '/var/lib/kubelet/pods');
  assert.equal(volume.hostPath.type, 'Directory');
  // Launcher pods (and their tmpfs emptyDirs) created after the agent started.
  assert.equal(mount.mountPropagation, 'HostToContainer');
  // Images are written into each launcher's ephemeral-disks/vmseed/.
  assert.equal(mount.readOnly, false);
  // A pod UID is 36 characters; a unix socket path must fit in 108 bytes with its NUL.
  const longest = (podsDir + LAUNCHER_SOCKET).replace('{podUID}', '0'.repeat(36));
  assert.ok(Buffer.byteLength(longest) < 108, `${longest} is ${Buffer.byteLength(longest)} bytes`);
  assert.ok(
    Buffer.byteLength(('/var/lib/kubelet/pods' + LAUNCHER_SOCKET).replace('{podUID}', '0'.repeat(36))) >= 108,
    'the host path itself would not fit: why /pods',
  );
});

test('no hand-written launcher layout is left: the preset owns it, and nothing points into hotplug-disks', () => {
  for (const flag of ['libvirt-uri', 'publish-dir', 'image-path-in-domain', 'disk-bus', 'domain-name', 'resume-via']) {
    assert.equal(argValue(flag), undefined, `--${flag} overrides the KubeVirt preset`);
  }
  const text = readFileSync(ROOT + 'manifests/daemonset.yaml', 'utf8');
  assert.doesNotMatch(text, /hotplug-disks/, 'KubeVirt detaches foreign disks under its hotplug prefix');
  assert.doesNotMatch(readFileSync(ROOT + 'docs/operations.md', 'utf8'), /hotplug-disks/);
});

test('listeners: probes and /metrics on the pod network, the per-VMI detail on loopback only', () => {
  assert.equal(argValue('listen'), '0.0.0.0:8080');
  const status = argValue('status-listen')!;
  assert.match(status, /^127\.0\.0\.1:\d+$/, 'the status detail of every tenant stays off the pod network');
  const statusPort = Number(status.split(':')[1]);
  assert.ok(
    !agent.ports.some((p: Any) => p.containerPort === statusPort),
    'the loopback port is not declared as a container port',
  );
  assert.ok(argValue('datasource-listen')!.endsWith(':8081'));
});

test('probes, port and Prometheus annotations point at the agent listener', () => {
  const port = agent.ports.find((p: Any) => p.name === 'http-metrics');
  assert.ok(agent.args.includes(`--listen=0.0.0.0:${port.containerPort}`));
  assert.equal(agent.livenessProbe.httpGet.path, '/healthz');
  assert.equal(agent.readinessProbe.httpGet.path, '/readyz');
  assert.equal(agent.livenessProbe.httpGet.port, 'http-metrics');
  assert.equal(agent.readinessProbe.httpGet.port, 'http-metrics');
  const ann = daemonSet.spec.template.metadata.annotations;
  assert.equal(ann['prometheus.io/scrape'], 'true');
  assert.equal(ann['prometheus.io/port'], String(port.containerPort));
  assert.equal(ann['prometheus.io/path'], '/metrics');
});

test('the security context grants nothing beyond socket access', () => {
  assert.equal(podSpec.securityContext.runAsNonRoot, true);
  assert.equal(podSpec.securityContext.runAsUser, 107, 'qemu, the owner of a non-root launcher socket');
  assert.equal(podSpec.securityContext.runAsGroup, 107);
  assert.deepEqual(
    podSpec.securityContext.supplementalGroups,
    [0],
    "search on the kubelet's 0750 root:root pod directories",
  );
  assert.equal(podSpec.securityContext.seccompProfile.type, 'RuntimeDefault');
  assert.equal(podSpec.hostNetwork ?? false, false);
  assert.equal(podSpec.hostPID ?? false, false);
  for (const c of [...podSpec.containers, ...podSpec.initContainers]) {
    const sc = c.securityContext;
    assert.equal(sc.allowPrivilegeEscalation, false, c.name);
    assert.equal(sc.readOnlyRootFilesystem, true, c.name);
    assert.deepEqual(sc.capabilities.drop, ['ALL'], c.name);
    assert.equal(sc.privileged ?? false, false, c.name);
  }
  assert.equal(agent.securityContext.capabilities.add, undefined, 'the agent adds no capability');
  // The one root step: chown of the state directory and the node's key
  // directory, with CAP_CHOWN alone.
  const [init] = podSpec.initContainers;
  assert.deepEqual(init.securityContext.capabilities.add, ['CHOWN']);
  assert.deepEqual(init.command, ['chown', '107:107', '/var/lib/vmseed/seeds', '/etc/vmseed/datasource']);
  const keyMount = agent.volumeMounts.find((m: Any) => m.mountPath === '/etc/vmseed/datasource');
  assert.deepEqual(podSpec.volumes.find((v: Any) => v.name === keyMount.name).hostPath, {
    path: '/var/lib/vmseed/keys',
    type: 'DirectoryOrCreate',
  });
  assert.ok(argValue('datasource-key-file')!.startsWith('/etc/vmseed/datasource/'));
  assert.equal(argValue('datasource-key-create'), 'true');
  for (const v of podSpec.volumes.filter((v: Any) => v.hostPath)) {
    const mounts = podSpec.containers.flatMap((c: Any) => c.volumeMounts).filter((m: Any) => m.name === v.name);
    assert.ok(mounts.length > 0, `hostPath ${v.name} is mounted`);
  }
});

test('resources are bounded and sized for the 150 MB RSS target', () => {
  const { requests, limits } = agent.resources;
  assert.deepEqual(requests, { cpu: '50m', memory: '96Mi' });
  assert.deepEqual(limits, { cpu: '500m', memory: '256Mi' });
  const heap = agent.env.find((e: Any) => e.name === 'NODE_OPTIONS').value;
  assert.match(heap, /--max-old-space-size=(\d+)/);
  assert.ok(Number(/=(\d+)/.exec(heap)![1]) < 256, 'V8 heap cap below the memory limit');
});

test('it runs on every VM node and rolls without surge', () => {
  assert.deepEqual(podSpec.tolerations, [{ operator: 'Exists' }]);
  const term = podSpec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[0];
  assert.deepEqual(term.matchExpressions, [{ key: 'kubevirt.io/schedulable', operator: 'Exists' }]);
  assert.equal(daemonSet.spec.updateStrategy.type, 'RollingUpdate');
  assert.equal(daemonSet.spec.updateStrategy.rollingUpdate.maxSurge, 0);
  assert.ok(daemonSet.spec.updateStrategy.rollingUpdate.maxUnavailable);
});

test('the headless Service selects the agent pods on the metrics port, and the ServiceMonitor selects the Service', () => {
  const service = findObject(objects, 'Service') as Any;
  assert.equal(service.spec.clusterIP, 'None');
  const podLabels = daemonSet.spec.template.metadata.labels;
  for (const [k, v] of Object.entries(service.spec.selector)) assert.equal(podLabels[k], v, `Service selector ${k}`);
  for (const [k, v] of Object.entries(daemonSet.spec.selector.matchLabels))
    assert.equal(podLabels[k], v, `DaemonSet selector ${k}`);
  assert.equal(service.spec.ports[0].targetPort, 'http-metrics');

  const [monitor] = loadYamlDocuments('manifests/monitoring/servicemonitor.yaml') as Any[];
  for (const [k, v] of Object.entries(monitor.spec.selector.matchLabels))
    assert.equal(service.metadata.labels[k], v, `ServiceMonitor selector ${k}`);
  assert.deepEqual(monitor.spec.namespaceSelector.matchNames, [service.metadata.namespace]);
  assert.equal(monitor.spec.endpoints[0].port, service.spec.ports[0].name);
  assert.equal(service.metadata.labels[monitor.spec.jobLabel], 'vmseed', 'job="vmseed" in the alerts and dashboard');
});

test('the ClusterRoleBinding binds the role to the DaemonSet service account', () => {
  const binding = findObject(objects, 'ClusterRoleBinding') as Any;
  const role = findObject(objects, 'ClusterRole');
  const account = findObject(objects, 'ServiceAccount');
  assert.equal(binding.roleRef.name, role.metadata.name);
  assert.deepEqual(binding.subjects, [
    { kind: 'ServiceAccount', name: account.metadata.name, namespace: account.metadata.namespace },
  ]);
  assert.equal(podSpec.serviceAccountName, account.metadata.name);
});

test('the Prometheus Operator objects match the structure of their CRDs', () => {
  const [monitor] = loadYamlDocuments('manifests/monitoring/servicemonitor.yaml');
  const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml');
  assert.deepEqual(checkSchema(monitor, SERVICE_MONITOR_SCHEMA), []);
  assert.deepEqual(checkSchema(rule, PROMETHEUS_RULE_SCHEMA), []);
});

test('the CRD structural check rejects typos, missing fields and bad durations', () => {
  const [monitor] = loadYamlDocuments('manifests/monitoring/servicemonitor.yaml') as Any[];
  const typo = structuredClone(monitor);
  typo.spec.endpionts = typo.spec.endpoints;
  delete typo.spec.endpoints;
  assert.deepEqual(checkSchema(typo, SERVICE_MONITOR_SCHEMA), [
    'spec: missing required field endpoints',
    'spec.endpionts: unknown field',
  ]);
  const badInterval = structuredClone(monitor);
  badInterval.spec.endpoints[0].interval = '30 seconds';
  assert.equal(checkSchema(badInterval, SERVICE_MONITOR_SCHEMA).length, 1);

  const [rule] = loadYamlDocuments('manifests/monitoring/prometheusrule.yaml') as Any[];
  const noExpr = structuredClone(rule);
  delete noExpr.spec.groups[0].rules[0].expr;
  assert.deepEqual(checkSchema(noExpr, PROMETHEUS_RULE_SCHEMA), [
    'spec.groups[0].rules[0]: missing required field expr',
  ]);
  const badFor = structuredClone(rule);
  badFor.spec.groups[0].rules[0].for = 15;
  assert.deepEqual(checkSchema(badFor, PROMETHEUS_RULE_SCHEMA), ['spec.groups[0].rules[0].for: must be a string']);
});

test('every manifest file parses', () => {
  for (const file of [
    'manifests/daemonset.yaml',
    'manifests/monitoring/servicemonitor.yaml',
    'manifests/monitoring/prometheusrule.yaml',
    'manifests/monitoring/runbooks.yaml',
  ]) {
    const docs: KubeObject[] = loadYamlDocuments(file);
    assert.ok(docs.length > 0, file);
    for (const d of docs) assert.ok(d.apiVersion && d.kind && d.metadata?.name, `${file}: ${d.kind}`);
  }
  const dashboard = JSON.parse(readFileSync(ROOT + 'manifests/monitoring/grafana-dashboard.json', 'utf8'));
  assert.equal(dashboard.uid, 'vmseed-agent');
});

// The contract with src/config/config.ts: the DaemonSet's args and environment
// must be accepted by the agent as they are.
test("the agent's config parser accepts the DaemonSet's args and environment", async () => {
  const { loadConfig } = (await import('../../src/config/config.ts')) as unknown as {
    loadConfig(argv: string[], env: NodeJS.ProcessEnv, cwd: string): Any;
  };
  const env: NodeJS.ProcessEnv = {};
  for (const e of agent.env) env[e.name] = e.valueFrom ? 'node-a' : e.value;
  const config = loadConfig(agent.args, env, '/');
  assert.equal(config.mode, 'kubernetes');
  assert.equal(config.nodeName, 'node-a');
  assert.equal(config.stateDir, '/var/lib/vmseed/seeds');
  assert.equal(config.kubevirtVolumes, 'ignore');
  assert.equal(config.libvirt.mode, 'rpc');
  assert.equal(config.libvirt.resumeVia, 'kubevirt');
  assert.equal(config.libvirt.platform, 'kubevirt');
  assert.equal(config.libvirt.podsDir, agent.volumeMounts.find((m: Any) => m.name === 'launcher-pods').mountPath);
  assert.deepEqual(config.statusListen, { host: '127.0.0.1', port: 8090 });
  assert.deepEqual(config.listen, { host: '0.0.0.0', port: 8080 });
  assert.equal(config.namespaces, undefined, 'cluster-wide');
  assert.equal(agent.command, undefined, 'the ENTRYPOINT (bin/vmseed) starts the agent');
});

test('manifests/ holds the node agents, the cluster component and the admission policy (built-in kinds only, so they apply without the Prometheus Operator) and their kustomization', async () => {
  const { readdirSync, statSync } = await import('node:fs');
  const files = readdirSync(ROOT + 'manifests').filter(
    (f) => /\.(ya?ml|json)$/.test(f) && statSync(ROOT + 'manifests/' + f).isFile(),
  );
  const resources = ['admission-policy.yaml', 'cluster.yaml', 'daemonset.yaml'];
  assert.deepEqual(files.sort(), [...resources, 'kustomization.yaml'].sort());
  for (const f of resources) for (const o of loadYamlDocuments(`manifests/${f}`)) await validateBuiltin(o);
  const [kustomization] = loadYamlDocuments('manifests/kustomization.yaml') as Any[];
  assert.deepEqual([...kustomization.resources].sort(), resources);
});

test("the agent's NetworkPolicy: in, only the probe/metrics and datasource ports; out, the API server, the object service and DNS for its name", () => {
  const policy = findObject(objects, 'NetworkPolicy', 'vmseed-agent') as Any;
  const podLabels = daemonSet.spec.template.metadata.labels;
  for (const [k, v] of Object.entries(policy.spec.podSelector.matchLabels))
    assert.equal(podLabels[k], v, `podSelector ${k}`);
  assert.deepEqual(policy.spec.policyTypes.sort(), ['Egress', 'Ingress']);
  const ingressPorts = policy.spec.ingress
    .flatMap((r: Any) => r.ports.map((p: Any) => `${p.protocol}/${p.port}`))
    .sort();
  assert.deepEqual(
    ingressPorts,
    agent.ports.map((p: Any) => `${p.protocol}/${p.containerPort}`).sort(),
    'exactly the declared container ports',
  );
  const listened = ['listen', 'datasource-listen'].map((f) => `TCP/${argValue(f)!.split(':')[1]}`).sort();
  assert.deepEqual(ingressPorts, listened);
  const egress = policy.spec.egress.flatMap((r: Any) => {
    assert.ok(r.ports?.length > 0, 'every egress rule names its ports');
    return r.ports.map((p: Any) => `${p.protocol}/${p.port}`);
  });
  assert.deepEqual(egress.sort(), ['TCP/443', 'TCP/53', 'TCP/6443', 'TCP/8444', 'UDP/53']);
  // The object service's port only towards the cluster component's pods, on
  // the port --objects-url names.
  const toObjects = policy.spec.egress.find((r: Any) => r.ports.some((p: Any) => p.port === 8444));
  assert.deepEqual(toObjects.to, [
    { podSelector: { matchLabels: { 'app.kubernetes.io/name': 'vmseed', 'app.kubernetes.io/component': 'cluster' } } },
  ]);
  assert.equal(new URL(argValue('objects-url')!).port, '8444');
});

// A paused VM waits for its node's agent: the agent must not wait behind
// ordinary pods. KubeVirt's virt-handler runs at kubevirt-cluster-critical,
// 1,000,000,000 (virt-operator's install strategy), the highest value a
// class outside system-* may have.
test("the agent's pods run at virt-handler's priority, from a class of vmseed's own", () => {
  const cls = findObject(objects, 'PriorityClass') as Any;
  assert.equal(daemonSet.spec.template.spec.priorityClassName, cls.metadata.name);
  assert.equal(cls.value, 1_000_000_000);
  assert.equal(cls.globalDefault, false, 'never the default of other pods');
  assert.doesNotMatch(cls.metadata.name, /^system-/, 'system-* classes are for kube-system only');
});
