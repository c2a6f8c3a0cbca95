// manifests/admission-policy.yaml: the ValidatingAdmissionPolicy that keeps
// the node agent's VMI writes to its own node's VMIs and to its one
// annotation, evaluated with a real CEL implementation (@bufbuild/cel) the
// way the API server evaluates it: matchConstraints, then matchConditions
// (any false: the policy does not apply), then the variables, then every
// validation; an evaluation error counts as a refusal (failurePolicy: Fail).
// The activation is the API server's: `object` and `oldObject` as
// unstructured maps (JSON integers are CEL ints), `request` the
// AdmissionRequest as JSON (userInfo.extra left out when empty, as
// `omitempty` does), `params` null, `namespaceObject` the VMI's Namespace.
// The agent's request is the patch its own VmiAnnotationWriter sends,
// applied as a merge patch the way the API server applies it.
// The evaluator is test/support/admission-policy-eval.ts, which the fake API
// server enforces stored policies with too (admission-policy-enforced.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parse } from '@bufbuild/cel';
import { findObject, loadYamlDocuments, validateBuiltin } from '../support/manifests.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { mergePatch } from '../support/fake-kube-vmi-patch.ts';
import { evaluate, evaluatePolicy, toCel, type AdmissionAttributes } from '../support/admission-policy-eval.ts';
import type { KubeApi } from '../../src/kube/api-client.ts';
import { VmiAnnotationWriter } from '../../src/agent/provisioning/annotation-writer.ts';
import { PROVISIONING_ANNOTATION } from '../../src/agent/provisioning/summary.ts';

type Any = any;
interface Expression {
  name: string;
  expression: string;
}
interface Validation {
  expression: string;
  message: string;
  reason?: string;
  messageExpression?: string;
}
interface Rule {
  apiGroups: string[];
  apiVersions: string[];
  operations: string[];
  resources: string[];
}
interface Policy {
  metadata: { name: string; labels?: Record<string, string> };
  spec: {
    failurePolicy: string;
    paramKind?: unknown;
    matchConstraints: { resourceRules: Rule[] };
    matchConditions: Expression[];
    variables: Expression[];
    validations: Validation[];
    auditAnnotations?: unknown;
  };
}

const documents = loadYamlDocuments('manifests/admission-policy.yaml');
const POLICY = findObject(documents, 'ValidatingAdmissionPolicy') as unknown as Policy;
const BINDING = findObject(documents, 'ValidatingAdmissionPolicyBinding') as Any;
const AGENT = 'system:serviceaccount:vmseed:vmseed';
const NODE = 'node-a';
const OTHER_NODE = 'node-b';
const NODE_NAME_KEY = 'authentication.kubernetes.io/node-name';

// Which validation refused, by a phrase of its message.
const RULES = {
  noNode: 'names no node',
  otherNode: 'is on another node',
  annotations: 'changes another annotation',
  labels: 'changes its labels',
  owners: 'changes its ownerReferences or finalizers',
  spec: 'changes its spec',
  status: 'changes its status',
} as const;
type RuleName = keyof typeof RULES;

// --- the evaluator (test/support/admission-policy-eval.ts) ------------------

interface AdmissionInput {
  username: string;
  extra?: Record<string, string[]>;
  oldObject: Any;
  object: Any;
  operation?: string;
  subResource?: string;
}

interface Decision {
  matched: boolean;
  // Evaluation errors (a refusal, failurePolicy: Fail) and failed validations.
  errors: string[];
  failed: Array<{ rule: RuleName | 'unknown'; reason: string; message: string }>;
  allowed: boolean;
}

