// The reconciler with the KubeVirt-mode injector (LibvirtInjector over a fake
// libvirt daemon per launcher pod, DirPublisher into a temp pods tree):
// migration staging (cross-node and same-node, from status.migrationState and
// status.activePods), the source side cleaned up when it completes, a
// launcher pod re-created (per-pod libvirt or one for the node), the seed
// gate on startStrategy Paused, and launcher pod UIDs that are not UUIDs.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdir, mkdtemp, readdir, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { Reconciler } from '../../src/agent/reconciler.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { VmiRecords } from '../../src/agent/vmi-records.ts';
import { kubevirtUnpause } from '../../src/agent/domain/kubevirt-resume.ts';
import type { KubeApi, KubeResponse } from '../../src/kube/api-client.ts';
import type { EventRecorder } from '../../src/agent/events.ts';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { DirPublisher } from '../../src/libvirt/publish.ts';
import type { DomainDisk } from '../../src/libvirt/disk-xml.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';

const HERE = 'node-a';
const THERE = 'node-b';
const SRC = '11111111-1111-4111-8111-111111111111';
const TGT = '22222222-2222-4222-8222-222222222222';
const EPHEMERAL = 'volumes/kubernetes.io~empty-dir/ephemeral-disks';
const IN_DOMAIN = '/var/run/kubevirt-ephemeral-disks/vmseed/';

function vmiOn(
  node: string,
  activePods: Record<string, string>,
  extra: Record<string, unknown> = {},
  spec: Record<string, unknown> = {},
  annotations: Record<string, string> = {},
): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name: 'web',
      namespace: 'ns',
      uid: 'vmi-uid-1',
      creationTimestamp: '2026-01-02T03:04:05Z',
      labels: { 'kubevirt.io/nodeName': node },
      annotations: { 'vmseed.io/cloud-init': 'userData: |\n  #cloud-config\n  hostname: web\n', ...annotations },
    },
    spec: { domain: {}, ...spec },
    status: { nodeName: node, phase: 'Running', activePods, ...extra },
  };
}

const domain = (d: Partial<FakeDomain> = {}): FakeDomain => ({
  state: 'running',
  persistent: true,
  live: [],
  config: [],
  unplugs: true,
  scsi: true,
  ...d,
});
const seedDisk = (source: string): DomainDisk => ({
  type: 'file',
  device: 'disk',
  bus: 'scsi',
  targetDev: 'sdzz',
  sourceFile: source,
  alias: 'ua-vmseed_seed',
  serial: 'cidata',
  readonly: true,
});

