// The node agent's VMI writes against an API server that enforces the
// install's RBAC and its ValidatingAdmissionPolicy (manifests/
// admission-policy.yaml, rendered into deploy/kubevirt): the fake API server
// (fake-kube.ts) evaluates the stored policy with the same CEL evaluator as
// admission-policy.test.ts (admission-policy-eval.ts) and refuses as the API
// server's ValidatingAdmissionPolicy plugin does. RBAC grants the agent
// `patch` on every VMI; the policy narrows it to the one annotation of the
// VMIs on the node its token names (user info extra
// authentication.kubernetes.io/node-name). Requests go over the wire with
// the agent's own token, the annotation patch is the one the real
// VmiAnnotationWriter sends, and at the end the real agent writes its
// summary with the policy on.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ADMIN_USER, FakeKube } from '../support/fake-kube.ts';
import { kustomize } from '../support/kustomize.ts';
import { findObject, loadYamlDocuments, ROOT, type KubeObject } from '../support/manifests.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { AttachingInjector, FakeClient } from '../support/seed-read-doubles.ts';
import { startAgent, tempDir, vmi, waitFor, NODE } from '../support/agent-harness.ts';
import { KubeConnectionApi, type KubeApi } from '../../src/kube/api-client.ts';
import { VmiAnnotationWriter } from '../../src/agent/provisioning/annotation-writer.ts';
import { PROVISIONING_ANNOTATION } from '../../src/agent/provisioning/summary.ts';
import { progressReportPlanner } from '../../src/agent/provisioning/report-plan.ts';
import type { VmiObject } from '../../src/api/objects.ts';

type Any = any;
const OTHER_NODE = 'node-b';
const NODE_NAME_KEY = 'authentication.kubernetes.io/node-name';
const ADMIN_TOKEN = 'admin-token';
const POLICY = findObject(loadYamlDocuments('manifests/admission-policy.yaml'), 'ValidatingAdmissionPolicy') as Any;
const POLICY_NAME: string = POLICY.metadata.name;
const BINDING_NAME: string = findObject(
  loadYamlDocuments('manifests/admission-policy.yaml'),
  'ValidatingAdmissionPolicyBinding',
).metadata.name;
const MERGE = 'application/merge-patch+json';
const SUMMARY = '{"state":"running","boot":1,"stage":"config"}';

// The policy's message for the validation whose message has `phrase`.
function ruleMessage(phrase: string): string {
  const found = (POLICY.spec.validations as Array<{ message: string }>).filter((v) => v.message.includes(phrase));
  assert.equal(found.length, 1, phrase);
  return found[0].message.trim();
}

// The API server's Status for the policy's refusal (ValidatingAdmissionPolicy
// plugin, dispatcher.go, through admission.NewForbidden).
function policyStatus(name: string, reason: string, code: number, message: string): Record<string, unknown> {
  const inner = `ValidatingAdmissionPolicy '${POLICY_NAME}' with binding '${BINDING_NAME}' denied request: ${message}`;
  return {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message: `virtualmachineinstances.kubevirt.io "${name}" is forbidden: ${inner}`,
    reason,
    details: { name, group: 'kubevirt.io', kind: 'virtualmachineinstances', causes: [{ message: inner }] },
    code,
  };
}

// A pod-bound projected token's user info extra on a 1.30+ API server.
function podToken(node: string): Record<string, string[]> {
  return {
    'authentication.kubernetes.io/credential-id': ['JTI=7f3e9b52-0c4d-4e1a-9b8f-2d6c5a4e3f10'],
    [NODE_NAME_KEY]: [node],
    'authentication.kubernetes.io/pod-name': ['vmseed-7xk2p'],
    'authentication.kubernetes.io/pod-uid': ['9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b'],
  };
}

let rendered: KubeObject[] | undefined;
const renderedKubevirt = async () => (rendered ??= await kustomize(`${ROOT}deploy/kubevirt`));