// The request as the API server admits the agent's PATCH of a VMI (an
// UPDATE): kind/resource of the request, the user (a service account's
// groups), the operation and its options.
function attributes(input: AdmissionInput): AdmissionAttributes {
  const { metadata } = input.oldObject as { metadata: { name: string; namespace: string } };
  return {
    uid: '5b8c2f3e-2d0a-4a53-8f77-3e0c1f1b9b21',
    kind: { group: 'kubevirt.io', version: 'v1', kind: 'VirtualMachineInstance' },
    resource: { group: 'kubevirt.io', version: 'v1', resource: 'virtualmachineinstances' },
    ...(input.subResource ? { subResource: input.subResource } : {}),
    name: metadata.name,
    namespace: metadata.namespace,
    operation: (input.operation ?? 'UPDATE') as AdmissionAttributes['operation'],
    userInfo: {
      username: input.username,
      uid: 'e1f5c1d4-7d5c-4a07-9a4b-1f0c8e3f6a10',
      groups: [
        'system:serviceaccounts',
        `system:serviceaccounts:${input.username.split(':')[2]}`,
        'system:authenticated',
      ],
      ...(input.extra ? { extra: input.extra } : {}),
    },
    dryRun: false,
    options: { apiVersion: 'meta.k8s.io/v1', kind: 'PatchOptions' },
    oldObject: input.oldObject,
    object: input.object,
  };
}

function ruleOf(message: string): RuleName | 'unknown' {
  const found = (Object.keys(RULES) as RuleName[]).filter((k) => message.includes(RULES[k]));
  return found.length === 1 ? found[0] : 'unknown';
}

function admit(input: AdmissionInput, policy: Policy = POLICY): Decision {
  const d = evaluatePolicy(policy, attributes(input));
  const failed = d.failed.map((f) => ({ rule: ruleOf(f.message), reason: f.reason, message: f.message }));
  return { matched: d.matched, errors: d.errors, failed, allowed: d.errors.length === 0 && failed.length === 0 };
}

// Refused by exactly the one rule, not by an evaluation error.
function assertRefusedBy(decision: Decision, rule: RuleName, what: string): void {
  assert.equal(decision.matched, true, `${what}: the policy applies`);
  assert.deepEqual(decision.errors, [], `${what}: no evaluation error`);
  assert.deepEqual(
    decision.failed.map((f) => f.rule),
    [rule],
    `${what}: refused by the ${rule} rule alone`,
  );
  assert.equal(decision.allowed, false, what);
}

function assertAllowed(decision: Decision, what: string): void {
  assert.deepEqual(decision.errors, [], `${what}: no evaluation error`);
  assert.deepEqual(decision.failed, [], `${what}: no validation failed`);
  assert.equal(decision.allowed, true, what);
}

// --- the objects and the requests ---------------------------------------------

// A running VMI as KubeVirt keeps it (trimmed): owned by its VM, scheduled
// on `node`, with KubeVirt's labels, annotations and finalizers.
function vmiOn(node: string | undefined, annotations: Record<string, string> = {}): Any {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name: 'vm1',
      namespace: 'team-a',
      uid: '0d6c3a5e-1b7f-4f0e-9a55-6c2f1e8d7b42',
      resourceVersion: '48213',
      generation: 9,
      creationTimestamp: '2026-01-10T09:14:03Z',
      labels: {
        'kubevirt.io/domain': 'vm1',
        ...(node ? { 'kubevirt.io/nodeName': node } : {}),
        'vm.kubevirt.io/name': 'vm1',
      },
      annotations: {
        'kubevirt.io/latest-observed-api-version': 'v1',
        'kubevirt.io/storage-observed-api-version': 'v1',
        ...annotations,
      },
      ownerReferences: [
        {
          apiVersion: 'kubevirt.io/v1',
          kind: 'VirtualMachine',
          name: 'vm1',
          uid: '8a2f0c1b-5e3d-4c6a-b7e9-0f1d2c3b4a59',
          controller: true,
          blockOwnerDeletion: true,
        },
      ],
      finalizers: ['kubevirt.io/virtualMachineControllerFinalize', 'foregroundDeleteVirtualMachine'],
      managedFields: [
        {
          manager: 'virt-controller',
          operation: 'Update',
          apiVersion: 'kubevirt.io/v1',
          time: '2026-01-10T09:14:03Z',
          fieldsType: 'FieldsV1',
          fieldsV1: { 'f:spec': {} },
        },
      ],
    },
    spec: {
      architecture: 'amd64',
      domain: {
        cpu: { cores: 2, sockets: 1, threads: 1, model: 'host-model' },
        memory: { guest: '2Gi' },
        devices: {
          disks: [
            { name: 'rootdisk', disk: { bus: 'virtio' } },
            { name: 'cloudinitdisk', disk: { bus: 'virtio' } },
          ],
          interfaces: [{ name: 'default', masquerade: {} }],
        },
        resources: { requests: { memory: '2Gi' } },
      },
      networks: [{ name: 'default', pod: {} }],
      terminationGracePeriodSeconds: 180,
      volumes: [
        { name: 'rootdisk', containerDisk: { image: 'quay.io/containerdisks/debian:12' } },
        { name: 'cloudinitdisk', cloudInitNoCloud: { secretRef: { name: 'vm1-cloud-init' } } },
      ],
    },
    status: {
      phase: node ? 'Running' : 'Scheduling',
      ...(node ? { nodeName: node } : {}),
      activePods: { '3c1b2a0d-9e8f-4a7b-8c6d-5e4f3a2b1c0d': node ?? '' },
      conditions: [{ type: 'Ready', status: 'True', lastProbeTime: null, lastTransitionTime: '2026-01-10T09:14:20Z' }],
      interfaces: [{ name: 'default', ipAddress: '10.244.1.17', mac: '02:42:ac:11:00:02' }],
      guestOSInfo: {},
      qosClass: 'Burstable',
    },
  };
}

