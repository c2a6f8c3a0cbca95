// A VMI whose KubeVirt cloud-init volume the webhook adopted is vmseed's to
// seed even where the agent leaves KubeVirt's volumes to KubeVirt (its
// default on KubeVirt nodes): the image holds the seed of the volume as
// submitted, the status page says where the seed came from, and a record
// beside a volume still in the spec (KubeVirt builds that one) or a record
// that does not read is said, never guessed at.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { fakeKubeAndDir, imageOf, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { ADOPTED_ANNOTATION, adoptedText } from '../../src/cloudinit/kubevirt/adopted.ts';
import { readIso } from '../../src/disk/iso9660-read.ts';
import { readFileSync } from 'node:fs';
import { renderVmiPage } from '../../src/http/status-page.ts';

const VOLUME = { name: 'cloudinitvolume', cloudInitConfigDrive: { secretRef: { name: 'boot-userdata' } } };
const DISK = { name: 'cloudinitvolume', disk: { bus: 'virtio' } };

test(
  'an adopted ConfigDrive volume is seeded with --kubevirt-volumes ignore; a stray or unreadable record, or an adoption left to KubeVirt, is said',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, kubevirtVolumes: 'ignore' });
    t.after(h.stop);
    fake.setSecret({
      metadata: { name: 'boot-userdata', namespace: 'default' },
      data: { userdata: Buffer.from('#cloud-config\nruncmd: [echo adopted]\n').toString('base64') },
    });
    const v = vmi('capk');
    v.metadata.annotations = {
      [ADOPTED_ANNOTATION]: adoptedText({
        v: 1,
        by: 'namespace',
        volumeIndex: 1,
        volume: VOLUME,
        diskIndex: 1,
        disk: DISK,
      }),
    };
    const applied = fake.applyVmi(v);
    await waitFor('image', () => existsSync(imageOf(h.store, applied, 'configdrive')));
    const iso = readIso(readFileSync(imageOf(h.store, applied, 'configdrive')));
    assert.equal(iso.label, 'config-2');
    assert.equal(
      Buffer.from(iso.read('openstack/latest/user_data') ?? []).toString(),
      '#cloud-config\nruncmd: [echo adopted]\n',
    );
    await h.agent.queue.idle();
    const status = h.agent.status.get('default/capk');
    assert.equal(status?.state, 'ready');
    assert.deepEqual(status?.adopted, { volume: 'cloudinitvolume', kind: 'cloudInitConfigDrive', by: 'namespace' });
    const page = renderVmiPage(h.agent.status.snapshot(), status, { now: new Date() });
    assert.match(
      page,
      /KubeVirt volume <span class="mono">cloudinitvolume<\/span> \(cloudInitConfigDrive\), adopted at admission/,
    );

    // The record beside a cloud-init volume still in the spec: KubeVirt builds that one.
    const both = vmi('both');
    both.metadata.annotations = {
      [ADOPTED_ANNOTATION]: adoptedText({ v: 1, by: 'annotation', volumeIndex: 0, volume: VOLUME }),
    };
    both.spec.volumes = [{ name: 'ci', cloudInitNoCloud: { userData: '#cloud-config\n' } }];
    fake.applyVmi(both);
    // A record that is not one.
    const bad = vmi('bad');
    bad.metadata.annotations = { [ADOPTED_ANNOTATION]: '{"v":2}' };
    fake.applyVmi(bad);
    // Asked for adoption, still holding its volume: the webhook left it to KubeVirt, or did not answer.
    const left = vmi('left');
    left.metadata.annotations = { 'vmseed.io/adopt': 'true' };
    left.spec.volumes = [{ name: 'ci', cloudInitNoCloud: { userData: '#cloud-config\n' } }];
    fake.applyVmi(left);
    await waitFor(
      'both reconciled',
      () =>
        h.agent.status.get('default/both')?.state === 'skipped' && h.agent.status.get('default/bad')?.state === 'error',
    );
    assert.deepEqual(
      h.agent.status.get('default/both')?.warnings.map((w) => w.code),
      ['KUBEVIRT_VOLUME_CONFLICT'],
    );
    await waitFor('left reconciled', () => h.agent.status.get('default/left')?.state === 'skipped');
    assert.deepEqual(
      h.agent.status.get('default/left')?.warnings.map((w) => [w.code, w.field]),
      [['ADOPTION_SKIPPED', 'spec.volumes[0]']],
    );
    await h.agent.events.flush();
    const event = fake.events().find((e) => e.involvedObject.name === 'left' && e.reason === 'SeedWarning');
    assert.match(event?.message ?? '', /^ADOPTION_SKIPPED: VMI asks for the adoption of its cloud-init volume "ci"/);
    const err = h.agent.status.get('default/bad')?.lastError;
    assert.equal(err?.code, 'ADOPTED_INVALID');
    assert.match(err?.message ?? '', /version 2 is not 1/);
  },
);
