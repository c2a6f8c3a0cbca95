// The seed gate through KubeVirt: the `unpause` subresource against the fake
// API server (which answers like virt-api), alone and behind the injector.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { FakeKube } from '../support/fake-kube.ts';
import { vmi, tempDir, NODE } from '../support/agent-harness.ts';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { FakeLibvirt } from '../support/fake-libvirt.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { kubevirtUnpause, unpausePath } from '../../src/agent/domain/kubevirt-resume.ts';
import { resumeAfterSeed, storeGateRecord } from '../../src/agent/domain/seed-gate.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { LibvirtInjector, type ResumeContext } from '../../src/libvirt/injector.ts';
import { VmseedError } from '../../src/errors.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';

async function setup(t: { after(fn: () => Promise<void>): void }) {
  const fake = await FakeKube.start();
  const connection = fake.connection();
  t.after(async () => {
    await connection.close();
    await fake.close();
  });
  return { fake, api: new KubeConnectionApi(connection, { timeoutMs: 2000 }) };
}

function paused(name: string, phase = 'Running'): VmiObject {
  const v = vmi(name);
  v.metadata.annotations!['vmseed.io/resume-after-seed'] = 'true';
  v.status = { nodeName: NODE, phase, conditions: [{ type: 'Paused', status: 'True' }], activePods: { 'pod-1': NODE } };
  return v;
}

const target = (name: string): InjectionTarget => ({
  namespace: 'default',
  name,
  uid: 'u',
  datasource: 'nocloud',
  annotations: { 'vmseed.io/resume-after-seed': 'true' },
});
const ctx = (name: string) => ({ target: target(name) }) as ResumeContext;
const code = (c: string, kind: string) => (e: unknown) => e instanceof VmseedError && e.code === c && e.kind === kind;

test('unpause: PUT on subresources.kubevirt.io with an UnpauseOptions body, as kubecli does', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('web-1'));
  await kubevirtUnpause(api)(ctx('web-1'));
  assert.deepEqual(fake.unpaused, ['default/web-1']);
  const call = fake.requests.find((r) => r.subresource === 'unpause')!;
  assert.deepEqual(
    [call.method, call.path, call.status],
    ['PUT', '/apis/subresources.kubevirt.io/v1/namespaces/default/virtualmachineinstances/web-1/unpause', 200],
  );
  assert.equal(unpausePath('default', 'web-1'), call.path);
  // KubeVirt dropped the Paused condition.
  assert.deepEqual(fake.getVmi('default', 'web-1')!.status!.conditions, []);
});

test('unpause again (already running, e.g. our earlier answer was lost): 409 "not paused" is success', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('web-2'));
  const hook = kubevirtUnpause(api);
  await hook(ctx('web-2'));
  await hook(ctx('web-2'));
  assert.deepEqual(
    fake.requests.filter((r) => r.subresource === 'unpause').map((r) => r.status),
    [200, 409],
  );
  assert.deepEqual(fake.unpaused, ['default/web-2']);
});

test('not Running yet (409), VMI gone (404): VMI_UNPAUSE_FAILED, retryable', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('early', 'Scheduled'));
  await assert.rejects(
    kubevirtUnpause(api)(ctx('early')),
    (e: unknown) => code('VMI_UNPAUSE_FAILED', 'retryable')(e) && /not running yet/.test((e as Error).message),
  );
  await assert.rejects(
    kubevirtUnpause(api)(ctx('missing')),
    (e: unknown) => code('VMI_UNPAUSE_FAILED', 'retryable')(e) && /404/.test((e as Error).message),
  );
  assert.deepEqual(
    fake.requests.filter((r) => r.subresource === 'unpause').map((r) => r.status),
    [409, 404],
  );
  assert.deepEqual(fake.unpaused, []);
});

test('API server away: KUBE_API_UNAVAILABLE, retryable', async (t) => {
  const { fake, api } = await setup(t);
  await fake.refuse(true);
  await assert.rejects(kubevirtUnpause(api)(ctx('x')), code('KUBE_API_UNAVAILABLE', 'retryable'));
  await fake.refuse(false);
});

test('behind the injector: a paused domain gets its seed, then KubeVirt (not virsh) resumes the VMI', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('gated'));
  const lv = new FakeLibvirt();
  lv.domains.set('default_gated', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const inj = new LibvirtInjector({ spawner: lv, resume: kubevirtUnpause(api) });
  const r = await inj.inject(target('gated'), '/seeds/nocloud.iso', { resume: true });
  assert.deepEqual([r.action, r.flags, r.resumed], ['attached', ['--live'], true]);
  assert.deepEqual(fake.unpaused, ['default/gated']);
  assert.equal(
    lv.calls.some((c) => c[0] === 'resume'),
    false,
    'virsh resume would desync KubeVirt',
  );
  // Without the annotation the VMI stays paused: no call at all.
  lv.domains.set('default_quiet', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const quiet = { ...target('quiet'), annotations: {} };
  await inj.inject(quiet, '/seeds/nocloud.iso', { resume: resumeAfterSeed(vmi('quiet')) });
  assert.equal(fake.requests.filter((r) => r.subresource === 'unpause').length, 1);
});

