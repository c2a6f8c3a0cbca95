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

const role = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'ClusterRole') as unknown as {
  rules: PolicyRule[];
};
const ACCOUNT = { namespace: 'vmseed', name: 'vmseed' };

// The agent's API calls as the fake API server recorded them while an agent
// ran test/support/kubevirt-scenario.ts: the informer, a Secret and a
// ConfigMap read, Events created and patched, the seed gate's unpause, and a
// VMI's provisioning annotation patched.
// AGENT_CALLS: cluster-wide; NAMESPACED_CALLS: the same scenario with the
// namespaced variant's --namespaces, authorized by that variant's own
// rendered bindings.
let AGENT_CALLS: RecordedCall[] = [];
let NAMESPACED_CALLS: RecordedCall[] = [];
let NAMESPACED_STATUSES: number[] = [];
// The variants as `kubectl apply -k deploy/<variant>` creates them.
let CLUSTER_WIDE: KubeObject[] = [];
let NAMESPACED: KubeObject[] = [];
const recorded = (requests: Array<{ method: string; path: string; query: Record<string, string> }>): RecordedCall[] =>
  requests.map((r) => ({ method: r.method, path: r.path, query: r.query }));
before(async () => {
  CLUSTER_WIDE = await kustomize(join(ROOT, 'deploy', 'kubevirt'));
  NAMESPACED = await kustomize(join(ROOT, 'deploy', 'namespaced'));
  const clusterWide = await runKubevirtScenario({ rbac: CLUSTER_WIDE });
  assert.deepEqual(clusterWide.unpaused, ['team-a/vm1'], 'the scenario reached the seed gate');
  AGENT_CALLS = recorded(clusterWide.requests);
  const namespaced = await runKubevirtScenario({ namespaces: namespacesFlag(NAMESPACED), rbac: NAMESPACED });
  assert.deepEqual(namespaced.unpaused, ['team-a/vm1'], 'the namespaced scenario reached the seed gate');
  NAMESPACED_CALLS = recorded(namespaced.requests);
  NAMESPACED_STATUSES = namespaced.requests.map((r) => r.status);
});

test('the scenario made every kind of call the agent has', () => {
  const kinds = new Set(
    AGENT_CALLS.map((c) => {
      const a = requestAttributes(c);
      return `${a.apiGroup}/${a.resource}${a.subresource ? '/' + a.subresource : ''}:${a.verb}`;
    }),
  );
  assert.deepEqual([...kinds].sort(), [
    '/configmaps:get',
    '/configmaps:watch',
    '/events:create',
    '/events:patch',
    '/pods:list',
    '/pods:watch',
    '/secrets:get',
    '/secrets:watch',
    'kubevirt.io/virtualmachineinstances:list',
    'kubevirt.io/virtualmachineinstances:patch',
    'kubevirt.io/virtualmachineinstances:watch',
    'subresources.kubevirt.io/virtualmachineinstances/unpause:update',
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
    { apiGroup: '', resource: 'secrets', verb: 'watch' },
    { apiGroup: '', resource: 'configmaps', verb: 'watch' },
    { apiGroup: '', resource: 'pods', verb: 'watch' },
  ]);
});

test('a referenced object is watched by name, which a rule with resourceNames can allow', () => {
  const watches = AGENT_CALLS.map((c) => requestAttributes(c)).filter(
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
  // Any namespace: a Secret of a namespace the scenario never used.
  assert.equal(
    scopedAllows(scoped, requestAttributes({ method: 'GET', path: '/api/v1/namespaces/elsewhere/secrets/s' })),
    true,
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
