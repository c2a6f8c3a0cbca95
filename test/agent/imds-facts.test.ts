// What the IMDS endpoints learn of a VMI: the opt-in, the ServiceAccount the
// launcher runs as by KubeVirt's rule (virt-controller services/template.go)
// and whether KubeVirt mounts its token, and this node's launcher pods.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { imdsFacts } from '../../src/datasource/imds/facts.ts';
import type { VmiObject } from '../../src/api/objects.ts';

const POD = '11111111-1111-4111-8111-111111111111';
const OTHER = '22222222-2222-4222-8222-222222222222';

function vmi(annotations: Record<string, string>, spec: Partial<VmiObject['spec']> = {}): VmiObject {
  return {
    metadata: { name: 'v', namespace: 'ns', uid: 'u', annotations },
    spec,
    status: { activePods: { [POD]: 'node-1', [OTHER]: 'node-2', 'not-a-uid': 'node-1' } },
  };
}

const SA_VOLUME = { volumes: [{ name: 'sa', serviceAccount: { serviceAccountName: 'builder' } }] };

test('imdsFacts: opt-in, ServiceAccount by KubeVirt rule, this node launcher pods', () => {
  assert.deepEqual(imdsFacts(vmi({ 'imds.kubevirt.io/enabled': 'true' }), 'node-1'), {
    enabled: true,
    serviceAccountName: 'default',
    serviceAccountToken: false,
    launcherPods: [POD],
  });
  assert.equal(imdsFacts(vmi({ 'vmseed.io/imds': 'true' }), 'node-1').enabled, true);
  assert.equal(imdsFacts(vmi({ 'vmseed.io/imds': 'yes' }), 'node-1').enabled, false);
  assert.equal(imdsFacts(vmi({ 'imds.kubevirt.io/enabled': 'True' }), 'node-1').enabled, false);
  const withVolume = imdsFacts(vmi({}, SA_VOLUME), 'node-2');
  assert.equal(withVolume.serviceAccountName, 'builder');
  assert.equal(withVolume.serviceAccountToken, true);
  assert.deepEqual(withVolume.launcherPods, [OTHER]);
  // spec.serviceAccountName names the pod's account; no volume, no token.
  const named = imdsFacts(vmi({}, { serviceAccountName: 'runner' }), 'node-1');
  assert.equal(named.serviceAccountName, 'runner');
  assert.equal(named.serviceAccountToken, false);
  assert.equal(imdsFacts(vmi({}, { ...SA_VOLUME, serviceAccountName: 'runner' }), 'x').serviceAccountName, 'runner');
});
