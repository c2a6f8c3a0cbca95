import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { join } from 'node:path';
import {
  checkRbac,
  checkScopedRbac,
  requestAttributes,
  ruleAllows,
  rulesOfServiceAccount,
  scopedAllows,
  type PolicyRule,
  type RecordedCall,
  type ScopedRules,
} from '../support/rbac.ts';
import { ROOT, findObject, loadYamlDocuments, type KubeObject } from '../support/manifests.ts';
import { kustomize } from '../support/kustomize.ts';
import { runKubevirtScenario } from '../support/kubevirt-scenario.ts';
import { ADMIN_USER, FakeKube } from '../support/fake-kube.ts';
import { resourceType } from '../support/fake-kube-objects.ts';
import { ensureServingCert } from '../../src/cluster/objects/serving-cert.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { KubeRefResolver } from '../../src/kube/resolver.ts';
import { KubeAdoptionEvents } from '../../src/cluster/webhook/adoption-events.ts';
import { startWebhookServer } from '../../src/cluster/webhook/webhook-server.ts';
import { certDir, post, testPki } from '../support/webhook.ts';
import pino from 'pino';
import { rm } from 'node:fs/promises';

const role = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'ClusterRole', 'vmseed-agent') as unknown as {
  rules: PolicyRule[];
};
const clusterRole = findObject(
  loadYamlDocuments('manifests/cluster.yaml'),
  'ClusterRole',
  'vmseed-cluster',
) as unknown as {
  rules: PolicyRule[];
};
const ACCOUNT = { namespace: 'vmseed', name: 'vmseed' };
const COMPONENT = { namespace: 'vmseed', name: 'vmseed-cluster' };

// The agent's API calls as the fake API server recorded them while an agent
// ran test/support/kubevirt-scenario.ts as the default manifests deploy it:
// the informer, the launcher pods' watch, Events created and patched, and a
// VMI's provisioning annotation patched; its Secret and ConfigMap reads and
// the seed gate's unpause went through the cluster component, whose own
// calls are CLUSTER_CALLS.
// AGENT_CALLS: cluster-wide; NAMESPACED_CALLS: the same scenario with the
// namespaced variant's --namespaces, authorized by that variant's own
// rendered bindings; DIRECT_CALLS: the single-tenant variant, the agent
// reading and unpausing itself.
let AGENT_CALLS: RecordedCall[] = [];
let CLUSTER_CALLS: RecordedCall[] = [];
let DIRECT_CALLS: RecordedCall[] = [];
let SINGLE_TENANT: KubeObject[] = [];
let NAMESPACED_CALLS: RecordedCall[] = [];
let NAMESPACED_STATUSES: number[] = [];
// The variants as `kubectl apply -k deploy/<variant>` creates them.
let CLUSTER_WIDE: KubeObject[] = [];
let NAMESPACED: KubeObject[] = [];
type Recorded = { method: string; path: string; query: Record<string, string>; user: string };
const recorded = (requests: Recorded[], component = false): RecordedCall[] =>
  requests
    .filter((r) => (r.user === ADMIN_USER) === component)
    .map((r) => ({ method: r.method, path: r.path, query: r.query }));
