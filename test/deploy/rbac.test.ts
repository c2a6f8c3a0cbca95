import { before, test } from 'node:test';
import assert from 'node:assert/strict';
import { checkRbac, requestAttributes, ruleAllows, type PolicyRule, type RecordedCall } from '../support/rbac.ts';
import { findObject, loadYamlDocuments } from '../support/manifests.ts';
import { runKubevirtScenario } from '../support/kubevirt-scenario.ts';

const role = findObject(loadYamlDocuments('manifests/daemonset.yaml'), 'ClusterRole') as unknown as { rules: PolicyRule[] };

// The agent's API calls as the fake API server recorded them while an agent
// ran test/support/kubevirt-scenario.ts: the informer, a Secret and a
// ConfigMap read, Events created and patched, and the seed gate's unpause.
let AGENT_CALLS: RecordedCall[] = [];
before(async () => {
  const { requests, unpaused } = await runKubevirtScenario();
  assert.deepEqual(unpaused, ['team-a/vm1'], 'the scenario reached the seed gate');
  AGENT_CALLS = requests.map((r) => ({ method: r.method, path: r.path, query: r.query }));
});

test('the scenario made every kind of call the agent has', () => {
  const kinds = new Set(AGENT_CALLS.map((c) => {
    const a = requestAttributes(c);
    return `${a.apiGroup}/${a.resource}${a.subresource ? '/' + a.subresource : ''}:${a.verb}`;
  }));
  assert.deepEqual([...kinds].sort(), [
    '/configmaps:get',
    '/events:create',
    '/events:patch',
    '/secrets:get',
    'kubevirt.io/virtualmachineinstances:list',
    'kubevirt.io/virtualmachineinstances:watch',
    'subresources.kubevirt.io/virtualmachineinstances/unpause:update',
  ]);
});

test('request paths map to the attributes the API server authorizes', () => {
  const pick = (method: string, path: string) => {
    const a = requestAttributes({ method, path });
    return [a.apiGroup, a.resource, a.subresource, a.verb, a.namespace, a.name].join(' ');
  };
  assert.equal(pick('GET', '/apis/kubevirt.io/v1/virtualmachineinstances?labelSelector=x'), 'kubevirt.io virtualmachineinstances  list  ');
  assert.equal(pick('GET', '/apis/kubevirt.io/v1/virtualmachineinstances?watch=true'), 'kubevirt.io virtualmachineinstances  watch  ');
  assert.equal(pick('GET', '/apis/kubevirt.io/v1/watch/namespaces/a/virtualmachineinstances'), 'kubevirt.io virtualmachineinstances  watch a ');
  assert.equal(pick('GET', '/apis/kubevirt.io/v1/namespaces/a/virtualmachineinstances/v'), 'kubevirt.io virtualmachineinstances  get a v');
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
  const wider: PolicyRule[] = [...role.rules, { apiGroups: [''], resources: ['pods'], verbs: ['get', 'list'] }];
  const report = checkRbac(wider, AGENT_CALLS);
  assert.deepEqual(report.denied, []);
  assert.deepEqual(report.unused, [
    { apiGroup: '', resource: 'pods', verb: 'get' },
    { apiGroup: '', resource: 'pods', verb: 'list' },
  ]);
  // Dropping a call the agent makes leaves its grant unused.
  const withoutWatch = AGENT_CALLS.filter((c) => requestAttributes(c).verb !== 'watch');
  assert.deepEqual(checkRbac(role.rules, withoutWatch).unused, [{ apiGroup: 'kubevirt.io', resource: 'virtualmachineinstances', verb: 'watch' }]);
});

test('rule matching follows Kubernetes: wildcards, subresource forms, resourceNames', () => {
  const unpause = requestAttributes({ method: 'PUT', path: '/apis/subresources.kubevirt.io/v1/namespaces/a/virtualmachineinstances/v/unpause' });
  assert.equal(ruleAllows({ apiGroups: ['subresources.kubevirt.io'], resources: ['virtualmachineinstances'], verbs: ['update'] }, unpause), false);
  assert.equal(ruleAllows({ apiGroups: ['subresources.kubevirt.io'], resources: ['virtualmachineinstances/*'], verbs: ['update'] }, unpause), true);
  assert.equal(ruleAllows({ apiGroups: ['*'], resources: ['*/unpause'], verbs: ['*'] }, unpause), true);
  assert.equal(ruleAllows({ apiGroups: ['subresources.kubevirt.io'], resources: ['virtualmachineinstances/unpause'], verbs: ['update'], resourceNames: ['w'] }, unpause), false);
  const secret = requestAttributes({ method: 'GET', path: '/api/v1/namespaces/a/secrets/s' });
  assert.equal(ruleAllows({ apiGroups: ['kubevirt.io'], resources: ['secrets'], verbs: ['get'] }, secret), false, 'wrong group');
});

test('calls recorded as {method, path, query} (the fake API server\'s RequestRecord) map the same way', () => {
  const a = requestAttributes({ method: 'GET', path: '/apis/kubevirt.io/v1/virtualmachineinstances', query: { watch: 'true', labelSelector: 'kubevirt.io/nodeName=n' } });
  assert.equal(a.verb, 'watch');
  assert.equal(requestAttributes({ method: 'GET', path: '/apis/kubevirt.io/v1/virtualmachineinstances', query: {} }).verb, 'list');
});

test('every VMI list and watch is scoped to the node by label selector', () => {
  const vmiReads = AGENT_CALLS.map((c) => ({ c, a: requestAttributes(c) })).filter(
    ({ a }) => a.resource === 'virtualmachineinstances' && (a.verb === 'list' || a.verb === 'watch'),
  );
  assert.deepEqual([...new Set(vmiReads.map(({ a }) => a.verb))].sort(), ['list', 'watch']);
  for (const { c } of vmiReads) {
    assert.match(c.query?.labelSelector ?? '', /^kubevirt\.io\/nodeName=[^,]+$/);
  }
});
