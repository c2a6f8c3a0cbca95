// The webhook's gate and the agent's resume read the same annotation the
// same way: only the exact value "true" is a resume the agent will perform,
// so any other value must leave the VMI unpaused, or nobody would unpause it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import type { VmiObject } from '../../../src/api/objects.ts';
import { ANNOTATION } from '../../../src/cloudinit/annotation/annotation.ts';
import { mutateVmi, RESUME_ANNOTATION, type PatchOperation } from '../../../src/cluster/webhook/mutate.ts';
import { missingSeedGate, resumeAfterSeed } from '../../../src/agent/domain/seed-gate.ts';

function vmi(resume: string | undefined): VmiObject {
  const annotations: Record<string, string> = { [ANNOTATION]: '{"userData":"#cloud-config\\n"}' };
  if (resume !== undefined) annotations[RESUME_ANNOTATION] = resume;
  return { metadata: { name: 'vm', namespace: 'ns', annotations }, spec: { domain: {} } };
}

const mutate = (v: VmiObject): PatchOperation[] => mutateVmi(v, {});

for (const value of ['yes', 'True', 'TRUE', '', ' true', 'true ', '1', 'on', 'false']) {
  test(`resume annotation ${JSON.stringify(value)}: the agent would not resume, so the webhook does not pause`, () => {
    const v = vmi(value);
    assert.equal(resumeAfterSeed(v), false, 'the agent resumes only on "true"');
    const ops = mutate(v);
    assert.deepEqual(ops, [], 'no startStrategy patch, and the annotation is left as the owner wrote it');
  });
}

test('resume annotation "true": paused by the webhook, resumed by the agent, and the agent sees a gate', () => {
  const v = vmi('true');
  assert.equal(resumeAfterSeed(v), true);
  assert.deepEqual(mutate(v), [{ op: 'add', path: '/spec/startStrategy', value: 'Paused' }]);
  v.spec.startStrategy = 'Paused';
  assert.equal(missingSeedGate(v), undefined);
});

test('no resume annotation: the webhook pauses and writes "true", which the agent resumes on', () => {
  const v = vmi(undefined);
  assert.equal(resumeAfterSeed(v), false);
  const ops = mutate(v);
  assert.deepEqual(ops, [
    { op: 'add', path: '/metadata/annotations/vmseed.io~1resume-after-seed', value: 'true' },
    { op: 'add', path: '/spec/startStrategy', value: 'Paused' },
  ]);
  assert.equal(ops[0].value, 'true');
  v.metadata.annotations = { ...v.metadata.annotations, [RESUME_ANNOTATION]: 'true' };
  v.spec.startStrategy = 'Paused';
  assert.equal(resumeAfterSeed(v), true);
  assert.equal(missingSeedGate(v), undefined);
});