// The fake with deploy/kubevirt's RBAC and (unless `policy` false) its
// policy stored, VMIs vm-a on node-a and vm-b on node-b, the agent's token
// naming node-a.
async function cluster(t: { after(fn: () => Promise<void>): void }, policy = true) {
  const objects = await renderedKubevirt();
  assert.ok(
    objects.some((o) => o.kind === 'ValidatingAdmissionPolicy'),
    'deploy/kubevirt holds the policy',
  );
  const fake = await FakeKube.start({
    rbac: objects,
    adminTokens: [ADMIN_TOKEN],
    ...(policy ? { admissionPolicies: objects } : {}),
  });
  const agentToken = 'agent-token';
  fake.acceptTokens(agentToken);
  fake.setTokenExtra(agentToken, podToken(NODE));
  const agent = fake.connection(agentToken);
  const admin = fake.connection(ADMIN_TOKEN);
  t.after(async () => {
    await agent.close();
    await admin.close();
    await fake.close();
  });
  for (const [name, node] of [
    ['vm-a', NODE],
    ['vm-b', OTHER_NODE],
  ]) {
    const v = vmi(name, { namespace: 'team-a', node, phase: 'Running' });
    v.metadata.annotations!['team.example/owner'] = 'alice';
    v.metadata.labels!['team.example/tier'] = 'silver';
    fake.applyVmi(v);
  }
  return {
    fake,
    agentToken,
    agentApi: new KubeConnectionApi(agent, { timeoutMs: 5000 }) as KubeApi,
    adminApi: new KubeConnectionApi(admin, { timeoutMs: 5000 }) as KubeApi,
    vmi: (name: string) => fake.getVmi('team-a', name)!,
  };
}

const messageOf = (body: unknown): string => String((body as { message?: unknown }).message);
const path = (name: string) => `/apis/kubevirt.io/v1/namespaces/team-a/virtualmachineinstances/${name}`;

// What the real annotation writer sends for one VMI and what it is answered.
async function writerPatch(api: KubeApi, v: VmiObject, value: string): Promise<{ status: number; body: Any }> {
  const answers: Array<{ method: string; type: string | undefined; status: number; body: Any }> = [];
  const recording: KubeApi = {
    request: async (method, p, body, contentType, signal) => {
      const answer = await api.request(method, p, body, contentType, signal);
      answers.push({ method, type: contentType, status: answer.status, body: answer.body });
      return answer;
    },
  };
  const key = `${v.metadata.namespace}/${v.metadata.name}`;
  const writer = new VmiAnnotationWriter({
    api: recording,
    annotation: PROVISIONING_ANNOTATION,
    logger: captureLogger('fatal').logger,
    keys: () => [key],
    wanted: () => ({
      namespace: v.metadata.namespace!,
      name: v.metadata.name,
      uid: v.metadata.uid!,
      value,
      current: v.metadata.annotations?.[PROVISIONING_ANNOTATION],
    }),
  });
  writer.touch(key);
  await writer.idle();
  await writer.stop();
  assert.equal(answers.length, 1, 'the writer sent one request');
  assert.equal(answers[0].method, 'PATCH');
  assert.equal(answers[0].type, MERGE);
  return answers[0];
}

