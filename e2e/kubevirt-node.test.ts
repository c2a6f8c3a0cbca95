// A replica of a KubeVirt node, below the Kubernetes API: the kubelet's pod
// tree with its modes and owners, two launcher pods each with a session
// libvirtd as uid 107 in a mount namespace shaped like the launcher's, a
// KubeVirt-shaped q35 domain started paused, and a double of KubeVirt's
// launcher disk sync (test/support/kubevirt-sync.ts) running against it.
//
// vmseed's KubeVirt mode, its own seed and injector (e2e/support/agent-seed.ts:
// run as uid 107 with group 0, through /pods, a copy in the launcher's
// ephemeral-disks, SCSI sdzz at drive target 7, alias ua-vmseed_seed, live
// only), must survive KubeVirt's syncs without an error and leave KubeVirt's
// own hotplug working. The harness tests check the replica itself with seeds
// made by hand (genisoimage, e2e/support/replica-seed.ts): its modes and
// owners, the layout shipped before KubeVirt mode (hotplug-disks, virtio vdc,
// ua-vmseed), which must show the fight, so the double can fail, and a
// migration between the two launchers.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { rm } from 'node:fs/promises';
import { basename, join } from 'node:path';
import {
  createKubeletTree,
  modeOwner,
  runCommand,
  setprivArgs,
  EMPTY_DIR,
  LAUNCHER_EMPTY_DIRS,
  type KubeletTree,
} from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { makeHotplugVolumeFile, startKubevirtVm, type KubevirtVm } from './support/kubevirt-domain.ts';
import { agentUri, inAgentView } from './support/agent-view.ts';
import {
  AGENT,
  AGENT_WITHOUT_GROUP_0,
  agentVirsh,
  consoleOf,
  kubevirtSeedDisk,
  oldSeedDisk,
  publishAsAgent,
  seedIso,
  xmlFile,
} from './support/replica-seed.ts';
import { agentSeed, annotatedVmi, injectAsAgent } from './support/agent-seed.ts';
import { busyboxCmdline } from './support/guest/busybox.ts';
import { parseConsole } from './support/guest/console.ts';
import { waitUntil } from './support/agent-process.ts';
import { KubevirtSync, parseDomainDisks } from '../test/support/kubevirt-sync.ts';

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

async function liveAndConfig(l: Launcher, domain: string) {
  return {
    live: parseDomainDisks(await l.virsh(['dumpxml', domain])),
    config: parseDomainDisks(await l.virsh(['dumpxml', '--inactive', domain])),
  };
}

async function newVm(l: Launcher, name: string, t: { after(fn: () => Promise<void>): void }): Promise<KubevirtVm> {
  const vm = await startKubevirtVm(l, {
    namespace: 'team-a',
    name,
    uuid: randomUUID(),
    cmdline: busyboxCmdline({ files: ['user-data', 'meta-data'], waitSeconds: 120, after: 'stay' }),
  });
  t.after(async () => {
    await l.virsh(['destroy', vm.domain]).catch(() => {});
    await l.virsh(['undefine', vm.domain]).catch(() => {});
  });
  return vm;
}