before(async () => {
  CLUSTER_WIDE = await kustomize(join(ROOT, 'deploy', 'kubevirt'));
  NAMESPACED = await kustomize(join(ROOT, 'deploy', 'namespaced'));
  SINGLE_TENANT = await kustomize(join(ROOT, 'deploy', 'single-tenant'));
  const clusterWide = await runKubevirtScenario({ rbac: CLUSTER_WIDE, objectService: true });
  assert.deepEqual(clusterWide.unpaused, ['team-a/vm1'], 'the scenario reached the seed gate');
  AGENT_CALLS = recorded(clusterWide.requests);
  CLUSTER_CALLS = [...recorded(clusterWide.requests, true), ...(await webhookCalls())];
  const namespaced = await runKubevirtScenario({
    namespaces: namespacesFlag(NAMESPACED),
    rbac: NAMESPACED,
    objectService: true,
  });
  assert.deepEqual(namespaced.unpaused, ['team-a/vm1'], 'the namespaced scenario reached the seed gate');
  NAMESPACED_CALLS = recorded(namespaced.requests);
  NAMESPACED_STATUSES = namespaced.requests.filter((r) => r.user !== ADMIN_USER).map((r) => r.status);
  const direct = await runKubevirtScenario({ rbac: SINGLE_TENANT });
  assert.deepEqual(direct.unpaused, ['team-a/vm1'], 'the single-tenant scenario reached the seed gate');
  DIRECT_CALLS = recorded(direct.requests);
});

// The webhook's calls, made with the component's credentials like the
// object service's: a VMI whose cloud-init volume it adopts (its Secret
// read) and one it leaves to KubeVirt (its Secret missing: an Event).
async function webhookCalls(): Promise<RecordedCall[]> {
  const token = 'component-token';
  const fake = await FakeKube.start({ adminTokens: [token] });
  const pki = await testPki('webhook');
  const dir = await certDir(pki);
  const api = new KubeConnectionApi(fake.connection(token), { timeoutMs: 2000 });
  const events = new KubeAdoptionEvents({ api, logger: pino({ level: 'silent' }), host: 'h' });
  const server = await startWebhookServer({
    listen: { host: '127.0.0.1', port: 0 },
    certDir: dir,
    logger: pino({ level: 'silent' }),
    mutate: {},
    adoption: { secrets: new KubeRefResolver(api), events },
    vms: api,
  });
  try {
    fake.setSecret({ metadata: { name: 'ud', namespace: 'team-a' }, data: { userdata: 'I2Nsb3VkLWNvbmZpZw==' } });
    fake.objects.create(
      resourceType('', 'namespaces')!,
      undefined,
      JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'team-a' } }),
    );
    for (const secret of ['ud', 'missing']) {
      const spec = {
        domain: { devices: { disks: [{ name: 'ci', disk: {} }] } },
        volumes: [{ name: 'ci', cloudInitNoCloud: { secretRef: { name: secret } } }],
      };
      const annotations = { 'vmseed.io/adopt': 'true' };
      // Its VirtualMachine, which vouches for the review.
      const vm = fake.objects.create(
        resourceType('kubevirt.io', 'virtualmachines')!,
        'team-a',
        JSON.stringify({
          apiVersion: 'kubevirt.io/v1',
          kind: 'VirtualMachine',
          metadata: { name: `vm-${secret}`, namespace: 'team-a' },
          spec: { template: { metadata: { annotations }, spec } },
        }),
      );
      const uid = (vm.body as { metadata: { uid: string } }).metadata.uid;
      const object = {
        metadata: {
          name: `vm-${secret}`,
          namespace: 'team-a',
          annotations,
          ownerReferences: [
            { apiVersion: 'kubevirt.io/v1', kind: 'VirtualMachine', name: `vm-${secret}`, uid, controller: true },
          ],
        },
        spec,
      };
      const review = {
        apiVersion: 'admission.k8s.io/v1',
        kind: 'AdmissionReview',
        request: {
          uid: secret,
          resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
          namespace: 'team-a',
          operation: 'CREATE',
          object,
        },
      };
      assert.equal((await post(server.address.port, pki.caCert, JSON.stringify(review))).status, 200);
    }
    await events.flush();
    assert.equal(fake.events().length, 1, "the skipped adoption's Event");
    return recorded(fake.requests, true);
  } finally {
    await server.close();
    await fake.close();
    await rm(dir, { recursive: true, force: true });
  }
}

// `group/resource[/subresource]:verb` of each kind of call, sorted.
function kindsOf(calls: RecordedCall[]): string[] {
  const kinds = calls.map((c) => {
    const a = requestAttributes(c);
    return `${a.apiGroup}/${a.resource}${a.subresource ? '/' + a.subresource : ''}:${a.verb}`;
  });
  return [...new Set(kinds)].sort();
}

