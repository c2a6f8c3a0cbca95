// The whole KubeVirt-node flow with the real agent on the replica node
// (e2e/kubevirt-node.test.ts builds and checks the replica itself):
// - the agent runs as manifests/daemonset.yaml runs it: its args and env, its
//   user, groups and capability set (setpriv), its volume mounts (the
//   replica's kubelet pods tree at /pods, read-only root), only listeners
//   and the API server connection overridden; it connects through its
//   in-cluster configuration (KUBERNETES_SERVICE_HOST/PORT, the service
//   account's token, CA and namespace files) to the TLS fake API server;
// - the fake API server serves the VMI as KubeVirt does for
//   `spec.startStrategy: Paused`: phase Running, condition Paused, the
//   launcher pod's UID in status.activePods; its `unpause` subresource
//   resumes the replica's domain, as virt-handler → launcher would;
// - the KubeVirt launcher-sync double runs against the domain throughout and
//   must never detach, error, or see a resume it did not order;
// - the busybox guest reads the seed after the unpause; KubeVirt's own
//   hotplug still works; the image is staged in the migration target pod
//   before the migration starts, the migration runs between the two
//   launchers, and the source pod's copy goes when it completes;
// - the owner pauses the migrated VM and the agent restarts: not unpaused.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readdirSync, readFileSync, statSync } from 'node:fs';
import { chmod, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { createKubeletTree, runCommand, QEMU_GID, QEMU_UID, type KubeletTree } from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { makeHotplugVolumeFile, startKubevirtVm } from './support/kubevirt-domain.ts';
import { AGENT, consoleOf } from './support/replica-seed.ts';
import { agentUri, inAgentView } from './support/agent-view.ts';
import {
  listenerUrls,
  LOOPBACK_LISTENERS,
  readDaemonSetAgent,
  startDaemonSetAgent,
  waitHealthy,
  type DaemonSetAgentProcess,
} from './support/daemonset-agent.ts';
import { busyboxCmdline } from './support/guest/busybox.ts';
import { parseConsole } from './support/guest/console.ts';
import { waitUntil } from './support/agent-process.ts';
import { FakeKube } from '../test/support/fake-kube.ts';
import { startClusterObjects } from '../test/support/cluster-objects.ts';
import { serviceAccountVolume } from '../test/support/in-cluster.ts';
import { KubevirtSync, parseDomainDisks, type SyncResult } from '../test/support/kubevirt-sync.ts';
import type { VmiObject } from '../src/api/objects.ts';

const NODE = 'replica-node';
const NS = 'team-a';
const SEED_DIR = '/var/run/kubevirt-ephemeral-disks/vmseed';

let tree: KubeletTree;
let launchers: Launcher[] = [];

before(async () => {
  tree = await createKubeletTree(2);
  launchers = await Promise.all(tree.pods.map((p) => startLauncher(p)));
});

after(async () => {
  await Promise.allSettled(launchers.map((l) => l.stop()));
  await tree?.remove();
});

test('the DaemonSet runs the agent as uid 107 with supplementalGroups [0], no capabilities, the kubelet pods at /pods', () => {
  const ds = readDaemonSetAgent();
  assert.equal(ds.runAsUser, 107);
  assert.equal(ds.runAsGroup, 107);
  assert.deepEqual(ds.supplementalGroups, [0], "group 0 is what gets through the kubelet's 0750 root:root directories");
  assert.deepEqual(ds.capabilities, { drop: ['ALL'], add: [] });
  assert.equal(ds.allowPrivilegeEscalation, false);
  const pods = ds.mounts.find((m) => m.volume.hostPath?.path === '/var/lib/kubelet/pods');
  assert.equal(pods?.mountPath, '/pods');
});

function seedFiles(l: Launcher): string[] {
  const dir = join(l.pod.emptyDir('ephemeral-disks'), 'vmseed');
  return existsSync(dir)
    ? readdirSync(dir)
        .filter((f) => !f.startsWith('.'))
        .sort()
    : [];
}

function vmiObject(o: {
  uid: string;
  userData: string;
  activePods: Record<string, string>;
  paused: boolean;
  migrationState?: Record<string, unknown>;
}): VmiObject {
  return {
    apiVersion: 'kubevirt.io/v1',
    kind: 'VirtualMachineInstance',
    metadata: {
      name: 'vm1',
      namespace: NS,
      uid: o.uid,
      // While it migrates, KubeVirt's migration controller also labels it
      // with the target pod's node (here the same node: two launchers).
      labels: {
        'kubevirt.io/nodeName': NODE,
        ...(o.migrationState && o.migrationState.completed !== true
          ? { 'kubevirt.io/migrationTargetNodeName': NODE }
          : {}),
      },
      // The seed gate's opt-in next to startStrategy: Paused (docs/kubevirt.md, "The seed gate").
      annotations: {
        'vmseed.io/cloud-init': JSON.stringify({ userData: o.userData }),
        'vmseed.io/resume-after-seed': 'true',
      },
    },
    spec: { startStrategy: 'Paused', domain: { firmware: { uuid: o.uid } } },
    status: {
      nodeName: NODE,
      phase: 'Running',
      conditions: o.paused ? [{ type: 'Paused', status: 'True', reason: 'PausedByUser' }] : [],
      activePods: o.activePods,
      ...(o.migrationState ? { migrationState: o.migrationState } : {}),
    },
  };
}

// KubeVirt's launcher, running on its own: a sync every 500 ms (KubeVirt
// syncs on every VMI update and domain event; this is more often than that).
function syncLoop(kubevirt: KubevirtSync, l: Launcher, domain: string) {
  const behindItsBack: string[] = [];
  let stopped = false;
  const done = (async () => {
    while (!stopped) {
      await kubevirt.exclusive(async () => {
        const state = (await l.virsh(['domstate', domain]).catch(() => '')).trim();
        if (state === 'running' && kubevirt.pausedByKubevirt)
          behindItsBack.push(`resumed while KubeVirt still held its pause (${new Date().toISOString()})`);
      });
      await kubevirt.sync();
      await sleep(500);
    }
  })();
  return {
    behindItsBack,
    stop: async () => {
      stopped = true;
      await done;
    },
  };
}

function quietSince(history: SyncResult[], from: number): SyncResult[] {
  return history.slice(from).filter((h) => h.error || h.detached.length || h.updated.length || h.resumed);
}

test(
  "the agent under the DaemonSet's security context seeds a start-paused VMI on the replica node; KubeVirt stays quiet; migration is staged",
  { timeout: 420_000 },
  async (t) => {
    const [a, b] = launchers;
    const fake = await FakeKube.start();
    t.after(() => fake.close());
    const work = await mkdtemp(join(tmpdir(), 'vmseed-kv-agent-'));
    t.after(() => rm(work, { recursive: true, force: true }));
    const vmiUid = randomUUID();

    // The DaemonSet's hostPath /var/lib/vmseed/seeds, handed to 107 by its init container.
    const stateDir = join(work, 'seeds');
    await runCommand(['install', '-d', '-o', String(QEMU_UID), '-g', String(QEMU_GID), '-m', '0755', stateDir]);
    // The vmseed-datasource-key Secret (root-owned 0444 files, as the kubelet projects them).
    // Secrets and the unpause through the cluster component's object
    // service, as the default manifests run the agent.
    const objects = await startClusterObjects(fake, NODE);
    t.after(() => objects.close());
    const keyDir = join(work, 'datasource-key');
    await runCommand(['install', '-d', '-m', '0755', keyDir]);
    await writeFile(join(keyDir, 'keys'), `${randomBytes(32).toString('base64')}\n`, { mode: 0o444 });
    await chmod(work, 0o755);

    const vm = await startKubevirtVm(a, {
      namespace: NS,
      name: 'vm1',
      uuid: vmiUid,
      cmdline: busyboxCmdline({ files: ['user-data', 'meta-data'], waitSeconds: 180, after: 'stay' }),
    });
    t.after(async () => {
      for (const l of [a, b]) {
        await l.virsh(['destroy', vm.domain]).catch(() => {});
        await l.virsh(['undefine', vm.domain]).catch(() => {});
      }
    });
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: a.virsh,
      spec: vm.spec,
      diskReady: a.diskReady,
      startPaused: true,
    });
    const loop = syncLoop(kubevirt, a, vm.domain);
    t.after(() => loop.stop());

    // The unpause subresource resumes the domain before virt-api answers, as
    // virt-handler has the launcher do it (KubeVirt clears its pause record
    // and resumes).
    fake.onUnpause(async (namespace, name) => {
      if (namespace === NS && name === 'vm1') await kubevirt.unpause();
    });

    // A normal start: first scheduled, no launcher pod yet (the agent waits),
    // then running in launcher A, paused at the start for the seed.
    const userData = `#cloud-config\n# kubevirt replica ${randomUUID()}\n`;
    const scheduled = vmiObject({ uid: vmiUid, userData, activePods: {}, paused: false });
    scheduled.status = { nodeName: NODE, phase: 'Scheduled' };
    fake.applyVmi(scheduled);

    const agent: DaemonSetAgentProcess = await startDaemonSetAgent({
      hostPaths: {
        '/var/lib/kubelet/pods': tree.podsDir,
        '/var/lib/vmseed/seeds': stateDir,
        '/var/lib/vmseed/keys': keyDir,
      },
      volumeDirs: objects.volumeDirs,
      nodeName: NODE,
      // In-cluster, as kubelet starts it: KUBERNETES_SERVICE_HOST/PORT and the
      // service-account volume (token, the fake's CA, namespace).
      kube: { inCluster: { host: '127.0.0.1', port: fake.port, saDir: (await serviceAccountVolume(fake, work)).path } },
      overrides: { ...LOOPBACK_LISTENERS, ...objects.overrides, 'log-level': 'debug' },
    });
    t.after(() => agent.stop());
    const urls = await listenerUrls(agent, 90_000);
    assert.ok(!agent.argv.some((a) => a.startsWith('--kubeconfig')), 'the in-cluster configuration, no kubeconfig');
    const detail = async () => {
      const status = await fetch(`${urls.status}/status.json`)
        .then((r) => r.text())
        .catch((e) => String(e));
      return `agent log tail:\n${agent.log().split('\n').slice(-30).join('\n')}\nstatus: ${status.slice(0, 2000)}\nsync errors: ${kubevirt.errors().slice(-3).join('\n')}`;
    };
    await waitHealthy(agent, `${urls.probes}/healthz`, 60_000);
    await waitUntil(
      'the VMI listed over TLS with the service-account token',
      () =>
        fake.requests.some((r) => r.resource === 'virtualmachineinstances' && r.verb === 'list' && r.status === 200),
      30_000,
      detail,
    );
    assert.deepEqual(
      fake.requests.filter((r) => r.status === 401 || r.status === 403).map((r) => `${r.status} ${r.method} ${r.path}`),
      [],
      'authenticated, and RBAC grants all it asks',
    );
    await waitUntil(
      'pending while no launcher pod is reported',
      async () => {
        const st = (await fetch(`${urls.status}/status.json`).then((r) => r.json())) as {
          vmis: Array<{ name: string; state: string; lastError?: { code: string } }>;
        };
        const v = st.vmis.find((x) => x.name === 'vm1');
        return v?.state === 'pending' && v.lastError?.code === 'LAUNCHER_POD_UNKNOWN';
      },
      30_000,
      detail,
    );
    fake.applyVmi(vmiObject({ uid: vmiUid, userData, activePods: { [a.pod.uid]: NODE }, paused: true }));

    // 1. The seed, as vmseed's KubeVirt mode attaches it.
    const seed = await waitUntil(
      'the seed attached in launcher A',
      async () => {
        if (agent.exited()) throw new Error(`the agent exited: ${await detail()}`);
        const live = parseDomainDisks(await a.virsh(['dumpxml', vm.domain]));
        return live.find((d) => d.alias === 'ua-vmseed_seed');
      },
      90_000,
      detail,
    );
    const [image] = seedFiles(a);
    assert.ok(image, "an image in the launcher's ephemeral-disks/vmseed");
    assert.equal(seed.sourceFile, `${SEED_DIR}/${image}`);
    assert.equal(seed.targetDev, 'sdzz');
    assert.equal(seed.bus, 'scsi');
    assert.equal(seed.readonly, true);
    assert.deepEqual(
      { target: seed.address?.target, unit: seed.address?.unit, controller: seed.address?.controller },
      { target: '7', unit: '0', controller: '0' },
    );
    assert.ok(
      !parseDomainDisks(await a.virsh(['dumpxml', '--inactive', vm.domain])).some((d) => d.alias === 'ua-vmseed_seed'),
      'live only',
    );
    const st = statSync(join(a.pod.emptyDir('ephemeral-disks'), 'vmseed', image));
    assert.equal(st.uid, QEMU_UID, 'written by the agent as 107');
    assert.equal(st.gid, QEMU_GID, 'setgid emptyDir: group 107');
    assert.equal(st.mode & 0o022, 0, 'not writable by group or others');
    const inIso = execFileSync(
      'isoinfo',
      ['-i', join(a.pod.emptyDir('ephemeral-disks'), 'vmseed', image), '-R', '-x', '/user-data'],
      { encoding: 'utf8' },
    );
    assert.equal(inIso, userData);

    // 2. The gate: unpause through the API (never a resume behind KubeVirt's back).
    await waitUntil('the unpause subresource called', () => fake.unpaused.includes(`${NS}/vm1`), 60_000, detail);
    await waitUntil(
      'the domain running',
      async () => (await a.virsh(['domstate', vm.domain])).trim() === 'running',
      30_000,
      detail,
    );
    assert.deepEqual(loop.behindItsBack, []);
    // Nothing of that normal start looks like a failure: Normal Events only,
    // no error counted.
    assert.deepEqual(
      fake
        .events()
        .filter((e) => e.type !== 'Normal')
        .map((e) => `${e.reason}: ${e.message}`),
      [],
      'no Warning Event in a normal start',
    );
    assert.ok(
      fake.events().some((e) => e.reason === 'SeedWaiting' && e.message.startsWith('LAUNCHER_POD_UNKNOWN')),
      'the wait for the launcher pod is a Normal SeedWaiting Event',
    );
    const scraped = await fetch(`${urls.probes}/metrics`).then((r) => r.text());
    assert.doesNotMatch(scraped, /^vmseed_reconcile_errors_total\{/m, 'no error code counted');
    assert.match(scraped, /^vmseed_reconcile_total\{result="error"\} 0$/m);
    // The gate's record, next to the VMI's images in the state dir: a restarted
    // agent does not unpause this VMI again.
    const gateRecord = join(stateDir, NS, `vm1_${vmiUid}`, 'seed-gate-opened');
    await waitUntil("the gate's record written", () => existsSync(gateRecord), 30_000, detail);
    assert.equal(statSync(gateRecord).uid, QEMU_UID);

    // 3. The guest reads the seed.
    const seen = await waitUntil(
      'the guest to print the seed',
      () => {
        const c = parseConsole(consoleOf(a, vm));
        return c.done || c.labelTimeout ? c : undefined;
      },
      180_000,
      () => consoleOf(a, vm).split('\n').slice(-15).join('\n'),
    );
    assert.equal(seen.files.get('user-data')?.toString('utf8'), userData);

    // 4. KubeVirt hot-plugs a volume next to the seed: the file first, as
    // virt-handler makes it before the launcher syncs the volume. The mark is
    // read right after hotplug(): each pass works from the spec as it was when
    // its entry was recorded, so the attach is in a pass from the mark on.
    await makeHotplugVolumeFile(a, 'data1');
    const vol = kubevirt.hotplug('data1');
    const mark = kubevirt.history.length;
    assert.equal(vol.targetDev, 'sdb', 'KubeVirt names from the VMI: the seed at sdzz does not move it');
    const hotplugDetail = async () => {
      const at = kubevirt.history.findIndex((h) => h.attached.includes(vol.targetDev));
      const live = await a.virsh(['dumpxml', vm.domain]).then(
        (x) =>
          parseDomainDisks(x)
            .map((d) => `${d.targetDev}=${d.alias ?? '?'}`)
            .join(' '),
        (e: unknown) => String(e),
      );
      return `${await detail()}
mark ${mark} of ${kubevirt.history.length} passes; ${vol.targetDev} attached in pass ${at}; live: ${live}
KubeVirt double since the hotplug: ${JSON.stringify(kubevirt.history.slice(mark).slice(-5))}`;
    };
    await waitUntil(
      "KubeVirt's hotplug attached",
      () => kubevirt.history.slice(mark).some((h) => h.attached.includes(vol.targetDev)),
      60_000,
      hotplugDetail,
    );
    assert.deepEqual(
      kubevirt.history.flatMap((h) => h.attached),
      [vol.targetDev],
      'attached once, by a pass after the hotplug',
    );
    const live = parseDomainDisks(await a.virsh(['dumpxml', vm.domain]));
    assert.ok(
      live.some((d) => d.alias === 'ua-data1' && d.targetDev === vol.targetDev),
      await hotplugDetail(),
    );
    assert.ok(
      live.some((d) => d.alias === 'ua-vmseed_seed' && d.targetDev === 'sdzz'),
      'the seed is still attached',
    );
    assert.deepEqual(quietSince(kubevirt.history, 0), [], 'KubeVirt never detached, ejected, resumed or failed');

    // 5. Migration to launcher B on this node: staged before it starts.
    // What KubeVirt provides in the target pod: every disk of the VMI spec,
    // including the hotplugged volume, at the same path.
    for (const source of kubevirt.spec.map((d) => d.sourceFile!)) {
      const r = await runCommand([
        'install',
        '-D',
        '-o',
        '107',
        '-g',
        '107',
        '-m',
        '0644',
        a.hostPath(source),
        b.hostPath(source),
      ]);
      assert.equal(r.code, 0, r.stderr);
    }
    const migrationUid = randomUUID();
    const migration = {
      migrationUid,
      sourceNode: NODE,
      targetNode: NODE,
      sourcePod: `virt-launcher-vm1-${a.pod.uid.slice(0, 5)}`,
      targetPod: `virt-launcher-vm1-${b.pod.uid.slice(0, 5)}`,
    };
    fake.applyVmi(
      vmiObject({
        uid: vmiUid,
        userData,
        activePods: { [a.pod.uid]: NODE, [b.pod.uid]: NODE },
        paused: false,
        migrationState: migration,
      }),
    );
    await waitUntil('the image staged in the target pod', () => seedFiles(b).includes(image), 60_000, detail);
    assert.deepEqual(
      readFileSync(join(b.pod.emptyDir('ephemeral-disks'), 'vmseed', image)),
      readFileSync(join(a.pod.emptyDir('ephemeral-disks'), 'vmseed', image)),
    );
    const started = new Date().toISOString();
    fake.applyVmi(
      vmiObject({
        uid: vmiUid,
        userData,
        activePods: { [a.pod.uid]: NODE, [b.pod.uid]: NODE },
        paused: false,
        migrationState: { ...migration, startTimestamp: started },
      }),
    );
    loop.behindItsBack.length = 0;
    await loop.stop();
    const migrated = await inAgentView(tree.podsDir, AGENT, [
      'virsh',
      '-q',
      '-c',
      agentUri(a.pod.uid),
      'migrate',
      '--live',
      '--unsafe',
      vm.domain,
      agentUri(b.pod.uid),
      'tcp://127.0.0.1',
    ]);
    assert.equal(migrated.code, 0, migrated.stderr);
    fake.applyVmi(
      vmiObject({
        uid: vmiUid,
        userData,
        activePods: { [b.pod.uid]: NODE },
        paused: false,
        migrationState: {
          ...migration,
          startTimestamp: started,
          endTimestamp: new Date().toISOString(),
          completed: true,
        },
      }),
    );
    const onB = parseDomainDisks(await b.virsh(['dumpxml', vm.domain])).find((d) => d.alias === 'ua-vmseed_seed');
    assert.equal(onB?.sourceFile, `${SEED_DIR}/${image}`);
    const kubevirtB = new KubevirtSync({
      domain: vm.domain,
      virsh: b.virsh,
      spec: kubevirt.spec,
      diskReady: b.diskReady,
    });
    await waitUntil(
      "the source pod's copy removed after the migration completed",
      () => seedFiles(a).length === 0,
      60_000,
      detail,
    );
    for (let i = 0; i < 2; i++)
      assert.deepEqual(quietSince([await kubevirtB.sync()], 0), [], "the target launcher's sync is quiet");
    assert.deepEqual(seedFiles(b), [image], 'the target keeps its copy');
    assert.equal(await agent.stop(), 0);

    // 6. The owner pauses the migrated VM (virtctl pause) and the agent
    // restarts: KubeVirt reports the same Paused condition as for the start
    // pause, the launcher pod is new, the process memory is gone; the gate's
    // record in the state dir keeps the owner's pause.
    await kubevirtB.pause();
    fake.applyVmi(
      vmiObject({
        uid: vmiUid,
        userData,
        activePods: { [b.pod.uid]: NODE },
        paused: true,
        migrationState: {
          ...migration,
          startTimestamp: started,
          endTimestamp: new Date().toISOString(),
          completed: true,
        },
      }),
    );
    const unpausedBefore = fake.unpaused.length;
    const restarted = await startDaemonSetAgent({
      hostPaths: {
        '/var/lib/kubelet/pods': tree.podsDir,
        '/var/lib/vmseed/seeds': stateDir,
        '/var/lib/vmseed/keys': keyDir,
      },
      volumeDirs: objects.volumeDirs,
      nodeName: NODE,
      kube: { inCluster: { host: '127.0.0.1', port: fake.port, saDir: join(work, 'serviceaccount') } },
      overrides: { ...LOOPBACK_LISTENERS, ...objects.overrides, 'log-level': 'debug' },
    });
    t.after(() => restarted.stop());
    const restartedUrls = await listenerUrls(restarted, 90_000);
    await waitHealthy(restarted, `${restartedUrls.probes}/healthz`, 60_000);
    const reconciled = await waitUntil(
      'the restarted agent reconciled the VMI in launcher B',
      async () => {
        const s = (await fetch(`${restartedUrls.status}/status.json`)
          .then((r) => r.json())
          .catch(() => undefined)) as
          | { vmis?: Array<{ name: string; state: string; injection?: { domainState: string; resumed: boolean } }> }
          | undefined;
        return s?.vmis?.find((v) => v.name === 'vm1' && v.injection !== undefined);
      },
      60_000,
      async () => `restarted agent log tail:\n${restarted.log().split('\n').slice(-30).join('\n')}`,
    );
    assert.deepEqual([reconciled.injection!.domainState, reconciled.injection!.resumed], ['paused', false]);
    assert.equal(fake.unpaused.length, unpausedBefore, 'no unpause after the restart');
    assert.equal((await b.virsh(['domstate', vm.domain])).trim(), 'paused', "the owner's pause holds");
    assert.deepEqual(quietSince([await kubevirtB.sync()], 0), [], 'KubeVirt sees its own pause, nothing to resume');
    assert.equal(await restarted.stop(), 0);

    for (const log of [agent.log(), restarted.log()])
      assert.ok(!log.includes(userData.trim().split('\n')[1]), 'no user-data in the agent log');
  },
);
