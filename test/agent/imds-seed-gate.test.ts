// The seed gate of a VMI served over HTTP only (KubeVirt IMDS's opt-in, as
// the webhook gates it): the agent unpauses it through KubeVirt once its
// seed is served, after KubeVirt reports it Running and Paused, once.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, NODE, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { kubevirtServedGate } from '../../src/agent/domain/kubevirt-resume.ts';
import type { VmiObject } from '../../src/api/objects.ts';

function imdsVmi(name: string, phase: string, startPaused = true): VmiObject {
  const v = vmi(name);
  v.metadata.annotations = {
    'imds.kubevirt.io/enabled': 'true',
    'imds.kubevirt.io/user-data': '#cloud-config\nhostname: imds\n',
    'vmseed.io/resume-after-seed': 'true',
  };
  if (startPaused) v.spec.startStrategy = 'Paused';
  v.status = {
    nodeName: NODE,
    phase,
    conditions: phase === 'Running' ? [{ type: 'Paused', status: 'True' }] : [],
    activePods: { 'pod-1': NODE },
  };
  return v;
}

test('an IMDS VMI started paused is unpaused once its seed is served and KubeVirt reports it paused; once', async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const h = await startAgent(fake, {
    stateDir: dir.path,
    nocloudHttp: {},
    openServedGate: (api) => kubevirtServedGate(api),
  });
  t.after(h.stop);
  const gated = fake.applyVmi(imdsVmi('gated', 'Scheduled'));
  // Served, waiting for KubeVirt's Running and Paused=True.
  await waitFor(
    'served and waiting',
    () => h.agent.status.get('default/gated')?.lastError?.code === 'SEED_GATE_WAITING',
  );
  assert.ok(h.agent.seeds!.get(gated.metadata.uid!), 'the seed is served while the VMI waits');
  assert.equal(fake.unpaused.length, 0);
  fake.applyVmi(imdsVmi('gated', 'Running'));
  await waitFor('unpaused', () => fake.unpaused.includes('default/gated'));
  await waitFor('ready', () => h.agent.status.get('default/gated')?.state === 'ready');
  // Not again: a later pause is the owner's.
  fake.applyVmi(imdsVmi('gated', 'Running'));
  h.agent.resync();
  await new Promise((r) => setTimeout(r, 500));
  assert.equal(fake.requests.filter((r) => r.subresource === 'unpause').length, 1);

  // Not started paused: the pause is not the gate's, never unpaused.
  fake.applyVmi(imdsVmi('owners', 'Running', false));
  await waitFor('owners ready', () => h.agent.status.get('default/owners')?.state === 'ready');
  assert.ok(!fake.unpaused.includes('default/owners'));
});