test('the scenario made every kind of call the agent has', () => {
  assert.deepEqual(kindsOf(AGENT_CALLS), [
    '/events:create',
    '/events:patch',
    '/pods:list',
    '/pods:watch',
    'kubevirt.io/virtualmachineinstances:list',
    'kubevirt.io/virtualmachineinstances:patch',
    'kubevirt.io/virtualmachineinstances:watch',
  ]);
});

test("the cluster component's ClusterRole grants exactly the calls it made for the node: none denied, no rule unused", () => {
  assert.deepEqual(kindsOf(CLUSTER_CALLS), [
    '/configmaps:get',
    '/configmaps:watch',
    '/events:create',
    '/pods:get',
    '/secrets:get',
    '/secrets:watch',
    'authentication.k8s.io/tokenreviews:create',
    'kubevirt.io/virtualmachineinstances:list',
    'kubevirt.io/virtualmachineinstances:watch',
    'kubevirt.io/virtualmachines:get',
    'subresources.kubevirt.io/virtualmachineinstances/unpause:update',
  ]);
  const scoped = rulesOfServiceAccount(CLUSTER_WIDE, COMPONENT);
  // Its own Role in its namespace: the agent pods' Pod get, and its
  // certificate's Secret and ConfigMap (serving-cert.test.ts makes those calls).
  const podGets = CLUSTER_CALLS.filter((c) => requestAttributes(c).resource === 'pods');
  assert.ok(podGets.length > 0, "the scenario's agent token names only its pod");
  assert.deepEqual(checkScopedRbac(scoped, podGets).denied, []);
  assert.deepEqual(
    checkRbac(
      clusterRole.rules,
      CLUSTER_CALLS.filter((c) => requestAttributes(c).resource !== 'pods'),
    ),
    { denied: [], unused: [] },
  );
  assert.deepEqual(scoped.map((s) => `${s.namespace || '*'} ${s.via}`).sort(), [
    '* ClusterRoleBinding vmseed-cluster -> ClusterRole vmseed-cluster',
    'vmseed RoleBinding vmseed/vmseed-cluster-cert -> Role vmseed-cluster-cert',
  ]);
});

test('request paths map to the attributes the API server authorizes', () => {
  const pick = (method: string, path: string) => {
    const a = requestAttributes({ method, path });
    return [a.apiGroup, a.resource, a.subresource, a.verb, a.namespace, a.name].join(' ');
  };
  assert.equal(
    pick('GET', '/apis/kubevirt.io/v1/virtualmachineinstances?labelSelector=x'),
    'kubevirt.io virtualmachineinstances  list  ',
  );
  assert.equal(
    pick('GET', '/apis/kubevirt.io/v1/virtualmachineinstances?watch=true'),
    'kubevirt.io virtualmachineinstances  watch  ',
  );
  assert.equal(
    pick('GET', '/apis/kubevirt.io/v1/watch/namespaces/a/virtualmachineinstances'),
    'kubevirt.io virtualmachineinstances  watch a ',
  );
  assert.equal(
    pick('GET', '/apis/kubevirt.io/v1/namespaces/a/virtualmachineinstances/v'),
    'kubevirt.io virtualmachineinstances  get a v',
  );
  assert.equal(
    pick('PUT', '/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/unpause'),
    'subresources.kubevirt.io virtualmachineinstances unpause update a v',
  );
  assert.equal(pick('GET', '/api/v1/namespaces/a/secrets/s'), ' secrets  get a s');
  assert.equal(pick('POST', '/api/v1/namespaces/a/events'), ' events  create a ');
  assert.equal(pick('PATCH', '/api/v1/namespaces/a/events/e'), ' events  patch a e');
  assert.equal(pick('DELETE', '/api/v1/namespaces/a/events'), ' events  deletecollection a ');
  assert.equal(pick('DELETE', '/api/v1/namespaces/a/events/e'), ' events  delete a e');
  assert.equal(pick('GET', '/api/v1/namespaces/a'), ' namespaces  get  a');
  assert.throws(() => requestAttributes({ method: 'GET', path: '/healthz' }), /not a resource request/);
  assert.throws(() => requestAttributes({ method: 'TRACE', path: '/api/v1/pods' }), /unknown HTTP method/);
});

