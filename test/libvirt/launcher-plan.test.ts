// Which of this node's launcher pods gets the seed disk, which the image only
// (a migration's target), and which lose our copy, from KubeVirt's
// status.activePods and status.migrationState (VirtualMachineInstanceMigrationState).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { migrationInProgress, migrationStateOf, planLaunchers } from '../../src/libvirt/launcher-pod.ts';
import { VmseedError } from '../../src/errors.ts';

const HERE = 'node-a';
const A = '11111111-1111-4111-8111-111111111111';
const B = '22222222-2222-4222-8222-222222222222';
const T = { namespace: 'ns', name: 'vm' };
const none = { stagedPods: [] };

test('migrationState: the fields vmseed reads, anything else ignored; in progress until completed or failed', () => {
  assert.equal(migrationStateOf({}), undefined);
  assert.equal(migrationStateOf({ migrationState: 'x' }), undefined);
  const m = migrationStateOf({
    migrationState: {
      targetNode: HERE,
      sourceNode: 'node-b',
      targetPod: 'virt-launcher-vm-x',
      startTimestamp: '2026-01-01T00:00:00Z',
      completed: 'yes',
      mode: 'PostCopy',
      targetNodeAddress: '10.0.0.1',
    },
  });
  assert.deepEqual(m, {
    targetNode: HERE,
    sourceNode: 'node-b',
    targetPod: 'virt-launcher-vm-x',
    startTimestamp: '2026-01-01T00:00:00Z',
    completed: false,
    failed: false,
  });
  assert.equal(migrationInProgress(m), true);
  assert.equal(migrationInProgress({ ...m, completed: true }), false);
  assert.equal(migrationInProgress({ ...m, failed: true }), false);
  assert.equal(migrationInProgress({ completed: false, failed: false }), false, 'no target yet: nothing to stage');
});

test('one pod, no migration: attach there; pods we used before and no longer listed are released', async () => {
  assert.deepEqual(await planLaunchers(T, [A], undefined, HERE, none), {
    attachTo: A,
    stageIn: [],
    releaseFrom: [],
    receiving: false,
  });
  assert.deepEqual(await planLaunchers(T, [B], undefined, HERE, { attachedPod: A, stagedPods: [] }), {
    attachTo: B,
    stageIn: [],
    releaseFrom: [A],
    receiving: false,
  });
  assert.deepEqual(await planLaunchers(T, [], undefined, HERE, none), {
    stageIn: [],
    releaseFrom: [],
    receiving: false,
  });
});

test('receiving: every pod here but the remembered source is staged; nothing attached', async () => {
  const cross = { targetNode: HERE, sourceNode: 'node-b', completed: false, failed: false };
  assert.deepEqual(await planLaunchers(T, [B], cross, HERE, none), { stageIn: [B], releaseFrom: [], receiving: true });
  const same = { ...cross, sourceNode: HERE };
  assert.deepEqual(await planLaunchers(T, [A, B], same, HERE, { attachedPod: A, stagedPods: [] }), {
    stageIn: [B],
    releaseFrom: [],
    receiving: true,
  });
  // After a restart the source is not known: both get the (identical) file.
  assert.deepEqual(await planLaunchers(T, [A, B], same, HERE, none), {
    stageIn: [A, B],
    releaseFrom: [],
    receiving: true,
  });
  // Migrating away: this node's pod keeps its disk as usual.
  assert.deepEqual(
    await planLaunchers(T, [A], { ...cross, targetNode: 'node-b', sourceNode: HERE }, HERE, {
      attachedPod: A,
      stagedPods: [],
    }),
    { attachTo: A, stageIn: [], releaseFrom: [], receiving: false },
  );
});

test('two pods after a same-node migration: completed → the staged target, failed → the attached source; the other released', async () => {
  const done = { targetNode: HERE, sourceNode: HERE, completed: true, failed: false };
  const memory = { attachedPod: A, stagedPods: [B] };
  assert.deepEqual(await planLaunchers(T, [A, B], done, HERE, memory), {
    attachTo: B,
    stageIn: [],
    releaseFrom: [A],
    receiving: false,
  });
  assert.deepEqual(await planLaunchers(T, [A, B], { ...done, completed: false, failed: true }, HERE, memory), {
    attachTo: A,
    stageIn: [],
    releaseFrom: [B],
    receiving: false,
  });
});

test('two pods and nothing remembered: the probe decides (exactly one active domain), else LAUNCHER_POD_UNKNOWN', async () => {
  const probed: string[][] = [];
  const probe = (active: string[] | undefined) => async (pods: string[]) => (probed.push(pods), active);
  assert.deepEqual(await planLaunchers(T, [A, B], undefined, HERE, none, probe([B])), {
    attachTo: B,
    stageIn: [],
    releaseFrom: [A],
    receiving: false,
  });
  assert.deepEqual(probed, [[A, B]]);
  for (const active of [[A, B], [], undefined]) {
    await assert.rejects(
      planLaunchers(T, [A, B], undefined, HERE, none, probe(active)),
      (e: unknown) => e instanceof VmseedError && e.code === 'LAUNCHER_POD_UNKNOWN' && e.retryable,
    );
  }
  await assert.rejects(
    planLaunchers(T, [A, B], undefined, HERE, none),
    (e: unknown) => e instanceof VmseedError && e.code === 'LAUNCHER_POD_UNKNOWN',
  );
});

test('a pod UID that is not a UUID is refused before any plan (LAUNCHER_POD_INVALID, terminal)', async () => {
  await assert.rejects(
    planLaunchers(T, [A, 'x/../y'], undefined, HERE, none),
    (e: unknown) =>
      e instanceof VmseedError &&
      e.code === 'LAUNCHER_POD_INVALID' &&
      e.kind === 'terminal' &&
      e.field === 'status.activePods',
  );
});