// What the API server makes of a merge patch before admission: the patch
// applied, a new resourceVersion, the manager's managedFields entry, and (a
// CRD without a status subresource) generation bumped when anything outside
// metadata changed.
function afterPatch(old: Any, patch: unknown, manager = 'vmseed'): Any {
  const next = mergePatch(structuredClone(old), patch) as Any;
  next.metadata.resourceVersion = String(Number(old.metadata.resourceVersion) + 1);
  next.metadata.managedFields = [
    ...old.metadata.managedFields,
    {
      manager,
      operation: 'Update',
      apiVersion: 'kubevirt.io/v1',
      time: '2026-01-10T09:20:00Z',
      fieldsType: 'FieldsV1',
      fieldsV1: {},
    },
  ];
  const outside = (o: Any) => JSON.stringify({ ...o, metadata: undefined });
  if (outside(next) !== outside(old)) next.metadata.generation = old.metadata.generation + 1;
  return next;
}

// The request the agent's annotation writer sends for one VMI.
async function agentPatch(vmi: Any, value: string): Promise<{ method: string; path: string; body: Any; type: string }> {
  const calls: Array<{ method: string; path: string; body: Any; type: string }> = [];
  const api: KubeApi = {
    request: async (method, path, body, contentType) => {
      calls.push({ method, path, body, type: contentType ?? '' });
      return { status: 200, body: {} };
    },
  };
  const key = `${vmi.metadata.namespace}/${vmi.metadata.name}`;
  const writer = new VmiAnnotationWriter({
    api,
    annotation: PROVISIONING_ANNOTATION,
    logger: captureLogger('error').logger,
    keys: () => [key],
    wanted: () => ({
      namespace: vmi.metadata.namespace,
      name: vmi.metadata.name,
      uid: vmi.metadata.uid,
      value,
      current: vmi.metadata.annotations?.[PROVISIONING_ANNOTATION],
    }),
  });
  writer.touch(key);
  await writer.idle();
  await writer.stop();
  assert.equal(calls.length, 1, 'the writer sent one request');
  return calls[0];
}

// A pod-bound projected token's user info extra on a 1.30+ API server.
function podToken(node: string): Record<string, string[]> {
  return {
    'authentication.kubernetes.io/credential-id': ['JTI=7f3e9b52-0c4d-4e1a-9b8f-2d6c5a4e3f10'],
    [NODE_NAME_KEY]: [node],
    'authentication.kubernetes.io/node-uid': ['4d2c1b0a-9f8e-4d7c-a6b5-c4d3e2f1a0b9'],
    'authentication.kubernetes.io/pod-name': ['vmseed-7xk2p'],
    'authentication.kubernetes.io/pod-uid': ['9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b'],
  };
}