test('the ClusterRole grants exactly the calls the agent makes: none denied, no rule unused', () => {
  assert.deepEqual(checkRbac(role.rules, AGENT_CALLS), { denied: [], unused: [] });
});

test('a call outside the role is reported as denied', () => {
  const extra: RecordedCall[] = [
    // PATCH on unpause: KubeVirt serves PUT only and the role grants update only.
    { method: 'PATCH', path: '/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/unpause' },
    { method: 'GET', path: '/apis/kubevirt.io/v1/namespaces/a/virtualmachineinstances/v' },
    { method: 'GET', path: '/api/v1/secrets' },
    { method: 'PUT', path: '/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/pause' },
    { method: 'DELETE', path: '/api/v1/namespaces/a/events/e' },
  ];
  const report = checkRbac(role.rules, [...AGENT_CALLS, ...extra]);
  assert.deepEqual(
    report.denied.map((d) => `${d.call.method} ${d.call.path}`),
    extra.map((c) => `${c.method} ${c.path}`),
  );
  assert.deepEqual(report.unused, []);
});

test('a granted rule that no call uses is reported as unused', () => {
  const wider: PolicyRule[] = [...role.rules, { apiGroups: [''], resources: ['nodes'], verbs: ['get', 'list'] }];
  const report = checkRbac(wider, AGENT_CALLS);
  assert.deepEqual(report.denied, []);
  assert.deepEqual(report.unused, [
    { apiGroup: '', resource: 'nodes', verb: 'get' },
    { apiGroup: '', resource: 'nodes', verb: 'list' },
  ]);
  // Dropping a call the agent makes leaves its grant unused.
  const withoutWatch = AGENT_CALLS.filter((c) => requestAttributes(c).verb !== 'watch');
  assert.deepEqual(checkRbac(role.rules, withoutWatch).unused, [
    { apiGroup: 'kubevirt.io', resource: 'virtualmachineinstances', verb: 'watch' },
    { apiGroup: '', resource: 'pods', verb: 'watch' },
  ]);
});

test('a referenced object is watched by name, which a rule with resourceNames can allow', () => {
  const watches = CLUSTER_CALLS.map((c) => requestAttributes(c)).filter(
    (a) => a.verb === 'watch' && (a.resource === 'secrets' || a.resource === 'configmaps'),
  );
  assert.ok(watches.length >= 2);
  for (const a of watches) {
    assert.notEqual(a.name, '', 'fieldSelector=metadata.name=<name>: a request on that name');
    assert.equal(
      ruleAllows({ apiGroups: [''], resources: [a.resource], verbs: ['watch'], resourceNames: [a.name] }, a),
      true,
    );
    assert.equal(
      ruleAllows({ apiGroups: [''], resources: [a.resource], verbs: ['watch'], resourceNames: ['other'] }, a),
      false,
    );
  }
  assert.equal(
    requestAttributes({
      method: 'GET',
      path: '/api/v1/namespaces/a/secrets?watch=true&fieldSelector=metadata.name%3Ds',
    }).name,
    's',
  );
  assert.equal(requestAttributes({ method: 'GET', path: '/api/v1/namespaces/a/secrets?watch=true' }).name, '');
});

