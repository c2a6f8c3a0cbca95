// A KubeVirt volume whose network data vmseed cannot parse still gets its
// seed (KubeVirt's bytes), and the agent says so where a VM owner looks: a
// Warning Event naming the field and the status page's warnings.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fakeKubeAndDir, imageOf, startAgent, vmi, waitFor } from '../support/agent-harness.ts';

test(
  'unparseable network data on a volume: seed written, SeedWarning Event and status warning NETWORKDATA_UNPARSED',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, kubevirtVolumes: 'own' });
    t.after(h.stop);
    const v = vmi('net');
    delete v.metadata.annotations;
    // tests/vmi_cloudinit_test.go [test_id:3181]: KubeVirt's own network data.
    v.spec.volumes = [
      { name: 'cloudinitdisk', cloudInitNoCloud: { userData: '#cloud-config\n', networkData: '#Test networkData' } },
    ];
    const applied = fake.applyVmi(v);
    await waitFor('image', () => existsSync(imageOf(h.store, applied, 'nocloud')));
    await h.agent.queue.idle();
    await h.agent.events.flush();
    const event = fake.events().find((e) => e.reason === 'SeedWarning' && e.involvedObject.name === 'net');
    assert.ok(event, 'a SeedWarning Event');
    assert.equal(event.type, 'Warning');
    assert.match(
      event.message,
      /^NETWORKDATA_UNPARSED: spec\.volumes\[0\]\.cloudInitNoCloud\.networkData: .*written to network-config as given/i,
    );
    assert.doesNotMatch(event.message, /#Test networkData/, 'the data itself is never quoted');
    const status = h.agent.status.get('default/net');
    assert.equal(status?.state, 'warning');
    assert.deepEqual(
      status?.warnings.map((w) => [w.code, w.field]),
      [['NETWORKDATA_UNPARSED', 'spec.volumes[0].cloudInitNoCloud.networkData']],
    );
    // The same warning reaches the status page's JSON.
    const snap = h.agent.status.snapshot();
    assert.ok(JSON.stringify(snap).includes('NETWORKDATA_UNPARSED'));
  },
);