// The gate's view of the VMI, as the reconciler fills it from the VMI.
const gated = (name: string, vmi: NonNullable<InjectionTarget['vmi']>, pod = 'p-1'): ResumeContext =>
  ({ target: { ...target(name), launcherPods: [pod], vmi } }) as ResumeContext;

test('only the start pause: a VMI without startStrategy Paused is not unpaused (the hook says so, no call)', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('owner-paused'));
  assert.equal(
    await kubevirtUnpause(api)(gated('owner-paused', { phase: 'Running', startPaused: false, pausedCondition: true })),
    false,
  );
  assert.equal(
    fake.requests.some((r) => r.subresource === 'unpause'),
    false,
  );
});

test('before phase Running and Paused=True: SEED_GATE_WAITING, retryable, and no call virt-api would answer 409', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('early-gate', 'Scheduled'));
  const hook = kubevirtUnpause(api);
  for (const vmi of [
    { phase: 'Scheduled', startPaused: true, pausedCondition: true },
    { phase: 'Running', startPaused: true, pausedCondition: false },
    { startPaused: true, pausedCondition: false },
  ]) {
    await assert.rejects(
      hook(gated('early-gate', vmi)),
      (e: unknown) =>
        code('SEED_GATE_WAITING', 'retryable')(e) &&
        /Paused=True/.test((e as Error).message) &&
        (e as VmseedError).field === 'status.conditions',
    );
  }
  assert.equal(
    fake.requests.some((r) => r.subresource === 'unpause'),
    false,
  );
});

test("once per VMI: a later pause is the owner's and stays, also in a new launcher pod (a migrated VMI did not start paused); another VMI uid is gated", async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('once'));
  const hook = kubevirtUnpause(api);
  const ready = { phase: 'Running', startPaused: true, pausedCondition: true };
  assert.equal(await hook(gated('once', ready)), undefined);
  fake.applyVmi(paused('once'));
  assert.equal(await hook(gated('once', ready)), false);
  assert.equal(await hook(gated('once', ready, 'p-2')), false);
  assert.deepEqual(fake.unpaused, ['default/once']);
  // The VM restarted: KubeVirt makes a new VMI (a new uid), started paused again.
  await hook({ target: { ...gated('once', ready).target, uid: 'u-2' } } as ResumeContext);
  assert.deepEqual(fake.unpaused, ['default/once', 'default/once']);
});

test("restart-safe: the unpause is recorded next to the VMI's images; a new agent process does not unpause a VMI its owner paused since", async (t) => {
  const { fake, api } = await setup(t);
  const dir = await tempDir();
  t.after(() => dir.remove());
  const store = new ImageStore({ root: join(dir.path, 'seeds') });
  fake.applyVmi(paused('restarted'));
  const ready = { phase: 'Running', startPaused: true, pausedCondition: true };
  const ctx = gated('restarted', ready);
  await kubevirtUnpause(
    api,
    storeGateRecord(store, { fsync: false, now: () => new Date('2026-01-02T03:04:05Z') }),
  )(ctx);
  assert.deepEqual(fake.unpaused, ['default/restarted']);
  const recorded = readFileSync(join(store.dirFor(ctx.target), 'seed-gate-opened'), 'utf8');
  assert.deepEqual(JSON.parse(recorded), { unpausedAt: '2026-01-02T03:04:05.000Z', launcherPods: ['p-1'] });

  // The owner pauses it (virtctl pause); the agent restarts (a new hook, the same state dir).
  fake.applyVmi(paused('restarted'));
  const afterRestart = kubevirtUnpause(api, storeGateRecord(store, { fsync: false }));
  assert.equal(await afterRestart(ctx), false);
  assert.deepEqual(fake.unpaused, ['default/restarted'], 'still paused, as its owner wants');
  // The same with the in-process record: what the file adds.
  assert.equal(await kubevirtUnpause(api)(ctx), undefined);
  assert.deepEqual(fake.unpaused, ['default/restarted', 'default/restarted']);
});

test('restart-safe: an unpause whose record could not be written is retried; the gate then records it (409 "not paused" counts as open)', async (t) => {
  const { fake, api } = await setup(t);
  fake.applyVmi(paused('flaky'));
  const written: string[] = [];
  let failWrites = 1;
  const record = storeGateRecord(
    {
      readRecord: async () => (written.length > 0 ? written.at(-1) : undefined),
      writeRecord: async (_k, _r, text) => {
        if (failWrites-- > 0) throw new VmseedError('STORE_IO_FAILED', 'disk full', { kind: 'retryable' });
        written.push(text);
      },
    },
    { fsync: false },
  );
  const hook = kubevirtUnpause(api, record);
  const ctx = gated('flaky', { phase: 'Running', startPaused: true, pausedCondition: true });
  await assert.rejects(hook(ctx), code('STORE_IO_FAILED', 'retryable'));
  assert.deepEqual(fake.unpaused, ['default/flaky']);
  await hook(ctx);
  assert.equal(written.length, 1);
  assert.deepEqual(
    fake.requests.filter((r) => r.subresource === 'unpause').map((r) => r.status),
    [200, 409],
  );
  assert.equal(await hook(ctx), false, 'open from now on');
});