test('rule matching follows Kubernetes: wildcards, subresource forms, resourceNames', () => {
  const unpause = requestAttributes({
    method: 'PUT',
    path: '/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/unpause',
  });
  assert.equal(
    ruleAllows(
      { apiGroups: ['subresources.kubevirt.io'], resources: ['virtualmachineinstances'], verbs: ['update'] },
      unpause,
    ),
    false,
  );
  assert.equal(
    ruleAllows(
      { apiGroups: ['subresources.kubevirt.io'], resources: ['virtualmachineinstances/*'], verbs: ['update'] },
      unpause,
    ),
    true,
  );
  assert.equal(ruleAllows({ apiGroups: ['*'], resources: ['*/unpause'], verbs: ['*'] }, unpause), true);
  assert.equal(
    ruleAllows(
      {
        apiGroups: ['subresources.kubevirt.io'],
        resources: ['virtualmachineinstances/unpause'],
        verbs: ['update'],
        resourceNames: ['w'],
      },
      unpause,
    ),
    false,
  );
  const secret = requestAttributes({ method: 'GET', path: '/api/v1/namespaces/a/secrets/s' });
  assert.equal(
    ruleAllows({ apiGroups: ['kubevirt.io'], resources: ['secrets'], verbs: ['get'] }, secret),
    false,
    'wrong group',
  );
});

test("calls recorded as {method, path, query} (the fake API server's RequestRecord) map the same way", () => {
  const a = requestAttributes({
    method: 'GET',
    path: '/apis/kubevirt.io/v1/virtualmachineinstances',
    query: { watch: 'true', labelSelector: 'kubevirt.io/nodeName=n' },
  });
  assert.equal(a.verb, 'watch');
  assert.equal(
    requestAttributes({ method: 'GET', path: '/apis/kubevirt.io/v1/virtualmachineinstances', query: {} }).verb,
    'list',
  );
});

test('every VMI list and watch is scoped to the node by label selector: its own VMIs and those migrating to it', () => {
  const vmiReads = AGENT_CALLS.map((c) => ({ c, a: requestAttributes(c) })).filter(
    ({ a }) => a.resource === 'virtualmachineinstances' && (a.verb === 'list' || a.verb === 'watch'),
  );
  assert.deepEqual([...new Set(vmiReads.map(({ a }) => a.verb))].sort(), ['list', 'watch']);
  for (const { c } of vmiReads) {
    assert.match(c.query?.labelSelector ?? '', /^kubevirt\.io\/(nodeName|migrationTargetNodeName)=[^,]+$/);
  }
  assert.deepEqual(
    new Set(vmiReads.map(({ c }) => c.query?.labelSelector?.split('=')[0])),
    new Set(['kubevirt.io/nodeName', 'kubevirt.io/migrationTargetNodeName']),
  );
});

// --- per deployment variant: what the bindings give the ServiceAccount ------

function namespacesFlag(objects: KubeObject[]): string[] {
  const ds = findObject(objects, 'DaemonSet', 'vmseed') as unknown as {
    spec: { template: { spec: { containers: { name: string; args: string[] }[] } } };
  };
  const args = ds.spec.template.spec.containers.find((c) => c.name === 'agent')!.args;
  const flag = args.find((a) => a.startsWith('--namespaces='));
  return flag === undefined ? [] : flag.slice('--namespaces='.length).split(',');
}

test('cluster-wide (deploy/kubevirt): the ServiceAccount holds exactly the calls the agent makes, everywhere', () => {
  const scoped = rulesOfServiceAccount(CLUSTER_WIDE, ACCOUNT);
  assert.deepEqual(
    scoped.map((s) => `${s.namespace || '*'} ${s.via}`),
    ['* ClusterRoleBinding vmseed-agent -> ClusterRole vmseed-agent'],
  );
  assert.deepEqual(namespacesFlag(CLUSTER_WIDE), []);
  assert.deepEqual(checkScopedRbac(scoped, AGENT_CALLS), { denied: [], unused: [] });
  // No Secret, ConfigMap or unpause anywhere: not by name, not by watch.
  for (const [method, path] of [
    ['GET', '/api/v1/namespaces/team-a/secrets/vm1-userdata'],
    ['GET', '/api/v1/namespaces/team-a/secrets?watch=true&fieldSelector=metadata.name%3Dvm1-userdata'],
    ['GET', '/api/v1/secrets?watch=true'],
    ['GET', '/api/v1/namespaces/team-a/configmaps/vm1-files'],
    ['PUT', '/apis/subresources.kubevirt.io/v1/namespaces/team-a/virtualmachineinstances/vm1/unpause'],
  ])
    assert.equal(scopedAllows(scoped, requestAttributes({ method, path })), false, `${method} ${path}`);
});