test("the agent's own annotation on its own node's VMI is written; another node's VMI is refused by the policy", async (t) => {
  const c = await cluster(t);
  const own = await writerPatch(c.agentApi, c.vmi('vm-a'), SUMMARY);
  assert.equal(own.status, 200, JSON.stringify(own.body));
  assert.equal(c.vmi('vm-a').metadata.annotations?.[PROVISIONING_ANNOTATION], SUMMARY);
  assert.equal(own.body.metadata.annotations[PROVISIONING_ANNOTATION], SUMMARY);

  const before = structuredClone(c.vmi('vm-b'));
  const theirs = await writerPatch(c.agentApi, before, SUMMARY);
  assert.equal(theirs.status, 422);
  assert.deepEqual(theirs.body, policyStatus('vm-b', 'Invalid', 422, ruleMessage('is on another node')));
  assert.deepEqual(c.vmi('vm-b'), before, 'vm-b unchanged');
  const last = c.fake.requests.at(-1)!;
  assert.deepEqual(
    [last.verb, last.resource, last.name, last.status, last.user],
    ['patch', 'virtualmachineinstances', 'vm-b', 422, c.fake.user],
  );

  // The node is the token's: a token naming node-b may write vm-b, not vm-a.
  c.fake.setTokenExtra(c.agentToken, podToken(OTHER_NODE));
  assert.equal((await writerPatch(c.agentApi, c.vmi('vm-b'), SUMMARY)).status, 200);
  const a = await writerPatch(c.agentApi, c.vmi('vm-a'), '{"state":"done"}');
  assert.equal(a.status, 422);
  assert.match(messageOf(a.body), /is on another node/);
});

test('on its own node, a patch of anything but that one annotation is refused', async (t) => {
  const c = await cluster(t);
  const uid = c.vmi('vm-a').metadata.uid;
  const cases: Array<[string, unknown, string]> = [
    [
      'another annotation',
      { metadata: { uid, annotations: { 'team.example/owner': 'mallory' } } },
      'changes another annotation',
    ],
    [
      'another annotation beside ours',
      { metadata: { uid, annotations: { [PROVISIONING_ANNOTATION]: SUMMARY, 'team.example/cost': '42' } } },
      'changes another annotation',
    ],
    ['a label', { metadata: { uid, labels: { 'team.example/tier': 'gold' } } }, 'changes its labels'],
    ['the spec', { metadata: { uid }, spec: { domain: { cpu: { cores: 4 } } } }, 'changes its spec'],
    ['the status', { metadata: { uid }, status: { phase: 'Failed' } }, 'changes its status'],
  ];
  for (const [what, patch, phrase] of cases) {
    const before = structuredClone(c.vmi('vm-a'));
    const answer = await c.agentApi.request('PATCH', path('vm-a'), patch, MERGE);
    assert.equal(answer.status, 422, what);
    assert.deepEqual(answer.body, policyStatus('vm-a', 'Invalid', 422, ruleMessage(phrase)), what);
    assert.deepEqual(c.vmi('vm-a'), before, `${what}: unchanged`);
  }
  // The annotation alone still goes through.
  const ours = await c.agentApi.request(
    'PATCH',
    path('vm-a'),
    { metadata: { uid, annotations: { [PROVISIONING_ANNOTATION]: SUMMARY } } },
    MERGE,
  );
  assert.equal(ours.status, 200);
});

test("the agent's token without a node (a legacy token) is refused: Forbidden, saying why", async (t) => {
  const c = await cluster(t);
  const cases: Array<[string, Record<string, string[]> | undefined]> = [
    ['no extra at all', undefined],
    ['pod-bound, without node-name', { 'authentication.kubernetes.io/pod-name': ['vmseed-7xk2p'] }],
  ];
  for (const [what, extra] of cases) {
    c.fake.setTokenExtra(c.agentToken, extra);
    const answer = await writerPatch(c.agentApi, c.vmi('vm-a'), SUMMARY);
    assert.equal(answer.status, 403, what);
    assert.deepEqual(answer.body, policyStatus('vm-a', 'Forbidden', 403, ruleMessage('names no node')), what);
    assert.match(messageOf(answer.body), /ServiceAccountTokenPodNodeInfo/);
    assert.equal(c.vmi('vm-a').metadata.annotations?.[PROVISIONING_ANNOTATION], undefined, what);
  }
});

