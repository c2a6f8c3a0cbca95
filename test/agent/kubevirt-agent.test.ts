// The agent beside KubeVirt (informer, work queue, reconciler, the kubevirt
// preset's injector): the launcher pod comes from status.activePods (retried
// until KubeVirt reports it), the image is published into that pod's
// ephemeral-disks/vmseed, the gate waits for the Paused condition and
// unpauses through KubeVirt (once per VMI), a new launcher pod gets the seed again, and
// deleting the VMI detaches the disk and removes the published copy.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync } from 'node:fs';
import { mkdir, readdir } from 'node:fs/promises';
import { join } from 'node:path';
import { FakeKube } from '../support/fake-kube.ts';
import { FakeLibvirt } from '../support/fake-libvirt.ts';
import { startAgent, tempDir, waitFor, NODE } from '../support/agent-harness.ts';
import { EPHEMERAL, POD_1, POD_2, kubevirtInjector, launcherVmi } from '../support/kubevirt-scenario.ts';
import { KubeConnectionApi } from '../../src/kube/api-client.ts';
import { kubevirtUnpause } from '../../src/agent/domain/kubevirt-resume.ts';

test(
  "launcher pod unknown → retried; Paused condition awaited; then published into the pod, unpaused by KubeVirt; new pod → seeded again, the owner's pause kept; deleted → detached and removed",
  { timeout: 30_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    const connection = fake.connection();
    t.after(async () => {
      await connection.close();
      await fake.close();
      await dir.remove();
    });
    const pods = join(dir.path, 'pods');
    for (const pod of [POD_1, POD_2]) await mkdir(join(pods, pod, EPHEMERAL), { recursive: true });
    const lv = new FakeLibvirt();
    lv.domains.set('ns_web', { state: 'paused', persistent: true, live: [], config: [], unplugs: true, scsi: true });
    const injector = kubevirtInjector(
      pods,
      lv,
      kubevirtUnpause(new KubeConnectionApi(connection, { timeoutMs: 2000 })),
    );
    const h = await startAgent(fake, { stateDir: join(dir.path, 'seeds'), injector });
    t.after(h.stop);

    // Scheduled, no launcher pod reported yet.
    const ready = launcherVmi('web', 'ns', 'userData: "#cloud-config\\nhostname: web\\n"\n', POD_1, { paused: true });
    const early = structuredClone(ready);
    early.status = { nodeName: NODE, phase: 'Scheduled' };
    fake.applyVmi(early);
    // A normal start waits: pending with the reason, a Normal Event, no error.
    const waiting = await waitFor('SeedWaiting', () => fake.events().find((e) => e.reason === 'SeedWaiting'));
    assert.equal(waiting.type, 'Normal');
    assert.match(
      waiting.message,
      /^LAUNCHER_POD_UNKNOWN: VMI ns\/web: status\.activePods names no launcher pod on this node yet/,
    );
    assert.equal(h.agent.status.get('ns/web')?.state, 'pending');
    assert.equal(lv.calls.length, 0);

    // The launcher runs the paused domain; KubeVirt has not set the condition.
    const noCondition = structuredClone(ready);
    noCondition.status!.conditions = [];
    fake.applyVmi(noCondition);
    await waitFor(
      'waiting for the Paused condition',
      () => h.agent.status.get('ns/web')?.lastError?.code === 'SEED_GATE_WAITING',
    );
    assert.equal(h.agent.status.get('ns/web')?.state, 'pending');
    assert.equal(lv.domains.get('ns_web')!.live.length, 1, 'the seed is attached while it waits');
    assert.deepEqual(fake.unpaused, []);
    assert.equal(
      fake.requests.some((r) => r.subresource === 'unpause'),
      false,
      'no unpause before the condition: it would be a 409',
    );

    // KubeVirt reports Paused: unpaused.
    fake.applyVmi(structuredClone(ready));
    await waitFor('unpaused', () => fake.unpaused.includes('ns/web'));
    // The reconcile that unpaused records it after virt-api answered.
    await waitFor('the unpause in the status', () => h.agent.status.get('ns/web')?.injection?.resumed === true);
    await h.agent.events.flush();
    assert.deepEqual(
      fake
        .events()
        .filter((e) => e.type === 'Warning')
        .map((e) => `${e.reason}: ${e.message}`),
      [],
      'a normal start records no Warning',
    );
    assert.deepEqual(
      fake
        .events()
        .filter((e) => e.reason === 'SeedWaiting')
        .map((e) => e.message.split(':')[0]),
      ['LAUNCHER_POD_UNKNOWN', 'SEED_GATE_WAITING'],
      'one Normal Event per state it waited in',
    );
    const disk = lv.domains.get('ns_web')!.live[0];
    assert.match(disk.sourceFile!, /^\/var\/run\/kubevirt-ephemeral-disks\/vmseed\/vmseed-nocloud-[0-9a-f]{16}\.iso$/);
    assert.deepEqual([disk.targetDev, disk.bus, disk.alias], ['sdzz', 'scsi', 'ua-vmseed_seed']);
    assert.deepEqual(lv.domains.get('ns_web')!.config, [], 'live only');
    const publishedName = disk.sourceFile!.split('/').pop()!;
    assert.ok(existsSync(join(pods, POD_1, EPHEMERAL, 'vmseed', publishedName)));
    assert.ok(
      lv.uris.every(
        (u) =>
          u ===
          `qemu+unix:///session?socket=${pods}/${POD_1}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock`,
      ),
    );
    assert.equal(
      lv.calls.some((c) => c[0] === 'resume'),
      false,
    );

    // The same VMI in a new launcher pod (its domain new and empty), paused by
    // its owner: seeded there too, but the gate opened once for this VMI and
    // its start (startStrategy Paused) is over: the pause stays.
    lv.domains.set('ns_web', { state: 'paused', persistent: true, live: [], config: [], unplugs: true, scsi: true });
    const moved = structuredClone(fake.getVmi('ns', 'web')!);
    moved.status!.activePods = { [POD_2]: NODE };
    moved.status!.conditions = [{ type: 'Paused', status: 'True' }];
    // The first pod's injection: the one to wait past (same-second timestamps
    // cannot tell them apart).
    const firstInjection = h.agent.status.get('ns/web')?.injection;
    fake.applyVmi(moved);
    await waitFor('published into the new pod', () =>
      existsSync(join(pods, POD_2, EPHEMERAL, 'vmseed', publishedName)),
    );
    await waitFor('attached in the new launcher', () => lv.domains.get('ns_web')!.live.length === 1);
    assert.ok(lv.uris.at(-1)!.includes(`/${POD_2}/`));
    await waitFor(
      "the old pod's copy released",
      async () => (await readdir(join(pods, POD_1, EPHEMERAL, 'vmseed')).catch(() => [])).length === 0,
    );
    // The new pod's injection (the gate's decision included) is in the status.
    const injected = await waitFor("the new pod's injection reported", () => {
      const inj = h.agent.status.get('ns/web')?.injection;
      return inj && inj !== firstInjection && inj.at !== firstInjection?.at && inj;
    });
    assert.equal(injected.resumed, false);
    assert.deepEqual(fake.unpaused, ['ns/web'], 'not unpaused again');
    assert.equal(lv.domains.get('ns_web')!.state, 'paused');

    // Deleted: detached from the domain, the published copy removed.
    fake.deleteVmi('ns', 'web');
    await waitFor('detached', () => lv.domains.get('ns_web')!.live.length === 0);
    await waitFor(
      'copy removed',
      async () => (await readdir(join(pods, POD_2, EPHEMERAL, 'vmseed')).catch(() => [])).length === 0,
    );
  },
);