test("the cluster component's certificate Role grants exactly the calls of issuing and renewing it", async (t) => {
  const fake = await FakeKube.start({ adminTokens: ['admin'] });
  const connection = fake.connection('admin');
  t.after(async () => {
    await connection.close(100);
    await fake.close();
  });
  fake.objects.create(
    resourceType('', 'namespaces')!,
    undefined,
    JSON.stringify({ apiVersion: 'v1', kind: 'Namespace', metadata: { name: 'vmseed' } }),
  );
  const api = new KubeConnectionApi(connection, { retry: { retries: 0 } });
  const options = {
    namespace: 'vmseed',
    secretName: 'vmseed-cluster-tls',
    configMapName: 'vmseed-cluster-ca',
    dnsNames: ['vmseed-cluster.vmseed.svc'],
  };
  await ensureServingCert(api, options);
  // A year on: renewed in place.
  await ensureServingCert(api, { ...options, now: () => new Date(Date.now() + 360 * 86_400_000) });
  const calls = recorded(fake.requests, true).filter((c) => requestAttributes(c).resource !== 'namespaces');
  const role = findObject(loadYamlDocuments('manifests/cluster.yaml'), 'Role', 'vmseed-cluster-cert') as unknown as {
    rules: PolicyRule[];
  };
  const report = checkRbac(role.rules, calls);
  assert.deepEqual(report.denied, []);
  assert.deepEqual(
    report.unused,
    [{ apiGroup: '', resource: 'pods', verb: 'get' }],
    'every rule used but the Pod get, which the scenario above makes',
  );
});

test("the fake API server, enforcing deploy/kubevirt's RBAC, refuses the node agent's credential a Secret by name and a Secret watch", async (t) => {
  const fake = await FakeKube.start({ rbac: CLUSTER_WIDE });
  const connection = fake.connection();
  t.after(async () => {
    await connection.close(100);
    await fake.close();
  });
  fake.setSecret({ metadata: { name: 's', namespace: 'team-a' }, stringData: { userdata: 'x' } });
  const api = new KubeConnectionApi(connection, { retry: { retries: 0 } });
  for (const path of [
    '/api/v1/namespaces/team-a/secrets/s',
    '/api/v1/namespaces/team-a/secrets?watch=true&fieldSelector=metadata.name%3Ds',
    '/api/v1/secrets?watch=true',
  ]) {
    const r = await api.request('GET', path);
    assert.equal(r.status, 403, path);
    assert.match(String((r.body as { message?: string }).message), /cannot (get|watch) resource "secrets"/);
  }
  const unpause = await api.request(
    'PUT',
    '/apis/subresources.kubevirt.io/v1/namespaces/team-a/virtualmachineinstances/vm1/unpause',
    {},
  );
  assert.equal(unpause.status, 403);
});