test(
  "harness: kubelet tree: kubelet's modes and owners; uid 107 gets to the launcher socket only with group 0",
  { timeout: 120_000 },
  async () => {
    const [a] = launchers;
    assert.deepEqual(await modeOwner(tree.root), { mode: '0750', uid: 0, gid: 0 });
    assert.deepEqual(await modeOwner(tree.podsDir), { mode: '0750', uid: 0, gid: 0 });
    for (const pod of tree.pods) {
      assert.match(pod.uid, /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/);
      assert.deepEqual(await modeOwner(pod.dir), { mode: '0750', uid: 0, gid: 0 });
      assert.deepEqual(await modeOwner(join(pod.dir, 'volumes')), { mode: '0750', uid: 0, gid: 0 });
      assert.deepEqual(await modeOwner(join(pod.dir, EMPTY_DIR)), { mode: '0755', uid: 0, gid: 0 });
      for (const d of LAUNCHER_EMPTY_DIRS)
        assert.deepEqual(await modeOwner(pod.emptyDir(d)), { mode: '2777', uid: 0, gid: 107 }, d);
    }
    // The daemon's socket: srwx------ 107, as an unprivileged virtqemud makes it.
    const sock = await modeOwner(a.socketOnHost);
    assert.deepEqual(sock, { mode: '0700', uid: 107, gid: 107 });

    // Without group 0, uid 107 stops at the 0750 root:root directories.
    const denied = await runCommand([...setprivArgs(AGENT_WITHOUT_GROUP_0), 'ls', tree.podsDir]);
    assert.notEqual(denied.code, 0);
    assert.match(denied.stderr, /Permission denied/);
    const deniedVirsh = await inAgentView(tree.podsDir, AGENT_WITHOUT_GROUP_0, [
      'virsh',
      '-q',
      '-c',
      agentUri(a.pod.uid),
      'uri',
    ]);
    assert.notEqual(deniedVirsh.code, 0);
    assert.match(deniedVirsh.stderr, /Permission denied/);
    // With supplementalGroups [0] it lists the pods and talks to the launcher.
    const listed = await runCommand([...setprivArgs(AGENT), 'ls', tree.podsDir]);
    assert.equal(listed.code, 0, listed.stderr);
    assert.deepEqual(listed.stdout.trim().split('\n').sort(), tree.pods.map((p) => p.uid).sort());
    assert.equal((await agentVirsh(tree, a.pod.uid, ['uri'])).trim(), agentUri(a.pod.uid));
    // Root with every capability dropped gets through the directories (group
    // 0) but not into the 0700 socket of uid 107.
    const rootNoCaps = await inAgentView(tree.podsDir, { uid: 0, gid: 0, groups: [0] }, [
      'virsh',
      '-q',
      '-c',
      agentUri(a.pod.uid),
      'uri',
    ]);
    assert.notEqual(rootNoCaps.code, 0);
    assert.match(rootNoCaps.stderr, /Permission denied/);
    // A file the agent writes into a launcher emptyDir gets group 107 (setgid).
    const iso = await seedIso('#cloud-config\n');
    try {
      await publishAsAgent(tree, a.pod.uid, 'ephemeral-disks', 'vmseed', iso.path, iso.basename);
      assert.deepEqual(await modeOwner(join(a.pod.emptyDir('ephemeral-disks'), 'vmseed', iso.basename)), {
        mode: '0444',
        uid: 107,
        gid: 107,
      });
    } finally {
      await iso.cleanup();
      await rm(join(a.pod.emptyDir('ephemeral-disks'), 'vmseed'), { recursive: true, force: true });
    }
  },
);

test(
  "vmseed's seed and injector: a live-only SCSI seed in ephemeral-disks survives KubeVirt's syncs, KubeVirt's hotplug still attaches, the guest reads the seed",
  { timeout: 240_000 },
  async (t) => {
    const [a] = launchers;
    const vm = await newVm(a, 'vm-new', t);
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: a.virsh,
      spec: vm.spec,
      diskReady: a.diskReady,
      startPaused: true,
    });
    const quiet = { resumed: false, detached: [], attached: [], updated: [], skippedNotReady: [] };
    assert.deepEqual(await kubevirt.sync(), quiet);
    assert.equal(
      (await a.virsh(['domstate', vm.domain])).trim(),
      'paused',
      'KubeVirt keeps its own start-paused pause',
    );

    const userData = `#cloud-config\n# replica ${randomUUID()}\n`;
    const vmi = annotatedVmi({ namespace: vm.namespace, name: vm.name, uid: vm.uuid, pod: a.pod.uid, userData });
    const image = await agentSeed(vmi);
    t.after(() => image.cleanup());
    const injected = await injectAsAgent(tree, vmi, image.path);
    assert.deepEqual([injected.action, injected.targetDev, injected.flags], ['attached', 'sdzz', ['--live']]);

    const seedPath = `/var/run/kubevirt-ephemeral-disks/vmseed/vmseed-${basename(image.path)}`;
    let disks = await liveAndConfig(a, vm.domain);
    const seed = disks.live.find((d) => d.alias === 'ua-vmseed_seed');
    assert.ok(seed, 'the seed is attached live');
    assert.equal(seed.targetDev, 'sdzz');
    assert.equal(seed.sourceFile, seedPath);
    assert.equal(seed.address?.target, '7');
    assert.ok(!disks.config.some((d) => d.alias === 'ua-vmseed_seed'), 'live only: not in the persistent definition');

    // KubeVirt syncs again and again (every VMI update, every device event).
    for (let i = 0; i < 3; i++) assert.deepEqual(await kubevirt.sync(), quiet);

    // The unpause subresource: the guest boots and finds the seed by label.
    await kubevirt.unpause();
    const seen = await waitUntil(
      'the guest to print the seed',
      () => {
        const c = parseConsole(consoleOf(a, vm));
        return c.done || c.labelTimeout ? c : undefined;
      },
      120_000,
      () => consoleOf(a, vm).split('\n').slice(-15).join('\n'),
    );
    assert.ok(seen.labelFound, 'found LABEL=cidata');
    assert.match(seen.labelFound.dev, /^\/dev\/sd[a-z]$/, 'a SCSI disk in the guest');
    assert.deepEqual(seen.files.get('user-data'), Buffer.from(image.seed.userData));
    assert.ok(seen.files.get('user-data')?.toString('utf8').includes(userData), "the VMI's user-data");
    assert.deepEqual(await kubevirt.sync(), quiet, 'running: still nothing to do');

    // KubeVirt hot-plugs a volume: named by its own rules (sdb), attached
    // LIVE|CONFIG next to the seed.
    await makeHotplugVolumeFile(a, 'data1');
    const vol = kubevirt.hotplug('data1');
    assert.equal(vol.targetDev, 'sdb');
    const r = await kubevirt.sync();
    assert.deepEqual(r.attached, ['sdb']);
    assert.equal(r.error, undefined);
    disks = await liveAndConfig(a, vm.domain);
    assert.ok(disks.live.some((d) => d.alias === 'ua-data1' && d.targetDev === 'sdb'));
    assert.ok(disks.config.some((d) => d.alias === 'ua-data1' && d.targetDev === 'sdb'));
    assert.ok(
      disks.live.some((d) => d.alias === 'ua-vmseed_seed' && d.sourceFile === seedPath),
      'the seed is still attached',
    );
    for (let i = 0; i < 2; i++) assert.deepEqual(await kubevirt.sync(), quiet);
    assert.deepEqual(kubevirt.errors(), []);
  },
);