test(
  'cross-node migration to this node, seen through kubevirt.io/migrationTargetNodeName: staged in the target pod before it starts, nothing attached; a failed one removes the copy',
  { timeout: 30_000 },
  async (t) => {
    const fake = await FakeKube.start();
    const dir = await tempDir();
    const connection = fake.connection();
    t.after(async () => {
      await connection.close();
      await fake.close();
      await dir.remove();
    });
    const pods = join(dir.path, 'pods');
    await mkdir(join(pods, POD_2, EPHEMERAL), { recursive: true });
    const lv = new FakeLibvirt();
    const injector = kubevirtInjector(
      pods,
      lv,
      kubevirtUnpause(new KubeConnectionApi(connection, { timeoutMs: 2000 })),
    );
    const h = await startAgent(fake, { stateDir: join(dir.path, 'seeds'), injector });
    t.after(h.stop);

    // Running on node-b; KubeVirt scheduled the target pod here and labelled
    // the VMI for this node; kubevirt.io/nodeName still names node-b.
    const SOURCE_POD = 'a0a0a0a0-a0a0-4a0a-8a0a-a0a0a0a0a0a0';
    const incoming = launcherVmi('web', 'ns', 'userData: "#cloud-config\\nhostname: web\\n"\n', POD_2);
    incoming.metadata.labels = { 'kubevirt.io/nodeName': 'node-b', 'kubevirt.io/migrationTargetNodeName': NODE };
    incoming.status = {
      nodeName: 'node-b',
      phase: 'Running',
      activePods: { [SOURCE_POD]: 'node-b', [POD_2]: NODE },
      migrationState: {
        migrationUid: 'm1',
        sourceNode: 'node-b',
        targetNode: NODE,
        sourcePod: 'virt-launcher-web-src',
        targetPod: 'virt-launcher-web-tgt',
      },
    };
    fake.applyVmi(incoming);
    const staged = await waitFor('staged in the target pod', async () =>
      (await readdir(join(pods, POD_2, EPHEMERAL, 'vmseed')).catch(() => [])).find((f) => f.endsWith('.iso')),
    );
    assert.match(staged, /^vmseed-nocloud-[0-9a-f]{16}\.iso$/);
    assert.deepEqual(
      lv.calls.filter((c) => c[0] === 'attach-device'),
      [],
      'nothing attached to the incoming domain',
    );
    assert.equal(
      fake.requests.some((r) => r.subresource === 'unpause'),
      false,
    );

    // The migration fails: KubeVirt drops the target label; the VMI stays on node-b.
    const failed = structuredClone(fake.getVmi('ns', 'web')!);
    failed.metadata.labels = { 'kubevirt.io/nodeName': 'node-b' };
    failed.status!.activePods = { [SOURCE_POD]: 'node-b' };
    failed.status!.migrationState = { ...(failed.status!.migrationState as object), failed: true, completed: true };
    fake.applyVmi(failed);
    await waitFor(
      'the staged copy removed',
      async () => (await readdir(join(pods, POD_2, EPHEMERAL, 'vmseed')).catch(() => [])).length === 0,
    );
  },
);