test('single-tenant (deploy/single-tenant): the agent alone reads and unpauses with its own credential, no rule unused, no cluster component', () => {
  const scoped = rulesOfServiceAccount(SINGLE_TENANT, ACCOUNT);
  assert.deepEqual(checkScopedRbac(scoped, DIRECT_CALLS), { denied: [], unused: [] });
  const kinds = new Set(
    DIRECT_CALLS.map((c) => requestAttributes(c)).map(
      (a) => `${a.resource}${a.subresource ? '/' + a.subresource : ''}:${a.verb}`,
    ),
  );
  for (const k of ['secrets:get', 'secrets:watch', 'configmaps:get', 'virtualmachineinstances/unpause:update'])
    assert.ok(kinds.has(k), k);
  assert.equal(
    SINGLE_TENANT.filter((o) => o.kind === 'Deployment' || (o.metadata?.name ?? '').startsWith('vmseed-cluster'))
      .length,
    0,
  );
  const ds = findObject(SINGLE_TENANT, 'DaemonSet', 'vmseed') as unknown as {
    spec: { template: { spec: { containers: { args: string[] }[]; volumes: { name: string }[] } } };
  };
  assert.deepEqual(
    ds.spec.template.spec.containers[0].args.filter((a) => a.startsWith('--objects-')),
    [],
  );
  assert.deepEqual(
    ds.spec.template.spec.volumes.filter((v) => v.name.startsWith('objects-')),
    [],
  );
});

// The agent with --namespaces lists and watches VMIs per namespace; every
// other call it makes is already in the VMI's namespace. Its calls, as
// recorded, against the variant's rendered bindings.
test('namespaced (deploy/namespaced): every call the namespaced agent made is allowed in the listed namespaces, every rule used, nothing cluster-wide', () => {
  const namespaces = namespacesFlag(NAMESPACED);
  assert.ok(namespaces.includes('team-a'), "the scenario's VMIs live in team-a");
  const scoped = rulesOfServiceAccount(NAMESPACED, ACCOUNT);
  assert.deepEqual(
    scoped.map((s) => s.namespace).sort(),
    [...namespaces].sort(),
    'one grant per listed namespace, none cluster-wide',
  );
  const attrs = NAMESPACED_CALLS.map((c) => requestAttributes(c));
  for (const ns of namespaces) {
    for (const verb of ['list', 'watch']) {
      assert.ok(
        attrs.some((a) => a.resource === 'virtualmachineinstances' && a.verb === verb && a.namespace === ns),
        `the informer's ${verb} in ${ns}`,
      );
    }
  }
  assert.deepEqual(
    attrs.filter((a) => a.namespace === '' || !namespaces.includes(a.namespace)),
    [],
    'nothing outside the listed namespaces',
  );
  assert.deepEqual(checkScopedRbac(scoped, NAMESPACED_CALLS), { denied: [], unused: [] });
  assert.deepEqual(
    NAMESPACED_STATUSES.filter((s) => s === 401 || s === 403),
    [],
    'the fake API server, authorizing with the same objects, refused nothing',
  );

  // The cluster-wide informer and pod watch of the default mode are refused
  // here, and so is anything in a namespace that is not listed.
  const refused = checkScopedRbac(scoped, AGENT_CALLS).denied.map(
    (d) => `${d.attributes.resource} ${d.attributes.verb} ${d.attributes.namespace || '*'}`,
  );
  assert.deepEqual([...new Set(refused)].sort(), [
    'pods list *',
    'pods watch *',
    'virtualmachineinstances list *',
    'virtualmachineinstances watch *',
  ]);
  for (const path of [
    '/api/v1/namespaces/elsewhere/secrets/s',
    '/api/v1/namespaces/vmseed/configmaps/c',
    '/apis/kubevirt.io/v1/namespaces/elsewhere/virtualmachineinstances',
  ]) {
    assert.equal(scopedAllows(scoped, requestAttributes({ method: 'GET', path })), false, path);
  }
  assert.equal(
    scopedAllows(
      scoped,
      requestAttributes({
        method: 'PUT',
        path: '/apis/subresources.kubevirt.io/v1/namespaces/elsewhere/virtualmachineinstances/v/unpause',
      }),
    ),
    false,
  );
});

