// The reconciler beside KubeVirt: the launcher pod comes from
// status.activePods (retried until KubeVirt reports it), the image is
// published into that pod, the gate unpauses through KubeVirt, a new
// launcher pod gets the seed again, and deleting the VMI detaches the disk
// and removes the published copy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { FakeLibvirt } from '../support/fake-libvirt.ts';
import { startAgent, tempDir, waitFor, NODE } from '../support/agent-harness.ts';
import { HOTPLUG, launcherVmi } from '../support/kubevirt-scenario.ts';
import { KubeConnectionApi } from '../../src/agent/kube-api.ts';
import { kubevirtUnpause } from '../../src/agent/kubevirt-resume.ts';
import { VirshInjector } from '../../src/libvirt/injector.ts';
import { DirPublisher } from '../../src/libvirt/publish.ts';

test('launcher pod unknown → retried; then published into the pod, unpaused by KubeVirt; new pod → seeded again; deleted → detached and removed', { timeout: 30_000 }, async (t) => {
  const fake = await FakeKube.start();
  const dir = await tempDir();
  const connection = fake.connection();
  t.after(async () => {
    await connection.close();
    await fake.close();
    await dir.remove();
  });
  const pods = join(dir.path, 'pods');
  for (const pod of ['pod-1', 'pod-2']) await mkdir(join(pods, pod, HOTPLUG), { recursive: true });
  const lv = new FakeLibvirt();
  lv.domains.set('ns_web', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const injector = new VirshInjector({
    spawner: lv,
    uriTemplate: `qemu+unix:///session?socket=${pods}/{podUID}/sock`,
    imagePathTemplate: '/var/run/kubevirt/hotplug-disks/{basename}',
    publisher: new DirPublisher({ dirTemplate: `${pods}/{podUID}/${HOTPLUG}` }),
    resume: kubevirtUnpause(new KubeConnectionApi(connection, { timeoutMs: 2000 })),
    sleep: async () => {},
  });
  const h = await startAgent(fake, { stateDir: join(dir.path, 'seeds'), injector });
  t.after(h.stop);

  // Scheduled, no launcher pod reported yet.
  const early = launcherVmi('web', 'ns', 'userData: "#cloud-config\\nhostname: web\\n"\n', 'pod-1', { paused: true });
  const withPod = structuredClone(early);
  early.status = { nodeName: NODE, phase: 'Scheduled' };
  fake.applyVmi(early);
  const failed = await waitFor('SeedFailed', () => fake.events().find((e) => e.reason === 'SeedFailed'));
  assert.match(failed.message, /^LAUNCHER_POD_UNKNOWN: VMI ns\/web: status\.activePods names no launcher pod on this node yet/);
  assert.equal(lv.calls.length, 0);

  // KubeVirt reports the launcher: published, attached live, unpaused.
  fake.applyVmi(withPod);
  await waitFor('unpaused', () => fake.unpaused.includes('ns/web'));
  // The published copy carries the store image's content-addressed name.
  const published = lv.domains.get('ns_web')!.live[0]!.sourceFile!;
  assert.match(published, /^\/var\/run\/kubevirt\/hotplug-disks\/vmseed-nocloud-[0-9a-f]{16}\.iso$/);
  const publishedName = published.split('/').pop()!;
  assert.ok(existsSync(join(pods, 'pod-1', HOTPLUG, publishedName)));
  assert.ok(lv.uris.every((u) => u === `qemu+unix:///session?socket=${pods}/pod-1/sock`));
  assert.equal(lv.calls.some((c) => c[0] === 'resume'), false);

  // The VM restarted in a new launcher pod (its domain is new and empty).
  lv.domains.set('ns_web', { state: 'paused', persistent: false, live: [], config: [], unplugs: true });
  const moved = structuredClone(fake.getVmi('ns', 'web')!);
  moved.status!.activePods = { 'pod-2': NODE };
  moved.status!.conditions = [{ type: 'Paused', status: 'True' }];
  fake.applyVmi(moved);
  await waitFor('published into the new pod', () => existsSync(join(pods, 'pod-2', HOTPLUG, publishedName)));
  await waitFor('attached in the new launcher', () => lv.domains.get('ns_web')!.live.length === 1);
  await waitFor('unpaused again', () => fake.unpaused.length === 2);
  assert.ok(lv.uris.at(-1)!.includes('/pod-2/'));

  // Deleted: detached from the domain, the published copy removed.
  fake.deleteVmi('ns', 'web');
  await waitFor('detached', () => lv.domains.get('ns_web')!.live.length === 0);
  await waitFor('copy removed', async () => (await readdir(join(pods, 'pod-2', HOTPLUG))).length === 0);
});