const SUMMARY = '{"state":"running","boot":1,"stage":"config"}';
const SUMMARY2 = '{"state":"done","boot":1,"result":"success"}';

// The agent (own node's token) sending `patch` for `old`.
// `extra` undefined: a token with no user info extra at all.
const byAgent = (old: Any, patch: unknown, extra: Record<string, string[]> | undefined) =>
  admit({ username: AGENT, extra, oldObject: old, object: afterPatch(old, patch) });
const ownNode = podToken(NODE);
const ours = (value: string) => ({ metadata: { annotations: { [PROVISIONING_ANNOTATION]: value } } });

// --- the tests ----------------------------------------------------------------

test('admission-policy.yaml: a valid v1 ValidatingAdmissionPolicy and its binding, enforcing (Deny) and failing closed', async () => {
  assert.deepEqual(documents.map((d) => d.kind).sort(), [
    'ValidatingAdmissionPolicy',
    'ValidatingAdmissionPolicyBinding',
  ]);
  for (const o of documents) {
    assert.equal(o.apiVersion, 'admissionregistration.k8s.io/v1', o.kind);
    assert.equal(o.metadata.labels?.['app.kubernetes.io/name'], 'vmseed', o.kind);
    assert.equal(o.metadata.namespace, undefined, `${o.kind} is cluster-scoped`);
    await assert.doesNotReject(validateBuiltin(o), o.kind);
  }
  const { spec } = POLICY;
  assert.equal(spec.failurePolicy, 'Fail');
  assert.equal(spec.paramKind, undefined, 'no parameters');
  assert.deepEqual(spec.matchConstraints.resourceRules, [
    {
      apiGroups: ['kubevirt.io'],
      apiVersions: ['*'],
      operations: ['UPDATE'],
      resources: ['virtualmachineinstances'],
    },
  ]);
  assert.equal(BINDING.spec.policyName, POLICY.metadata.name, 'the binding applies this policy');
  assert.deepEqual(BINDING.spec.validationActions, ['Deny']);
  assert.equal(BINDING.spec.paramRef, undefined);
  assert.equal(BINDING.spec.matchResources, undefined, 'every namespace');
});

test('every expression parses, and every message is one line naming the policy and what to do', () => {
  const all = [...POLICY.spec.matchConditions, ...POLICY.spec.variables, ...POLICY.spec.validations];
  for (const e of all) assert.doesNotThrow(() => parse(e.expression), e.expression);
  assert.equal(POLICY.spec.validations.length, Object.keys(RULES).length, 'one validation per rule');
  for (const v of POLICY.spec.validations) {
    assert.equal(v.messageExpression, undefined);
    assert.ok(!v.message.includes('\n'), `one line: ${v.message}`);
    assert.ok(v.message.startsWith(`${POLICY.metadata.name}: `), v.message);
    assert.notEqual(ruleOf(v.message), 'unknown', `names one rule: ${v.message}`);
    assert.match(
      v.message,
      /Patch that one annotation alone|--provisioning-annotation=false|Only the agent on the VMI's node/,
    );
  }
  const [first] = POLICY.spec.validations;
  assert.equal(ruleOf(first.message), 'noNode', 'a token without a node is told so first');
  assert.equal(first.reason, 'Forbidden', 'no write of that agent can succeed: a 403 pauses them');
  assert.match(first.message, /ServiceAccountTokenPodNodeInfo/);
  assert.match(first.message, /--provisioning-annotation=false/);
  for (const v of POLICY.spec.validations.slice(1)) assert.equal(v.reason, 'Invalid', 'one VMI refused (422)');
});

