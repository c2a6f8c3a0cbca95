// The agent's Kubernetes client against the fake API server as a real one
// stands: TLS with the test's CA, bearer token, RBAC from the manifests,
// 429 with Retry-After and 5xx. Delays are recorded, not waited for.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import type { AddressInfo, Socket } from 'node:net';
import { FakeKube } from '../support/fake-kube.ts';
import { testPki } from '../support/test-pki.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { tempDir, vmi, NODE } from '../support/agent-harness.ts';
import { KubeConnection } from '../../src/kube/connection.ts';
import { KubeConnectionApi, retryAfterMs, type KubeRetryPolicy } from '../../src/kube/api-client.ts';
import { KubeRefResolver } from '../../src/kube/resolver.ts';
import { KubeEventRecorder } from '../../src/agent/events.ts';
import { kubevirtUnpause } from '../../src/agent/domain/kubevirt-resume.ts';
import { VmseedError } from '../../src/errors.ts';
import type { ResumeContext } from '../../src/libvirt/injector.ts';

async function setup(
  t: { after(fn: () => Promise<void>): void },
  options: { retry?: Partial<KubeRetryPolicy>; rbac?: unknown[] } = {},
) {
  const fake = await FakeKube.start(options.rbac ? { rbac: options.rbac } : {});
  const connection = fake.connection();
  const slept: number[] = [];
  const api = new KubeConnectionApi(connection, {
    timeoutMs: 5000,
    ...(options.retry ? { retry: options.retry } : {}),
    sleep: async (ms) => void slept.push(ms),
  });
  t.after(async () => {
    await connection.close();
    await fake.close();
  });
  return { fake, connection, api, slept };
}

const code = (c: string, kind?: string, message?: RegExp) => (e: unknown) =>
  e instanceof VmseedError &&
  e.code === c &&
  (kind === undefined || e.kind === kind) &&
  (message === undefined || message.test(e.message));

const secret = { metadata: { name: 's', namespace: 'default' }, stringData: { userdata: '#cloud-config\n' } };

