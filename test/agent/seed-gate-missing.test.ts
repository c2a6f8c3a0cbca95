// Beside KubeVirt with libvirt on, a vmseed VMI that starts unpaused (no
// webhook set its gate) gets SEED_GATE_MISSING: a warning on the status page and one
// SeedWarning Event naming the fields to set. A gated VMI and one that opts
// out with vmseed.io/gate: "false" get none.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, RecordingInjector, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { missingSeedGate, resumeAfterSeed } from '../../src/agent/domain/seed-gate.ts';
import type { VmiObject } from '../../src/api/objects.ts';

function gated(v: VmiObject): VmiObject {
  v.spec.startStrategy = 'Paused';
  v.metadata.annotations = { ...v.metadata.annotations, 'vmseed.io/resume-after-seed': 'true' };
  return v;
}

test('resumeAfterSeed: the gate resumes only a VMI whose annotation is exactly "true"', () => {
  assert.equal(resumeAfterSeed(gated(vmi('a'))), true);
  assert.equal(resumeAfterSeed(vmi('b')), false);
  for (const value of ['yes', 'True', '']) {
    const v = vmi('c');
    v.metadata.annotations!['vmseed.io/resume-after-seed'] = value;
    assert.equal(resumeAfterSeed(v), false, value);
  }
});

test('missingSeedGate: only a vmseed VMI that starts unpaused and has not opted out', () => {
  assert.equal(missingSeedGate(vmi('a'))?.code, 'SEED_GATE_MISSING');
  assert.equal(missingSeedGate(gated(vmi('b'))), undefined);
  const optOut = vmi('c');
  optOut.metadata.annotations!['vmseed.io/gate'] = 'false';
  assert.equal(missingSeedGate(optOut), undefined);
  const paused = vmi('d');
  paused.spec.startStrategy = 'Paused';
  assert.equal(missingSeedGate(paused)?.code, 'SEED_GATE_MISSING', 'paused without the resume annotation stays paused');
  const notOurs = vmi('e');
  delete notOurs.metadata.annotations!['vmseed.io/cloud-init'];
  assert.equal(missingSeedGate(notOurs), undefined);
  const w = missingSeedGate(vmi('f'))!;
  assert.equal(w.field, 'spec.startStrategy');
  for (const fix of [
    'startStrategy: Paused',
    'vmseed.io/resume-after-seed: "true"',
    'deploy/webhook',
    'vmseed.io/gate: "false"',
  ])
    assert.ok(w.message.includes(fix), fix);
});

test(
  'an ungated VMI: warning state and one SeedWarning Event; gated and opted-out VMIs: ready, no warning',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, injector: new RecordingInjector(), warnMissingGate: true });
    t.after(h.stop);
    const optOut = vmi('opted-out');
    optOut.metadata.annotations!['vmseed.io/gate'] = 'false';
    fake.applyVmi(vmi('ungated'));
    fake.applyVmi(gated(vmi('gated')));
    fake.applyVmi(optOut);
    const rec = await waitFor('ungated warned', () => {
      const r = h.agent.status.get('default/ungated');
      return r?.state === 'warning' ? r : undefined;
    });
    assert.deepEqual(
      rec.warnings.map((w) => w.code),
      ['SEED_GATE_MISSING'],
    );
    for (const name of ['gated', 'opted-out']) {
      const r = await waitFor(name, () => {
        const s = h.agent.status.get(`default/${name}`);
        return s?.imagePath ? s : undefined;
      });
      assert.deepEqual(r.warnings, [], name);
    }
    h.agent.resync();
    await new Promise((r) => setTimeout(r, 200));
    await h.agent.queue.idle();
    await h.agent.events.flush();
    const events = fake.events().filter((e) => e.reason === 'SeedWarning');
    assert.deepEqual(
      events.map((e) => e.involvedObject.name),
      ['ungated'],
    );
    assert.match(events[0].message, /^SEED_GATE_MISSING: no seed gate/);
    assert.equal(events[0].count ?? 1, 1, 'not repeated by the resync');
  },
);

test('without the check (libvirt off, or not beside KubeVirt) nothing is said', { timeout: 60_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, { stateDir: dir.path, injector: new RecordingInjector() });
  t.after(h.stop);
  fake.applyVmi(vmi('quiet'));
  const r = await waitFor('seeded', () => {
    const s = h.agent.status.get('default/quiet');
    return s?.imagePath ? s : undefined;
  });
  assert.deepEqual(r.warnings, []);
});