test("the matchCondition is the DaemonSet's ServiceAccount, and only it", () => {
  const daemonset = loadYamlDocuments('manifests/daemonset.yaml');
  const ds = findObject(daemonset, 'DaemonSet', 'vmseed') as Any;
  const account = findObject(daemonset, 'ServiceAccount', ds.spec.template.spec.serviceAccountName);
  assert.equal(`system:serviceaccount:${account.metadata.namespace}:${account.metadata.name}`, AGENT);
  assert.equal(POLICY.spec.matchConditions.length, 1);
  const request = (username: string) => ({ request: toCel({ userInfo: { username } }) });
  const [condition] = POLICY.spec.matchConditions;
  assert.equal(evaluate(condition.expression, request(AGENT)), true);
  for (const other of [
    'system:serviceaccount:kubevirt:kubevirt-controller',
    'system:serviceaccount:kubevirt:kubevirt-handler',
    'system:serviceaccount:vmseed:vmseed-cluster',
    'system:serviceaccount:other:vmseed',
    'system:node:node-a',
    'kubernetes-admin',
  ])
    assert.equal(evaluate(condition.expression, request(other)), false, other);
});

test("the agent's own patch of a VMI on its node is allowed: the annotation added, then changed", async () => {
  const vmi = vmiOn(NODE);
  const first = await agentPatch(vmi, SUMMARY);
  assert.equal(first.method, 'PATCH');
  assert.equal(first.type, 'application/merge-patch+json');
  assert.equal(first.path, '/apis/kubevirt.io/v1/namespaces/team-a/virtualmachineinstances/vm1');
  const added = afterPatch(vmi, first.body);
  assert.equal(added.metadata.annotations[PROVISIONING_ANNOTATION], SUMMARY);
  assert.notEqual(added.metadata.resourceVersion, vmi.metadata.resourceVersion, 'the server moved resourceVersion');
  assert.notDeepEqual(added.metadata.managedFields, vmi.metadata.managedFields, 'and managedFields');
  assertAllowed(admit({ username: AGENT, extra: podToken(NODE), oldObject: vmi, object: added }), 'added');

  const second = await agentPatch(added, SUMMARY2);
  const changed = afterPatch(added, second.body);
  assert.equal(changed.metadata.annotations[PROVISIONING_ANNOTATION], SUMMARY2);
  assertAllowed(admit({ username: AGENT, extra: podToken(NODE), oldObject: added, object: changed }), 'changed');

  // A VMI with no annotations at all (the map left out) gets its first one.
  const bare = vmiOn(NODE);
  delete bare.metadata.annotations;
  assertAllowed(
    byAgent(bare, (await agentPatch(bare, SUMMARY)).body, ownNode),
    'first annotation of a VMI without any',
  );
});

test("another node's VMI is refused, and so is a VMI on no node yet", async () => {
  const theirs = vmiOn(OTHER_NODE);
  assertRefusedBy(byAgent(theirs, (await agentPatch(theirs, SUMMARY)).body, ownNode), 'otherNode', 'another node');
  const unscheduled = vmiOn(undefined);
  assertRefusedBy(byAgent(unscheduled, ours(SUMMARY), ownNode), 'otherNode', 'no status.nodeName');
  const noStatus = vmiOn(NODE);
  delete noStatus.status;
  assertRefusedBy(byAgent(noStatus, ours(SUMMARY), ownNode), 'otherNode', 'no status');
  // The node is the one before the request: moving the VMI in the same
  // request does not help (and is a status change besides).
  const moved = admit({
    username: AGENT,
    extra: podToken(OTHER_NODE),
    oldObject: vmiOn(NODE),
    object: afterPatch(vmiOn(NODE), { ...ours(SUMMARY), status: { nodeName: OTHER_NODE } }),
  });
  assert.deepEqual(moved.failed.map((f) => f.rule).sort(), ['otherNode', 'status']);
});