test('TLS: the fake serves HTTPS; a client trusting another CA, or none, is refused before any request', async (t) => {
  const { fake, api } = await setup(t);
  fake.setSecret(secret);
  assert.match(fake.url, /^https:\/\/127\.0\.0\.1:\d+$/);
  assert.equal((await api.request('GET', '/api/v1/namespaces/default/secrets/s')).status, 200);
  for (const ca of [(await testPki('another-ca')).caCert, undefined]) {
    const other = new KubeConnection({ server: fake.url, token: 'fake-token', ...(ca ? { ca } : {}) });
    t.after(() => other.close());
    await assert.rejects(
      new KubeRefResolver(new KubeConnectionApi(other)).getSecret('default', 's'),
      code('KUBE_API_UNAVAILABLE', 'retryable', /TLS: the server's certificate is not signed by the configured CA/),
    );
  }
  assert.equal(fake.requests.length, 1, 'the refused handshakes never became requests');
});

test('authentication: no token or a wrong one is 401 Unauthorized, typed KUBE_API_UNAUTHORIZED', async (t) => {
  const { fake } = await setup(t);
  fake.setSecret(secret);
  for (const token of [undefined, 'wrong']) {
    const conn = new KubeConnection({ server: fake.url, ca: fake.caCert!, ...(token ? { token } : {}) });
    t.after(() => conn.close());
    const res = await new KubeConnectionApi(conn).request('GET', '/api/v1/namespaces/default/secrets/s');
    assert.equal(res.status, 401);
    assert.deepEqual(res.body, {
      kind: 'Status',
      apiVersion: 'v1',
      metadata: {},
      status: 'Failure',
      message: 'Unauthorized',
      reason: 'Unauthorized',
      code: 401,
    });
    await assert.rejects(
      new KubeRefResolver(new KubeConnectionApi(conn)).getSecret('default', 's'),
      code('KUBE_API_UNAUTHORIZED', 'retryable'),
    );
  }
});

test('a rotated token file is re-read at once on 401, and the call retried once', async (t) => {
  const { fake } = await setup(t);
  fake.setSecret(secret);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const file = join(dir.path, 'token');
  await writeFile(file, 'token-1\n');
  fake.acceptTokens('token-1');
  const conn = new KubeConnection({ server: fake.url, ca: fake.caCert!, tokenFile: file });
  t.after(() => conn.close());
  const refs = new KubeRefResolver(new KubeConnectionApi(conn));
  assert.ok(await refs.getSecret('default', 's'));
  await writeFile(file, 'token-2\n');
  fake.acceptTokens('token-2');
  assert.ok(await refs.getSecret('default', 's'), 'picked up within the same call');
  assert.deepEqual(
    fake.requests.map((r) => r.status),
    [200, 401, 200],
  );
  // A token that is still wrong after the re-read: one 401 more, no loop.
  fake.acceptTokens('token-3');
  await assert.rejects(refs.getSecret('default', 's'), code('KUBE_API_UNAUTHORIZED'));
  assert.deepEqual(
    fake.requests.map((r) => r.status),
    [200, 401, 200, 401],
  );
});

test("RBAC: a verb the role does not grant is 403 with the API server's message, typed KUBE_API_FORBIDDEN", async (t) => {
  const { api } = await setup(t);
  // The manifest's ClusterRole grants get on secrets but no pause subresource and no pod reads.
  const pause = await api.request(
    'PUT',
    '/apis/subresources.kubevirt.io/v1/namespaces/team-a/virtualmachineinstances/vm1/pause',
    {},
  );
  assert.equal(pause.status, 403);
  assert.deepEqual(pause.body, {
    kind: 'Status',
    apiVersion: 'v1',
    metadata: {},
    status: 'Failure',
    message:
      'virtualmachineinstances.subresources.kubevirt.io "vm1" is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot update resource "virtualmachineinstances/pause" in API group "subresources.kubevirt.io" in the namespace "team-a"',
    reason: 'Forbidden',
    details: { name: 'vm1', group: 'subresources.kubevirt.io', kind: 'virtualmachineinstances' },
    code: 403,
  });
  const services = await api.request('GET', '/api/v1/services');
  assert.equal(
    (services.body as { message: string }).message,
    'services is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot list resource "services" in API group "" at the cluster scope',
  );
});

test('RBAC from namespaced Roles: Secrets readable where a RoleBinding grants them, 403 elsewhere', async (t) => {
  const role = (ns: string) => [
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'Role',
      metadata: { name: 'vmseed-agent', namespace: ns },
      rules: [{ apiGroups: [''], resources: ['secrets'], verbs: ['get'] }],
    },
    {
      apiVersion: 'rbac.authorization.k8s.io/v1',
      kind: 'RoleBinding',
      metadata: { name: 'vmseed-agent', namespace: ns },
      roleRef: { apiGroup: 'rbac.authorization.k8s.io', kind: 'Role', name: 'vmseed-agent' },
      subjects: [{ kind: 'ServiceAccount', name: 'vmseed', namespace: 'vmseed' }],
    },
  ];
  const { fake, api } = await setup(t, { rbac: role('team-a') });
  for (const ns of ['team-a', 'team-b'])
    fake.setSecret({ metadata: { name: 's', namespace: ns }, stringData: { userdata: 'x' } });
  const refs = new KubeRefResolver(api);
  assert.ok(await refs.getSecret('team-a', 's'));
  await assert.rejects(
    refs.getSecret('team-b', 's'),
    code(
      'KUBE_API_FORBIDDEN',
      'retryable',
      /secrets "s" is forbidden: User "system:serviceaccount:vmseed:vmseed" cannot get resource "secrets" in API group "" in the namespace "team-b"/,
    ),
  );
  // Resolved in namespaced mode: a namespace outside the list is not even asked.
  const scoped = new KubeRefResolver(api, { namespaces: ['team-a'] });
  const before = fake.requests.length;
  await assert.rejects(
    scoped.getConfigMap('team-b', 'c'),
    code('KUBE_API_FORBIDDEN', 'terminal', /outside the agent's namespaces/),
  );
  assert.equal(fake.requests.length, before);
});

test('429 with Retry-After: retried after that long (capped), then served', async (t) => {
  const { fake, api, slept } = await setup(t);
  fake.setSecret(secret);
  fake.fail({ status: 429, verb: 'get', retryAfterSeconds: 2, times: 1 });
  fake.fail({ status: 429, verb: 'get', retryAfterSeconds: 3600, times: 1 });
  assert.ok(await new KubeRefResolver(api).getSecret('default', 's'));
  assert.deepEqual(
    fake.requests.map((r) => r.status),
    [429, 429, 200],
  );
  assert.deepEqual(slept, [2000, 5000], 'Retry-After honoured, an hour cut to the cap');
});

test('5xx without Retry-After: exponential backoff; exhausted retries are typed and retryable', async (t) => {
  const { fake, api, slept } = await setup(t, { retry: { retries: 2, baseMs: 100, maxMs: 150 } });
  fake.setSecret(secret);
  fake.fail({ status: 503, verb: 'get', times: 3 });
  await assert.rejects(
    new KubeRefResolver(api).getSecret('default', 's'),
    code('KUBE_API_UNAVAILABLE', 'retryable', /answered 503/),
  );
  assert.deepEqual(slept, [100, 150]);
  assert.deepEqual(
    fake.requests.map((r) => r.status),
    [503, 503, 503],
  );
  fake.fail({ status: 429, verb: 'get', times: 3 });
  await assert.rejects(new KubeRefResolver(api).getSecret('default', 's'), code('KUBE_API_THROTTLED', 'retryable'));
  // Not the server's trouble: not retried.
  const before = fake.requests.length;
  assert.equal(await new KubeRefResolver(api).getSecret('default', 'missing'), undefined);
  assert.equal(fake.requests.length, before + 1);
});

test('Event POST and the unpause PUT ride out a 503 and a 429', async (t) => {
  const { fake, api, slept } = await setup(t);
  const { logger } = captureLogger('debug');
  const v = fake.applyVmi(vmi('vm1'));
  fake.fail({ status: 503, method: 'POST', path: /\/events$/, times: 1 });
  const events = new KubeEventRecorder({ api, logger, host: NODE });
  events.record(v, 'Normal', 'SeedReady', 'seeded');
  await events.flush();
  assert.equal(fake.events().length, 1);

  const paused = structuredClone(fake.getVmi('default', 'vm1')!);
  paused.status = { nodeName: NODE, phase: 'Running', conditions: [{ type: 'Paused', status: 'True' }] };
  fake.applyVmi(paused);
  fake.fail({ status: 429, method: 'PUT', path: /\/unpause$/, retryAfterSeconds: 1 });
  await kubevirtUnpause(api)({
    target: { namespace: 'default', name: 'vm1', uid: v.metadata.uid!, datasource: 'nocloud', annotations: {} },
  } as ResumeContext);
  assert.deepEqual(fake.unpaused, ['default/vm1']);
  assert.deepEqual(slept, [250, 1000]);
  assert.deepEqual(
    fake.requests.filter((r) => r.method !== 'GET').map((r) => `${r.method} ${r.status}`),
    ['POST 503', 'POST 201', 'PUT 429', 'PUT 200'],
  );
});

test('Retry-After: delay-seconds or an HTTP date', () => {
  const now = Date.parse('2026-01-01T00:00:00Z');
  assert.equal(retryAfterMs('7', now), 7000);
  assert.equal(retryAfterMs('Thu, 01 Jan 2026 00:00:30 GMT', now), 30_000);
  assert.equal(retryAfterMs('Wed, 31 Dec 2025 00:00:00 GMT', now), 0);
  assert.equal(retryAfterMs('soon', now), undefined);
  assert.equal(retryAfterMs(null, now), undefined);
  assert.equal(retryAfterMs('-1', now), undefined);
});

test("the fake's unpause runs KubeVirt's side first (onUnpause); its failure is a 500 the client retries", async (t) => {
  const { fake, api, slept } = await setup(t);
  const v = fake.applyVmi(vmi('vm2'));
  const paused = structuredClone(v);
  paused.status = { nodeName: NODE, phase: 'Running', conditions: [{ type: 'Paused', status: 'True' }] };
  fake.applyVmi(paused);
  const resumed: string[] = [];
  let failures = 1;
  fake.onUnpause(async (ns, name) => {
    if (failures-- > 0) throw new Error('launcher unreachable');
    resumed.push(`${ns}/${name}`);
  });
  await kubevirtUnpause(api)({
    target: { namespace: 'default', name: 'vm2', uid: v.metadata.uid!, datasource: 'nocloud', annotations: {} },
  } as ResumeContext);
  assert.deepEqual(resumed, ['default/vm2']);
  assert.deepEqual(fake.unpaused, ['default/vm2']);
  assert.deepEqual(
    fake.requests.filter((r) => r.method === 'PUT').map((r) => r.status),
    [500, 200],
  );
  assert.deepEqual(slept, [250]);
  assert.deepEqual(fake.getVmi('default', 'vm2')!.status!.conditions, [], 'the Paused condition is gone');
});

// An API server that accepts and says nothing: the TLS handshake never
// completes, so only a cancel or a timeout ends a call.
async function silentApiServer(t: TestContext): Promise<{ conn: KubeConnection; sockets: Socket[] }> {
  const { createServer } = await import('node:net');
  const sockets: Socket[] = [];
  const silent = createServer((s) => void sockets.push(s));
  await new Promise<void>((r) => silent.listen(0, '127.0.0.1', () => r()));
  const port = (silent.address() as AddressInfo).port;
  const conn = new KubeConnection({
    server: `https://127.0.0.1:${port}`,
    token: 'fake-token',
    ca: (await testPki('silent')).caCert,
  });
  t.after(async () => {
    for (const s of sockets) s.destroy();
    await conn.close();
    await new Promise((r) => silent.close(r));
  });
  return { conn, sockets };
}

test("the agent's cancel signal ends a call the API server never answers: CANCELLED at once, not after timeoutMs", async (t) => {
  const { conn, sockets } = await silentApiServer(t);
  const cancel = new AbortController();
  const api = new KubeConnectionApi(conn, { timeoutMs: 600_000, cancel: cancel.signal });
  const call = new KubeRefResolver(api).getSecret('default', 's');
  const outcome = assert.rejects(call, code('CANCELLED', 'retryable'));
  while (sockets.length === 0) await new Promise((r) => setTimeout(r, 10));
  cancel.abort();
  await outcome;
  // Later calls fail the same way, without a request.
  await assert.rejects(new KubeRefResolver(api).getSecret('default', 's'), code('CANCELLED'));
});

test("a reconcile's signal ends the unpause PUT the API server never answers: CANCELLED with the reconcile's reason; aborted before, nothing is sent", async (t) => {
  const { conn, sockets } = await silentApiServer(t);
  // No agent-wide cancel and a long timeout: only the reconcile's signal can end it.
  const api = new KubeConnectionApi(conn, { timeoutMs: 600_000 });
  const reconcile = new AbortController();
  const reason = new VmseedError('CANCELLED', 'VMI default/vm3 was deleted; reconcile cancelled', {
    kind: 'retryable',
  });
  const resume = kubevirtUnpause(api)({
    target: { namespace: 'default', name: 'vm3', uid: 'u3', datasource: 'nocloud', annotations: {} },
    signal: reconcile.signal,
  } as ResumeContext);
  const outcome = assert.rejects(resume, (e) => e === reason);
  while (sockets.length === 0) await new Promise((r) => setTimeout(r, 10));
  reconcile.abort(reason);
  await outcome;

  const { fake, api: served } = await setup(t);
  const before = fake.requests.length;
  const gone = new AbortController();
  gone.abort(reason);
  await assert.rejects(served.request('PUT', '/apis/x', {}, undefined, gone.signal), (e) => e === reason);
  assert.equal(fake.requests.length, before, 'no request sent for a reconcile already ended');
});