test(
  'harness control: old layout, live+config: KubeVirt detaches the seed at every sync, the agent re-attaches: the fight',
  { timeout: 240_000 },
  async (t) => {
    const [a] = launchers;
    const vm = await newVm(a, 'vm-old', t);
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: a.virsh,
      spec: vm.spec,
      diskReady: a.diskReady,
      startPaused: true,
    });
    const iso = await seedIso('#cloud-config\n# old layout\n');
    t.after(() => iso.cleanup());
    await publishAsAgent(tree, a.pod.uid, 'hotplug-disks', '', iso.path, iso.basename);
    // A running guest answers the virtio unplug (paused, the disk would stay).
    await kubevirt.unpause();
    const seedXml = await xmlFile(tree, 'old-seed', oldSeedDisk(iso.basename, 'vdc'));
    for (let round = 1; round <= 2; round++) {
      await agentVirsh(tree, a.pod.uid, ['attach-device', vm.domain, seedXml, '--live', '--config']);
      assert.ok(
        (await liveAndConfig(a, vm.domain)).live.some((d) => d.alias === 'ua-vmseed'),
        `round ${round}: attached`,
      );
      // The guest has seen it (an unplug request sent while the guest is still
      // booting is lost, and the disk would stay).
      if (round === 1) {
        await waitUntil(
          'the guest to read the seed',
          () => parseConsole(consoleOf(a, vm)).done,
          120_000,
          () => consoleOf(a, vm).split('\n').slice(-15).join('\n'),
        );
      }
      const r = await kubevirt.sync();
      assert.deepEqual(r.detached, ['vdc'], `round ${round}: KubeVirt detaches the seed`);
      assert.equal(r.error, undefined);
      await waitUntil(
        `round ${round}: the seed gone from the live domain`,
        async () => !(await liveAndConfig(a, vm.domain)).live.some((d) => d.alias === 'ua-vmseed'),
        30_000,
      );
      assert.ok(!(await liveAndConfig(a, vm.domain)).config.some((d) => d.alias === 'ua-vmseed'));
    }
    assert.ok(parseConsole(consoleOf(a, vm)).labelGoneUptime !== undefined, 'the guest lost its seed');
  },
);

test(
  "harness control: old layout, live only: every KubeVirt sync fails on the config half, and KubeVirt's own hotplug never runs",
  { timeout: 180_000 },
  async (t) => {
    const [a] = launchers;
    const vm = await newVm(a, 'vm-old-live', t);
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: a.virsh,
      spec: vm.spec,
      diskReady: a.diskReady,
      startPaused: true,
    });
    const iso = await seedIso('#cloud-config\n# old layout, live only\n');
    t.after(() => iso.cleanup());
    await publishAsAgent(tree, a.pod.uid, 'hotplug-disks', '', iso.path, iso.basename);
    await agentVirsh(tree, a.pod.uid, [
      'attach-device',
      vm.domain,
      await xmlFile(tree, 'old-seed', oldSeedDisk(iso.basename, 'vdc')),
      '--live',
    ]);
    await makeHotplugVolumeFile(a, 'data9');
    kubevirt.hotplug('data9');
    for (let i = 0; i < 2; i++) {
      const r = await kubevirt.sync();
      assert.match(
        r.error ?? '',
        /device not found: no target device vdc/,
        `sync ${i + 1} fails on the seed: ${r.error}`,
      );
      assert.deepEqual(r.attached, []);
    }
    const disks = await liveAndConfig(a, vm.domain);
    assert.ok(
      disks.live.some((d) => d.alias === 'ua-vmseed'),
      'the seed stays',
    );
    assert.ok(!disks.live.some((d) => d.alias === 'ua-data9'), "KubeVirt's volume never attached");
    console.log(`# KubeVirt's sync error with a live-only seed under hotplug-disks: ${kubevirt.errors()[0]}`);
  },
);