test('bindings: only those naming the ServiceAccount count; a RoleBinding grants in its own namespace; a dangling roleRef is an error', () => {
  const rules: PolicyRule[] = [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }];
  const sa = [{ kind: 'ServiceAccount', name: 'vmseed', namespace: 'vmseed' }];
  const objects = [
    { kind: 'ClusterRole', metadata: { name: 'cr' }, rules },
    { kind: 'Role', metadata: { name: 'r', namespace: 'a' }, rules },
    {
      kind: 'RoleBinding',
      metadata: { name: 'b1', namespace: 'a' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'r' },
      subjects: sa,
    },
    {
      kind: 'RoleBinding',
      metadata: { name: 'b2', namespace: 'b' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cr' },
      subjects: sa,
    },
    // Other subjects: not ours.
    {
      kind: 'ClusterRoleBinding',
      metadata: { name: 'c1' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cr' },
      subjects: [{ kind: 'ServiceAccount', name: 'vmseed', namespace: 'other' }],
    },
    {
      kind: 'ClusterRoleBinding',
      metadata: { name: 'c2' },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cr' },
      subjects: [],
    },
  ];
  const scoped: ScopedRules[] = rulesOfServiceAccount(objects, ACCOUNT);
  assert.deepEqual(
    scoped.map((s) => s.via),
    ['RoleBinding a/b1 -> Role r', 'RoleBinding b/b2 -> ClusterRole cr'],
  );
  const get = (ns: string) =>
    scopedAllows(scoped, requestAttributes({ method: 'GET', path: `/api/v1/namespaces/${ns}/secrets/s` }));
  assert.deepEqual([get('a'), get('b'), get('c')], [true, true, false]);
  assert.equal(
    scopedAllows(scoped, requestAttributes({ method: 'GET', path: '/api/v1/secrets' })),
    false,
    'a RoleBinding never grants a cluster-wide list',
  );
  // A Role of another namespace does not resolve.
  const wrong = [{ ...objects[1], metadata: { name: 'r', namespace: 'x' } }, objects[2]];
  assert.throws(() => rulesOfServiceAccount(wrong, ACCOUNT), /no Role r to bind/);
  // Unused is judged per rule across the namespaces it is held in.
  assert.deepEqual(checkScopedRbac(scoped, [{ method: 'GET', path: '/api/v1/namespaces/b/secrets/s' }]), {
    denied: [],
    unused: [],
  });
  assert.deepEqual(checkScopedRbac(scoped, [{ method: 'GET', path: '/api/v1/namespaces/b/configmaps/c' }]).unused, [
    { apiGroup: '', resource: 'secrets', verb: 'get' },
  ]);
});

test("bindings name the account as a ServiceAccount (namespace defaulting to a RoleBinding's), as its user, or through the service-account groups", () => {
  const rules: PolicyRule[] = [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }];
  const ref = { apiGroup: 'rbac.authorization.k8s.io', kind: 'ClusterRole', name: 'cr' };
  const binding = (ns: string, subject: Record<string, string>) => ({
    kind: 'RoleBinding',
    metadata: { name: `b-${ns}`, namespace: ns },
    roleRef: ref,
    subjects: [subject],
  });
  const objects = [
    { kind: 'ClusterRole', metadata: { name: 'cr' }, rules },
    binding('vmseed', { kind: 'ServiceAccount', name: 'vmseed' }),
    binding('a', { kind: 'ServiceAccount', name: 'vmseed' }),
    binding('b', { kind: 'User', name: 'system:serviceaccount:vmseed:vmseed' }),
    binding('c', { kind: 'Group', name: 'system:serviceaccounts:vmseed' }),
    binding('d', { kind: 'Group', name: 'system:serviceaccounts:other' }),
    binding('e', { kind: 'User', name: 'vmseed' }),
  ];
  assert.deepEqual(
    rulesOfServiceAccount(objects, ACCOUNT).map((s) => s.namespace),
    ['vmseed', 'b', 'c'],
  );
});
