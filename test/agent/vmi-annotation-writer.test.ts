// The VMI annotation writer against the fake API server (loopback, TLS,
// RBAC from manifests/daemonset.yaml): a merge patch of one annotation
// carrying the VMI's UID, one write per VMI per interval however often its
// value changes (the last always written), a 403 shown as degraded and the
// writes paused until RBAC allows them, a VMI gone or made again never
// retried with the old value, failures logged at most once a minute per
// kind, every write counted by result. The clock is the test's: no wait depends on the machine's speed.
import { test, type TestContext } from 'node:test';
import assert from 'node:assert/strict';
import { FakeKube } from '../support/fake-kube.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { vmi } from '../support/agent-harness.ts';
import { loadManifestObjects, manifestRbacWithout } from '../support/kube-authz.ts';
import { ROOT } from '../support/manifests.ts';
import { DEFAULT_RETRY, KubeConnectionApi } from '../../src/kube/api-client.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import {
  FORBIDDEN_RETRY_MS,
  MIN_INTERVAL_MS,
  VmiAnnotationWriter,
} from '../../src/agent/provisioning/annotation-writer.ts';

const ANNOTATION = 'vmseed.io/provisioning';

async function setup(t: TestContext) {
  const fake = await FakeKube.start();
  const connection = fake.connection();
  t.after(async () => {
    await connection.close();
    await fake.close();
  });
  const api = new KubeConnectionApi(connection, { timeoutMs: 10_000 });
  const state = { clock: 1_000_000, value: 'v0', uid: fake.applyVmi(vmi('vm')).metadata.uid! };
  const { logger, lines } = captureLogger('debug');
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  const make = () =>
    new VmiAnnotationWriter({
      api,
      annotation: ANNOTATION,
      logger,
      metrics,
      now: () => state.clock,
      keys: () => ['default/vm'],
      // The informer's copy: what the object carried when last seen.
      wanted: () => ({
        namespace: 'default',
        name: 'vm',
        uid: state.uid,
        value: state.value,
        current: fake.getVmi('default', 'vm')?.metadata.annotations?.[ANNOTATION],
      }),
    });
  const patches = () => fake.requests.filter((r) => r.resource === 'virtualmachineinstances' && r.verb === 'patch');
  const annotation = () => fake.getVmi('default', 'vm')?.metadata.annotations?.[ANNOTATION];
  const warnings = () => lines.filter((l) => l.includes('could not write the VMI annotation'));
  const counted = async () => {
    const out: Record<string, number> = {};
    for (const v of (await metrics.vmiAnnotationWrites.get()).values) out[String(v.labels.result)] = v.value;
    return out;
  };
  return { fake, state, make, patches, annotation, warnings, counted };
}

test('a value is written once, with a merge patch carrying the UID; one the object already holds is not written', async (t) => {
  const { fake, state, make, patches, annotation } = await setup(t);
  const before = fake.getVmi('default', 'vm')!;
  const writer = make();
  writer.touch('default/vm');
  await writer.idle();
  assert.equal(annotation(), 'v0');
  assert.deepEqual(
    patches().map((r) => [r.method, r.path, r.status]),
    [['PATCH', '/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm', 200]],
  );
  const after = fake.getVmi('default', 'vm')!;
  assert.deepEqual(after.spec, before.spec, 'only the annotation changed');
  assert.deepEqual(after.metadata.labels, before.metadata.labels);
  assert.equal(
    after.metadata.annotations?.['vmseed.io/cloud-init'],
    before.metadata.annotations?.['vmseed.io/cloud-init'],
  );
  assert.equal(after.metadata.uid, state.uid);

  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(patches().length, 1, 'unchanged: not written again');
  // An agent restarted: the object already holds the value.
  const again = make();
  again.touch('default/vm');
  await again.idle();
  assert.equal(patches().length, 1);
  assert.equal(again.written, 0);
});

test('a flood of changes on one VMI: one write per interval, and the last value is written', async (t) => {
  const { state, make, patches, annotation } = await setup(t);
  const writer = make();
  for (let i = 0; i < 100; i++) {
    state.value = `v${i}`;
    state.clock += 1000;
    writer.touch('default/vm');
    await writer.idle();
  }
  assert.equal(patches().length, 100_000 / MIN_INTERVAL_MS, 'one write per interval');
  assert.equal(annotation(), 'v90');
  writer.sweep();
  await writer.idle();
  assert.equal(patches().length, 10, 'still inside the interval');
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(annotation(), 'v99', 'the last value, once the interval is over');
  assert.equal(patches().length, 11);
});