test(
  'harness: migration: the seed must already sit at the same path in the target pod; staged there, a live migration between the two launchers works',
  { timeout: 240_000 },
  async (t) => {
    const [a, b] = launchers;
    const vm = await newVm(a, 'vm-mig', t);
    t.after(async () => {
      await b.virsh(['destroy', vm.domain]).catch(() => {});
      await b.virsh(['undefine', vm.domain]).catch(() => {});
    });
    const userData = `#cloud-config\n# migrating ${randomUUID()}\n`;
    const iso = await seedIso(userData);
    t.after(() => iso.cleanup());
    await publishAsAgent(tree, a.pod.uid, 'ephemeral-disks', 'vmseed', iso.path, iso.basename);
    await agentVirsh(tree, a.pod.uid, [
      'attach-device',
      vm.domain,
      await xmlFile(tree, 'seed', kubevirtSeedDisk(iso.basename)),
      '--live',
    ]);
    const source = new KubevirtSync({
      domain: vm.domain,
      virsh: a.virsh,
      spec: vm.spec,
      diskReady: a.diskReady,
      startPaused: true,
    });
    await source.unpause();
    await waitUntil(
      'the guest to read the seed',
      () => parseConsole(consoleOf(a, vm)).done,
      120_000,
      () => consoleOf(a, vm).split('\n').slice(-15).join('\n'),
    );

    // The target launcher has what KubeVirt provides there: the containerdisk,
    // the (shared) data volume, a cloud-init ISO of the same size.
    for (const d of vm.vmiDisks) {
      const r = await runCommand([
        'install',
        '-D',
        '-o',
        '107',
        '-g',
        '107',
        '-m',
        '0644',
        a.hostPath(d.source),
        b.hostPath(d.source),
      ]);
      assert.equal(r.code, 0, r.stderr);
    }
    const migrate = () =>
      inAgentView(tree.podsDir, AGENT, [
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

    // Not staged: the target QEMU cannot open the read-only seed (it is not copied).
    const failed = await migrate();
    assert.notEqual(failed.code, 0, 'migration without the staged seed must fail');
    assert.match(failed.stderr, new RegExp(iso.basename.replace(/\./g, '\\.')));
    assert.equal((await a.virsh(['domstate', vm.domain])).trim(), 'running', 'the VM stays on the source');

    // Staged as the agent does it: same name, same launcher path in the target pod.
    await publishAsAgent(tree, b.pod.uid, 'ephemeral-disks', 'vmseed', iso.path, iso.basename);
    const seedPath = `/var/run/kubevirt-ephemeral-disks/vmseed/${iso.basename}`;
    const inTarget = await b.exec(['sha256sum', seedPath]);
    assert.equal(inTarget.code, 0, inTarget.stderr);
    assert.equal(inTarget.stdout.split(' ')[0], createHash('sha256').update(readFileSync(iso.path)).digest('hex'));

    const started = Date.now();
    const ok = await migrate();
    assert.equal(ok.code, 0, ok.stderr);
    console.log(`# live migration between the two session daemons: ${((Date.now() - started) / 1000).toFixed(1)} s`);
    assert.equal((await b.virsh(['domstate', vm.domain])).trim(), 'running');
    // The source's domain object is torn down right after the handover; for
    // a moment a name lookup can succeed and the state call miss it. Gone or
    // shut off, it is not running there.
    const sourceState = await a.virsh(['domstate', vm.domain]).then(
      (out) => out.trim(),
      (err: Error) => {
        // virsh says "failed to get domain" when its lookup by name misses.
        if (/Domain not found|failed to get domain/.test(err.message)) return 'absent';
        throw err;
      },
    );
    assert.notEqual(sourceState, 'running');
    const target = parseDomainDisks(await b.virsh(['dumpxml', vm.domain]));
    const seed = target.find((d) => d.alias === 'ua-vmseed_seed');
    assert.equal(seed?.sourceFile, seedPath);
    assert.equal(seed?.targetDev, 'sdzz');
    // KubeVirt's launcher on the target syncs the migrated domain: quiet.
    const kubevirtB = new KubevirtSync({ domain: vm.domain, virsh: b.virsh, spec: vm.spec, diskReady: b.diskReady });
    assert.deepEqual(await kubevirtB.sync(), {
      resumed: false,
      detached: [],
      attached: [],
      updated: [],
      skippedNotReady: [],
    });
  },
);