test('other users are not matched: an admin changes labels and annotations; a spec change meets only KubeVirt', async (t) => {
  const c = await cluster(t);
  const uid = c.vmi('vm-b').metadata.uid;
  const meta = await c.adminApi.request(
    'PATCH',
    path('vm-b'),
    { metadata: { uid, labels: { 'team.example/tier': 'gold' }, annotations: { 'team.example/owner': 'bob' } } },
    MERGE,
  );
  assert.equal(meta.status, 200, JSON.stringify(meta.body));
  assert.equal(c.vmi('vm-b').metadata.labels?.['team.example/tier'], 'gold');
  assert.equal(c.fake.requests.at(-1)!.user, ADMIN_USER);
  // The policy lets the admin's spec change through: what refuses it is
  // KubeVirt's own VMI update webhook (a VMI's spec is KubeVirt's), after
  // the policy.
  const spec = await c.adminApi.request('PATCH', path('vm-b'), { spec: { domain: { cpu: { cores: 4 } } } }, MERGE);
  assert.equal(spec.status, 422);
  assert.match(messageOf(spec.body), /^admission webhook "virtualmachineinstances-update-validator\.kubevirt\.io"/);
  assert.doesNotMatch(messageOf(spec.body), /ValidatingAdmissionPolicy/);
});

test('without the policy stored nothing is enforced beyond RBAC: the same patch of another node goes through', async (t) => {
  const c = await cluster(t, false);
  const answer = await writerPatch(c.agentApi, c.vmi('vm-b'), SUMMARY);
  assert.equal(answer.status, 200);
  // The agent's spec change meets KubeVirt's webhook only.
  const spec = await c.agentApi.request('PATCH', path('vm-a'), { spec: { domain: { cpu: { cores: 4 } } } }, MERGE);
  assert.equal(spec.status, 422);
  assert.match(messageOf(spec.body), /^admission webhook /);
});

// The agent as the kubevirt scenario runs it (its guest reads the seed; the
// summary says so), through the fake with the policy on and the agent's
// token naming its node: the summary arrives, no write is refused. The same
// agent with a legacy token is refused (the policy is really on).
test('the real agent writes its provisioning annotation with the policy enforced', { timeout: 60_000 }, async (t) => {
  const fake = await FakeKube.start({ rbac: await renderedKubevirt(), admissionPolicies: true });
  const dir = await tempDir();
  t.after(async () => {
    await fake.close();
    await dir.remove();
  });
  fake.acceptTokens('agent-token');
  fake.setTokenExtra('agent-token', podToken(NODE));
  const client = new FakeClient();
  client.reads = 2;
  const h = await startAgent(fake, {
    stateDir: dir.path,
    injector: new AttachingInjector(),
    seedReads: client,
    seedReadPolicy: { firstMs: 5, maxMs: 40, boundMs: 60_000, timeoutMs: 1000 },
    reportPlan: progressReportPlanner({ enabled: true }),
    annotateVmis: { sweepMs: 50, minIntervalMs: 50, forbiddenRetryMs: 100 },
  });
  t.after(() => h.stop());
  fake.applyVmi(vmi('vm1', { namespace: 'team-a', phase: 'Running' }));
  const value = await waitFor(
    'the annotation',
    () => fake.getVmi('team-a', 'vm1')?.metadata.annotations?.[PROVISIONING_ANNOTATION],
  );
  assert.equal((JSON.parse(value) as { state: string }).state, 'not-reported', value);
  const patches = () => fake.requests.filter((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch');
  assert.ok(patches().length > 0);
  assert.deepEqual(
    patches().filter((r) => r.status !== 200),
    [],
    'no write refused',
  );

  fake.setTokenExtra('agent-token', undefined);
  fake.applyVmi(vmi('vm2', { namespace: 'team-a', phase: 'Running' }));
  await waitFor('a legacy token refused', () => patches().some((r) => r.name === 'vm2' && r.status === 403));
  assert.equal(fake.getVmi('team-a', 'vm2')?.metadata.annotations?.[PROVISIONING_ANNOTATION], undefined);
});