// The API server reports every failed validation and answers with the
// first one's reason: here Forbidden, with the no-node message first (the
// node rule fails too: no node is this VMI's node).
test('a token that names no node is refused (Forbidden) before anything else', () => {
  const vmi = vmiOn(NODE);
  const { [NODE_NAME_KEY]: _node, ...withoutNode } = podToken(NODE);
  const cases: Array<[string, Record<string, string[]> | undefined]> = [
    ['legacy token: no extra at all', undefined],
    ['pod-bound token without node info', withoutNode],
    ['an empty node-name list', { [NODE_NAME_KEY]: [] }],
    ['more than one node name', { [NODE_NAME_KEY]: [OTHER_NODE, NODE] }],
  ];
  for (const [what, extra] of cases) {
    const decision = byAgent(vmi, ours(SUMMARY), extra);
    assert.deepEqual(decision.errors, [], what);
    assert.deepEqual(
      decision.failed.map((f) => [f.rule, f.reason]),
      [
        ['noNode', 'Forbidden'],
        ['otherNode', 'Invalid'],
      ],
      what,
    );
    assert.equal(decision.allowed, false, what);
  }
});

test('another annotation added, changed or removed is refused', () => {
  const vmi = vmiOn(NODE, { 'team.example/owner': 'alice' });
  const cases: Array<[string, unknown]> = [
    ['added', { metadata: { annotations: { 'team.example/cost-center': '42' } } }],
    ['changed', { metadata: { annotations: { 'team.example/owner': 'mallory' } } }],
    ['removed', { metadata: { annotations: { 'team.example/owner': null } } }],
    ['kubevirt.io/ changed', { metadata: { annotations: { 'kubevirt.io/latest-observed-api-version': 'v1alpha3' } } }],
    ['with ours', { metadata: { annotations: { [PROVISIONING_ANNOTATION]: SUMMARY, 'team.example/owner': 'bob' } } }],
    ['all of them', { metadata: { annotations: null } }],
  ];
  for (const [what, patch] of cases) assertRefusedBy(byAgent(vmi, patch, ownNode), 'annotations', what);
});

test('a label change is refused', () => {
  const vmi = vmiOn(NODE);
  const cases: Array<[string, unknown]> = [
    ['added', { metadata: { labels: { 'team.example/tier': 'gold' } } }],
    ['the node label changed', { metadata: { labels: { 'kubevirt.io/nodeName': OTHER_NODE } } }],
    ['removed', { metadata: { labels: { 'vm.kubevirt.io/name': null } } }],
    [
      'with ours',
      { metadata: { labels: { 'team.example/tier': 'gold' }, annotations: ours(SUMMARY).metadata.annotations } },
    ],
  ];
  for (const [what, patch] of cases) assertRefusedBy(byAgent(vmi, patch, ownNode), 'labels', what);
});

test('an ownerReferences or finalizers change is refused', () => {
  const vmi = vmiOn(NODE);
  assertRefusedBy(byAgent(vmi, { metadata: { finalizers: [] } }, ownNode), 'owners', 'finalizers dropped');
  assertRefusedBy(byAgent(vmi, { metadata: { finalizers: null } }, ownNode), 'owners', 'finalizers removed');
  assertRefusedBy(byAgent(vmi, { metadata: { ownerReferences: null } }, ownNode), 'owners', 'orphaned');
  const reowned = [{ ...vmi.metadata.ownerReferences[0], name: 'other-vm' }];
  assertRefusedBy(byAgent(vmi, { metadata: { ownerReferences: reowned } }, ownNode), 'owners', 'another owner');
});

test('a spec change is refused', () => {
  const vmi = vmiOn(NODE);
  const cases: Array<[string, unknown]> = [
    ['cpu', { spec: { domain: { cpu: { cores: 4 } } } }],
    [
      'a volume swapped',
      { spec: { volumes: [{ name: 'rootdisk', containerDisk: { image: 'evil.example/disk:latest' } }] } },
    ],
    ['a field added', { spec: { evictionStrategy: 'None' } }],
    ['a field removed', { spec: { terminationGracePeriodSeconds: null } }],
    ['with ours', { ...ours(SUMMARY), spec: { domain: { memory: { guest: '64Gi' } } } }],
  ];
  for (const [what, patch] of cases) assertRefusedBy(byAgent(vmi, patch, ownNode), 'spec', what);
});