// `shared`: one libvirt and one publish directory for every pod of the node
// (templates without {podUID}), so the injector is not per pod.
async function setup(t: { after(fn: () => Promise<void>): void }, api?: KubeApi, { shared = false } = {}) {
  const root = await mkdtemp(join(tmpdir(), 'vmseed-mig-'));
  t.after(() => rm(root, { recursive: true, force: true }));
  const pods = join(root, 'pods');
  for (const p of [SRC, TGT]) await mkdir(join(pods, p, EPHEMERAL), { recursive: true });
  await mkdir(join(root, 'shared'));
  const lv = new FakeLibvirt();
  const injector = new LibvirtInjector({
    spawner: lv,
    uriTemplate: parseTemplate('uri', `qemu+unix:///session?socket=${shared ? root : `${pods}/{podUID}`}/sock`),
    imagePathTemplate: parseTemplate('image-path', `${IN_DOMAIN}{basename}`),
    publisher: new DirPublisher({
      dirTemplate: parseTemplate('publish-dir', shared ? join(root, 'shared') : `${pods}/{podUID}/${EPHEMERAL}`),
      subdir: 'vmseed',
    }),
    bus: 'scsi',
    liveOnly: true,
    ...(api ? { resume: kubevirtUnpause(api) } : {}),
    sleep: async () => {},
  });
  const cache = new Map<string, VmiObject>();
  const store = new ImageStore({ root: join(root, 'seeds') });
  const events: Array<{ reason: string; message: string }> = [];
  const recorder: EventRecorder = {
    record: (_v, _t, reason, message) => void events.push({ reason, message }),
    flush: async () => {},
  };
  const { logger } = captureLogger('debug');
  const status = new StatusStore({
    version: 't',
    nodeName: HERE,
    stateDir: root,
    config: {},
    watch: () => ({}) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  const make = () =>
    new Reconciler({
      nodeName: HERE,
      cache: { get: (k) => cache.get(k) },
      refs: { getSecret: async () => undefined, getConfigMap: async () => undefined },
      render: renderSeed,
      build: buildSeedImage,
      store,
      injector,
      events: recorder,
      status,
      // A new reconciler is a restarted agent: it remembers no image.
      records: new VmiRecords(),
      logger,
      renderOptions: { kubevirtVolumes: 'ignore', maxUserDataBytes: 1 << 20, maxNetworkDataBytes: 1 << 16 },
      fsync: false,
    });
  const set = (v: VmiObject) => cache.set('ns/web', v);
  const files = async (pod: string) => {
    const dir = join(pods, pod, EPHEMERAL, 'vmseed');
    // Read while the agent publishes and releases copies: gone is empty.
    return (await readdir(dir).catch(() => [])).sort();
  };
  const mutations = () =>
    lv.calls.filter((c) => c[0] === 'attach-device' || c[0] === 'detach-device' || c[0] === 'resume');
  // The published name: the store image's content-addressed name.
  const expectedName = async () => `vmseed-${basename((await store.list()).find((i) => i.name === 'web')!.path)}`;
  return { root, pods, lv, injector, cache, store, status, events, make, set, files, mutations, expectedName };
}

test('cross-node migration to this node: staged in the target pod before it starts, nothing attached; completed → the migrated disk kept as is', async (t) => {
  const s = await setup(t);
  const r = s.make();
  // Only the source runs, on the other node: nothing here.
  s.set(vmiOn(THERE, { [SRC]: THERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(await s.files(TGT), []);
  // The migration's target pod is scheduled here (activePods names it; the
  // migration has no startTimestamp yet).
  const migrating = {
    targetNode: HERE,
    targetPod: 'virt-launcher-web-tgt',
    sourceNode: THERE,
    sourcePod: 'virt-launcher-web-src',
  };
  s.set(vmiOn(THERE, { [SRC]: THERE, [TGT]: HERE }, { migrationState: migrating }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  const name = await s.expectedName();
  assert.match(name, /^vmseed-nocloud-[0-9a-f]{16}\.iso$/);
  assert.deepEqual(await s.files(TGT), [name], 'staged at the same name the source domain uses');
  assert.deepEqual(s.lv.calls, [], 'no libvirt call at all: the incoming domain is not touched');
  assert.match(s.events.at(-1)!.message, /staged for the incoming migration in launcher pod 22222222/);
  // Repeated (e.g. a resync while it migrates): still nothing attached.
  s.set(
    vmiOn(
      THERE,
      { [SRC]: THERE, [TGT]: HERE },
      { migrationState: { ...migrating, startTimestamp: '2026-01-02T04:00:00Z' } },
    ),
  );
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(s.lv.calls, []);

  // Completed: the VMI is this node's; the migrated domain brought our disk.
  s.lv.daemons.set(TGT, new Map([['ns_web', domain({ live: [seedDisk(IN_DOMAIN + name)] })]]));
  s.set(
    vmiOn(
      HERE,
      { [TGT]: HERE },
      {
        migrationState: {
          ...migrating,
          startTimestamp: '2026-01-02T04:00:00Z',
          endTimestamp: '2026-01-02T04:00:09Z',
          completed: true,
        },
      },
    ),
  );
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(s.mutations(), [], 'found in place: no attach, no detach');
  assert.deepEqual(await s.files(TGT), [name]);
  assert.equal(s.status.get('ns/web')?.injection?.targetDev, 'sdzz');
});

test('cross-node migration to this node that fails: the staged copy is removed, no domain touched', async (t) => {
  const s = await setup(t);
  const r = s.make();
  const migrating = { targetNode: HERE, sourceNode: THERE };
  s.set(vmiOn(THERE, { [SRC]: THERE, [TGT]: HERE }, { migrationState: migrating }));
  await r.reconcile('ns/web');
  assert.equal((await s.files(TGT)).length, 1);
  s.set(vmiOn(THERE, { [SRC]: THERE }, { migrationState: { ...migrating, failed: true } }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(await s.files(TGT), []);
  assert.deepEqual(s.mutations(), []);
  assert.deepEqual(await s.store.list(), [], "the node's own image is gone too");
});

test('cross-node migration away from this node: the source keeps its disk while it runs; completed → detached where still there and removed', async (t) => {
  const s = await setup(t);
  const r = s.make();
  s.lv.daemons.set(SRC, new Map([['ns_web', domain()]]));
  s.set(vmiOn(HERE, { [SRC]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  const name = await s.expectedName();
  assert.deepEqual(await s.files(SRC), [name]);
  const migrating = { targetNode: THERE, sourceNode: HERE };
  s.set(vmiOn(HERE, { [SRC]: HERE, [TGT]: THERE }, { migrationState: migrating }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.equal(s.mutations().length, 1, 'only the first attach');
  // Completed: the source domain is shut off (migrated), the VMI is node-b's.
  s.lv.daemons.get(SRC)!.get('ns_web')!.state = 'shut off';
  s.set(vmiOn(THERE, { [SRC]: HERE, [TGT]: THERE }, { migrationState: { ...migrating, completed: true } }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(await s.files(SRC), []);
  assert.deepEqual(
    s.mutations().map((c) => c[0]),
    ['attach-device'],
    'a shut-off domain has no live disk to detach',
  );
});

test("same-node migration: two launcher pods here; the target gets the file, the source keeps its disk; completed → the source's copy removed", async (t) => {
  const s = await setup(t);
  const r = s.make();
  s.lv.daemons.set(SRC, new Map([['ns_web', domain()]]));
  s.set(vmiOn(HERE, { [SRC]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  const name = await s.expectedName();
  assert.deepEqual(
    s.lv.daemons
      .get(SRC)!
      .get('ns_web')!
      .live.map((d) => d.sourceFile),
    [IN_DOMAIN + name],
  );

  const migrating = {
    targetNode: HERE,
    sourceNode: HERE,
    targetPod: 'virt-launcher-web-tgt',
    sourcePod: 'virt-launcher-web-src',
  };
  s.set(vmiOn(HERE, { [SRC]: HERE, [TGT]: HERE }, { migrationState: migrating }));
  assert.equal(await r.reconcile('ns/web'), 'success', 'two pods here no longer stall it');
  assert.deepEqual(await s.files(TGT), [name]);
  assert.deepEqual(await s.files(SRC), [name]);
  assert.equal(s.mutations().length, 1, 'nothing attached to the incoming domain, nothing changed on the source');
  assert.ok(
    s.lv.uris.every((u) => u.includes(SRC)),
    "the target's libvirt is not even asked",
  );

  // Completed; the source pod is still listed until KubeVirt deletes it.
  s.lv.daemons.get(SRC)!.get('ns_web')!.state = 'shut off';
  s.lv.daemons.set(TGT, new Map([['ns_web', domain({ live: [seedDisk(IN_DOMAIN + name)] })]]));
  s.set(vmiOn(HERE, { [SRC]: HERE, [TGT]: HERE }, { migrationState: { ...migrating, completed: true } }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(await s.files(SRC), [], 'the source side cleaned up');
  assert.deepEqual(await s.files(TGT), [name]);
  assert.equal(s.mutations().length, 1);
  assert.ok(s.lv.uris.at(-1)!.includes(TGT));

  // The source pod goes: nothing else happens; deleting the VMI cleans the target.
  s.set(vmiOn(HERE, { [TGT]: HERE }, { migrationState: { ...migrating, completed: true } }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.equal(s.mutations().length, 1);
  s.cache.delete('ns/web');
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(await s.files(TGT), []);
  assert.deepEqual(
    s.mutations().map((c) => c[0]),
    ['attach-device', 'detach-device'],
  );
});

test('same-node migration completed while the agent was restarted: the pod whose domain runs is the current one', async (t) => {
  const s = await setup(t);
  s.lv.daemons.set(SRC, new Map([['ns_web', domain({ state: 'shut off' })]]));
  s.lv.daemons.set(TGT, new Map([['ns_web', domain()]]));
  s.set(
    vmiOn(
      HERE,
      { [SRC]: HERE, [TGT]: HERE },
      { migrationState: { targetNode: HERE, sourceNode: HERE, completed: true } },
    ),
  );
  const r = s.make();
  assert.equal(await r.reconcile('ns/web'), 'success');
  const published = await s.expectedName();
  assert.deepEqual(
    s.lv.daemons
      .get(TGT)!
      .get('ns_web')!
      .live.map((d) => d.sourceFile),
    [IN_DOMAIN + published],
  );
  assert.deepEqual(await s.files(TGT), [published]);
  // Both domains running (a crashed launcher being replaced?): no guess.
  s.lv.daemons.get(SRC)!.get('ns_web')!.state = 'running';
  const r2 = s.make();
  s.set(vmiOn(HERE, { [SRC]: HERE, [TGT]: HERE }));
  assert.equal(await r2.reconcile('ns/web'), 'retry');
  assert.equal(s.status.get('ns/web')?.lastError?.code, 'LAUNCHER_POD_UNKNOWN');
});

const liveSources = (d: FakeDomain | undefined) => d?.live.map((x) => x.sourceFile);

test("the launcher pod re-created on this node: the seed is attached to the new pod's domain, the old pod's copy released", async (t) => {
  const s = await setup(t);
  const r = s.make();
  s.lv.daemons.set(SRC, new Map([['ns_web', domain()]]));
  s.set(vmiOn(HERE, { [SRC]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  const name = await s.expectedName();
  assert.deepEqual(liveSources(s.lv.daemons.get(SRC)!.get('ns_web')), [IN_DOMAIN + name]);

  // KubeVirt replaced the launcher (no migration): the same seed, a new pod
  // whose libvirt holds a new domain without our disk.
  s.lv.daemons.delete(SRC);
  s.lv.daemons.set(TGT, new Map([['ns_web', domain()]]));
  s.set(vmiOn(HERE, { [TGT]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(liveSources(s.lv.daemons.get(TGT)!.get('ns_web')), [IN_DOMAIN + name]);
  const attaches = s.lv.uris.filter((_, i) => s.lv.calls[i][0] === 'attach-device');
  assert.equal(attaches.length, 2);
  assert.ok(attaches[1].includes(`${TGT}/sock`), attaches[1]);
  assert.deepEqual(await s.files(TGT), [name]);
  assert.deepEqual(await s.files(SRC), [], "the old pod's copy released");
  assert.equal(s.status.get('ns/web')?.injection?.targetDev, 'sdzz');
});

test("the launcher pod re-created, one libvirt for the node's pods: the new domain gets the seed again", async (t) => {
  const s = await setup(t, undefined, { shared: true });
  const r = s.make();
  s.lv.domains.set('ns_web', domain());
  s.set(vmiOn(HERE, { [SRC]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  const name = await s.expectedName();
  assert.deepEqual(liveSources(s.lv.domains.get('ns_web')), [IN_DOMAIN + name]);
  // A resync with the same pod: nothing to do.
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.equal(s.mutations().length, 1);

  // The same domain name under the same libvirt, but a new launcher pod
  // defined it afresh: only the pod UID tells it is not the one we attached to.
  s.lv.domains.set('ns_web', domain());
  s.set(vmiOn(HERE, { [TGT]: HERE }));
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(liveSources(s.lv.domains.get('ns_web')), [IN_DOMAIN + name]);
  assert.deepEqual(
    s.mutations().map((c) => c[0]),
    ['attach-device', 'attach-device'],
  );
});

test('status.activePods with a UID that is not a UUID: LAUNCHER_POD_INVALID, terminal, naming status.activePods; nothing written in the pods tree', async (t) => {
  const s = await setup(t);
  const r = s.make();
  s.set(vmiOn(HERE, { '../../../../etc': HERE }));
  assert.equal(await r.reconcile('ns/web'), 'terminal');
  const err = s.status.get('ns/web')?.lastError;
  assert.deepEqual([err?.code, err?.field], ['LAUNCHER_POD_INVALID', 'status.activePods']);
  assert.deepEqual(s.lv.calls, []);
  assert.deepEqual((await readdir(s.pods)).sort(), [SRC, TGT]);
  assert.deepEqual(await s.files(SRC), []);
});

// virt-api's unpause as KubeVirt answers it: 409 until Running and Paused.
class FakeUnpause implements KubeApi {
  calls: string[] = [];
  answers: KubeResponse[] = [];
  async request(method: string, path: string): Promise<KubeResponse> {
    this.calls.push(`${method} ${path}`);
    return this.answers.shift() ?? { status: 200, body: {} };
  }
}

test('seed gate: startStrategy Paused + annotation; waits for Running and Paused=True (SEED_GATE_WAITING), attaches live, then unpause; 409 retried', async (t) => {
  const api = new FakeUnpause();
  const s = await setup(t, api);
  const r = s.make();
  s.lv.daemons.set(SRC, new Map([['ns_web', domain({ state: 'paused' })]]));
  const gated = (extra: Record<string, unknown>) =>
    vmiOn(HERE, { [SRC]: HERE }, extra, { startStrategy: 'Paused' }, { 'vmseed.io/resume-after-seed': 'true' });
  // The domain exists (paused) but KubeVirt has not reported the condition.
  s.set(gated({ phase: 'Scheduled' }));
  assert.equal(await r.reconcile('ns/web'), 'retry');
  const waiting = s.status.get('ns/web')!.lastError!;
  assert.equal(waiting.code, 'SEED_GATE_WAITING');
  assert.match(
    waiting.message,
    /waiting for KubeVirt to report phase Running \(now Scheduled\) and condition Paused=True/,
  );
  assert.deepEqual(api.calls, []);
  assert.equal(s.lv.daemons.get(SRC)!.get('ns_web')!.live.length, 1, 'the seed is in before the unpause');

  // Running and Paused: unpause; virt-api still says 409 once, then 200.
  api.answers.push({ status: 409, body: { message: 'VMI is not running' } });
  s.set(gated({ conditions: [{ type: 'Paused', status: 'True', reason: 'PausedByUser' }] }));
  assert.equal(await r.reconcile('ns/web'), 'retry');
  assert.equal(s.status.get('ns/web')!.lastError!.code, 'VMI_UNPAUSE_FAILED');
  assert.equal(await r.reconcile('ns/web'), 'success');
  assert.deepEqual(
    api.calls,
    Array(2).fill('PUT /apis/subresources.kubevirt.io/v1/namespaces/ns/virtualmachineinstances/web/unpause'),
  );
  assert.equal(s.status.get('ns/web')!.injection!.resumed, true);
  assert.equal(
    s.lv.calls.some((c) => c[0] === 'resume'),
    false,
    'never virsh resume',
  );
  assert.equal(s.mutations().filter((c) => c[0] === 'attach-device').length, 1);
});

test('seed gate: a paused VMI that did not start paused (its owner paused it), or has no annotation, is not unpaused', async (t) => {
  const api = new FakeUnpause();
  const s = await setup(t, api);
  s.lv.daemons.set(SRC, new Map([['ns_web', domain({ state: 'paused' })]]));
  const paused = { conditions: [{ type: 'Paused', status: 'True' }] };
  s.set(vmiOn(HERE, { [SRC]: HERE }, paused, {}, { 'vmseed.io/resume-after-seed': 'true' }));
  assert.equal(await s.make().reconcile('ns/web'), 'success');
  assert.equal(s.status.get('ns/web')!.injection!.resumed, false);
  s.set(vmiOn(HERE, { [SRC]: HERE }, paused, { startStrategy: 'Paused' }));
  assert.equal(await s.make().reconcile('ns/web'), 'success');
  assert.deepEqual(api.calls, []);
});