test('403: degraded with the reason, writes paused, resumed once RBAC allows them', async (t) => {
  const { fake, state, make, patches, annotation, warnings } = await setup(t);
  fake.setRbac(manifestRbacWithout('virtualmachineinstances', 'patch'));
  const writer = make();
  writer.touch('default/vm');
  await writer.idle();
  assert.deepEqual(
    patches().map((r) => r.status),
    [403],
  );
  assert.equal(annotation(), undefined);
  const why = writer.degraded();
  assert.match(
    why ?? '',
    /vmseed\.io\/provisioning cannot be written: 403 Forbidden \(.*cannot patch resource "virtualmachineinstances" in API group "kubevirt\.io"/,
  );
  assert.match(
    why ?? '',
    /grant patch on kubevirt\.io virtualmachineinstances .* or turn it off with --provisioning-annotation=false/,
  );
  assert.equal(warnings().length, 1);

  // Paused for every VMI, even past the per-VMI interval.
  state.value = 'v1';
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(patches().length, 1);

  fake.setRbac(loadManifestObjects(`${ROOT}manifests/daemonset.yaml`));
  state.clock += FORBIDDEN_RETRY_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(annotation(), 'v1');
  assert.equal(writer.degraded(), undefined);
});

test('a VMI made again under its name (422) or gone (404): the value is not retried, the new object never gets the old one', async (t) => {
  const { fake, state, make, patches, annotation, warnings } = await setup(t);
  const writer = make();
  writer.touch('default/vm');
  await writer.idle();
  assert.equal(annotation(), 'v0');

  // The informer has not seen the new object yet: the old UID is refused.
  fake.deleteVmi('default', 'vm');
  const fresh = fake.applyVmi(vmi('vm'));
  state.value = 'v1';
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.deepEqual(
    patches().map((r) => r.status),
    [200, 422],
  );
  assert.equal(annotation(), undefined, 'the new object has none');
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(patches().length, 2, 'not retried');

  fake.deleteVmi('default', 'vm');
  state.value = 'v2';
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(patches().at(-1)?.status, 404);
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(patches().length, 3, 'not retried');
  // Both refusals within a minute: one log line.
  assert.equal(warnings().length, 1);
  assert.match(warnings()[0], /422 .*metadata\.uid: Invalid value: .*field is immutable.*not retried/);
  assert.notEqual(fresh.metadata.uid, state.uid);
});

test('the fake API server answers VMI patches as the API server and KubeVirt do', async (t) => {
  const { fake } = await setup(t);
  const connection = fake.connection();
  t.after(() => connection.close());
  const api = new KubeConnectionApi(connection, { timeoutMs: 10_000, retry: { retries: 0 } });
  const path = '/apis/kubevirt.io/v1/namespaces/default/virtualmachineinstances/vm';
  const merge = 'application/merge-patch+json';
  const stored = fake.getVmi('default', 'vm')!;
  const status = async (body: unknown, type = merge, at = path) => {
    const res = await api.request('PATCH', at, body, type);
    return [res.status, String((res.body as { message?: string }).message ?? '')] as const;
  };
  const [smp, smpWhy] = await status(
    { metadata: { annotations: { a: 'b' } } },
    'application/strategic-merge-patch+json',
  );
  assert.equal(smp, 415);
  assert.match(smpWhy, /accepted media types include: application\/json-patch\+json, application\/merge-patch\+json/);
  assert.equal((await status({}, merge, `${path}-missing`))[0], 404);
  assert.equal((await status([1])).at(0), 400);
  const [stale, staleWhy] = await status({ metadata: { resourceVersion: '1', annotations: { a: 'b' } } });
  assert.equal(stale, 409);
  assert.match(staleWhy, /the object has been modified/);
  const [spec, specWhy] = await status({ spec: { domain: { cpu: { cores: 2 } } } });
  assert.equal(spec, 422);
  assert.match(
    specWhy,
    /admission webhook "virtualmachineinstances-update-validator\.kubevirt\.io" denied the request: update of VMI object is restricted/,
  );
  const [label, labelWhy] = await status({ metadata: { labels: { 'kubevirt.io/nodeName': 'elsewhere' } } });
  assert.equal(label, 422);
  assert.match(labelWhy, /reserved kubevirt\.io\/ labels/);
  const [big] = await status({ metadata: { annotations: { big: 'x'.repeat(256 * 1024) } } });
  assert.equal(big, 422);
  assert.equal(
    fake.getVmi('default', 'vm')!.metadata.resourceVersion,
    stored.metadata.resourceVersion,
    'nothing stored',
  );
  // null deletes a key; other labels are anyone's.
  const [ok] = await status({ metadata: { labels: { team: 'a' }, annotations: { 'vmseed.io/cloud-init': null } } });
  assert.equal(ok, 200);
  const now = fake.getVmi('default', 'vm')!;
  assert.equal(now.metadata.labels?.team, 'a');
  assert.equal(now.metadata.annotations?.['vmseed.io/cloud-init'], undefined);
  assert.notEqual(now.metadata.resourceVersion, stored.metadata.resourceVersion);
});

test('every write is counted by result: a 5xx past the client retries as error, then retried and counted as success', async (t) => {
  const { fake, state, make, patches, annotation, warnings, counted } = await setup(t);
  assert.deepEqual(await counted(), { success: 0, forbidden: 0, refused: 0, error: 0 }, 'each series from the start');
  fake.fail({ status: 500, verb: 'patch', times: DEFAULT_RETRY.retries + 1 });
  const writer = make();
  writer.touch('default/vm');
  await writer.idle();
  assert.deepEqual(
    patches().map((r) => r.status),
    Array<number>(DEFAULT_RETRY.retries + 1).fill(500),
  );
  assert.equal(annotation(), undefined);
  assert.deepEqual(
    await counted(),
    { success: 0, forbidden: 0, refused: 0, error: 1 },
    'one write, however many retries',
  );
  assert.match(warnings()[0], /the API server answered 500; will retry/);

  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  assert.equal(annotation(), 'v0');
  assert.deepEqual(await counted(), { success: 1, forbidden: 0, refused: 0, error: 1 });

  fake.setRbac(manifestRbacWithout('virtualmachineinstances', 'patch'));
  state.value = 'v1';
  state.clock += MIN_INTERVAL_MS;
  writer.sweep();
  await writer.idle();
  fake.setRbac(loadManifestObjects(`${ROOT}manifests/daemonset.yaml`));
  fake.deleteVmi('default', 'vm');
  state.clock += FORBIDDEN_RETRY_MS;
  writer.sweep();
  await writer.idle();
  assert.deepEqual(
    patches()
      .slice(-2)
      .map((r) => r.status),
    [403, 404],
  );
  assert.deepEqual(await counted(), { success: 1, forbidden: 1, refused: 1, error: 1 });
});