test('a status change is refused', () => {
  const vmi = vmiOn(NODE);
  const cases: Array<[string, unknown]> = [
    ['phase', { status: { phase: 'Failed' } }],
    ['an interface', { status: { interfaces: [{ name: 'default', ipAddress: '10.0.0.66' }] } }],
    ['a field added', { status: { migrationState: { completed: true } } }],
    ['with ours', { ...ours(SUMMARY), status: { conditions: [] } }],
  ];
  for (const [what, patch] of cases) assertRefusedBy(byAgent(vmi, patch, ownNode), 'status', what);
});

test("other users are not matched: KubeVirt's controller changes the spec, an admin anything", () => {
  const vmi = vmiOn(NODE);
  const spec = afterPatch(vmi, { spec: { domain: { cpu: { cores: 4 } } } }, 'virt-controller');
  for (const username of [
    'system:serviceaccount:kubevirt:kubevirt-controller',
    'system:serviceaccount:kubevirt:kubevirt-handler',
    'kubernetes-admin',
  ]) {
    const decision = admit({ username, extra: podToken(OTHER_NODE), oldObject: vmi, object: spec });
    assert.deepEqual(decision, { matched: false, errors: [], failed: [], allowed: true }, username);
  }
  // Nor does it see other resources or operations.
  const other = { username: AGENT, extra: podToken(OTHER_NODE), oldObject: vmi, object: spec };
  assert.equal(admit({ ...other, operation: 'CREATE' }).matched, false, 'CREATE');
  assert.equal(admit({ ...other, subResource: 'status' }).matched, false, 'no status subresource on VMIs');
  // The same change by the agent is refused.
  assertRefusedBy(admit({ ...other, extra: podToken(NODE) }), 'spec', 'the agent');
});

test('weakening any rule lets one of the refused requests through', () => {
  const vmi = vmiOn(NODE);
  const refused: Array<() => AdmissionInput> = [
    () => ({ username: AGENT, extra: undefined, oldObject: vmi, object: afterPatch(vmi, ours(SUMMARY)) }),
    () => ({
      username: AGENT,
      extra: podToken(NODE),
      oldObject: vmiOn(OTHER_NODE),
      object: afterPatch(vmiOn(OTHER_NODE), ours(SUMMARY)),
    }),
    ...[
      { metadata: { annotations: { 'team.example/owner': 'mallory' } } },
      { metadata: { labels: { 'team.example/tier': 'gold' } } },
      { metadata: { finalizers: [] } },
      { spec: { domain: { cpu: { cores: 4 } } } },
      { status: { phase: 'Failed' } },
    ].map((patch) => () => ({
      username: AGENT,
      extra: podToken(NODE),
      oldObject: vmi,
      object: afterPatch(vmi, patch),
    })),
  ];
  for (const make of refused) assert.equal(admit(make()).allowed, false);
  POLICY.spec.validations.forEach((validation, i) => {
    const weakened = structuredClone(POLICY);
    weakened.spec.validations[i] = { ...validation, expression: 'true' };
    if (ruleOf(validation.message) === 'noNode') {
      // Without it a token naming no node still matches no VMI's node, but
      // the agent is no longer told why, nor paused (403).
      const legacy = admit(refused[0](), weakened);
      assert.deepEqual(
        legacy.failed.map((f) => [f.rule, f.reason]),
        [['otherNode', 'Invalid']],
      );
      return;
    }
    assert.ok(
      refused.some((make) => admit(make(), weakened).allowed),
      `without "${ruleOf(validation.message)}" some refused request would pass`,
    );
  });
  // And a matchCondition true for everyone would refuse KubeVirt's own
  // writes: the condition is what leaves them alone.
  const everyone = structuredClone(POLICY);
  everyone.spec.matchConditions = [{ name: 'everyone', expression: 'true' }];
  const controller = {
    username: 'system:serviceaccount:kubevirt:kubevirt-controller',
    oldObject: vmi,
    object: afterPatch(vmi, { spec: { domain: { cpu: { cores: 4 } } } }),
  };
  assert.equal(admit(controller).allowed, true);
  assert.equal(admit(controller, everyone).allowed, false);
});
