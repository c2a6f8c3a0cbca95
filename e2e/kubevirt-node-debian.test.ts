// SLOW (one Debian boot under TCG, 1-7 min depending on the machine's load):
// the Debian cloud-init guest in a replica KubeVirt launcher (see
// e2e/kubevirt-node.test.ts) applies the seed vmseed itself makes for it:
// rendered from the VMI's vmseed.io/cloud-init annotation by vmseed's
// renderer, written by its ISO writer into its image store, and attached by
// its injector built from the kubevirt preset, run as the DaemonSet's user
// (uid 107 with group 0, the pods tree at /pods): a copy in the launcher's
// ephemeral-disks, SCSI sdzz at drive target 7, live only. The domain is
// read back with the KubeVirt sync double's own XML reader, the guest boots
// after KubeVirt's unpause and cloud-init applies the user-data and the
// meta-data's hostname; KubeVirt's launcher sync stays quiet throughout. The
// harness control that proves the Debian fixture with a genisoimage seed is
// in e2e/guest-debian.test.ts.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { createHash, randomUUID } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { basename, join } from 'node:path';
import { createKubeletTree, modeOwner, type KubeletTree } from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { startKubevirtVm } from './support/kubevirt-domain.ts';
import { consoleOf } from './support/replica-seed.ts';
import { agentSeed, annotatedVmi, injectAsAgent } from './support/agent-seed.ts';
import { ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { waitUntil } from './support/agent-process.ts';
import { KubevirtSync, parseDomainDisks } from '../test/support/kubevirt-sync.ts';

const NS = 'team-a';
const NAME = 'vm-debian';

let tree: KubeletTree;
let launchers: Launcher[] = [];

before(async () => {
  await ensureDebianGuest();
  tree = await createKubeletTree(1);
  launchers = await Promise.all(tree.pods.map((p) => startLauncher(p)));
});

after(async () => {
  await Promise.allSettled(launchers.map((l) => l.stop()));
  await tree?.remove();
});

test(
  "SLOW: a Debian guest in the launcher applies vmseed's own seed, attached by vmseed's injector as the agent, after KubeVirt's unpause",
  { timeout: 720_000 },
  async (t) => {
    const [b] = launchers;
    const uid = randomUUID();
    const vm = await startKubevirtVm(b, {
      namespace: NS,
      name: NAME,
      uuid: uid,
      cmdline: (await ensureDebianGuest()).cmdline,
      guest: 'debian',
    });
    t.after(async () => {
      await b.virsh(['destroy', vm.domain]).catch(() => {});
      await b.virsh(['undefine', vm.domain]).catch(() => {});
    });
    const kubevirt = new KubevirtSync({
      domain: vm.domain,
      virsh: b.virsh,
      spec: vm.spec,
      diskReady: b.diskReady,
      startPaused: true,
    });
    const quiet = { resumed: false, detached: [], attached: [], updated: [], skippedNotReady: [] };
    assert.deepEqual(await kubevirt.sync(), quiet);

    const marker = `VMSEED-RUNCMD-${randomUUID().slice(0, 8)}`;
    const userData = `#cloud-config\nruncmd:\n  - echo ${marker}\n  - echo "HOST=$(hostname)"\n`;
    const vmi = annotatedVmi({ namespace: NS, name: NAME, uid, pod: b.pod.uid, userData });
    const image = await agentSeed(vmi);
    t.after(() => image.cleanup());
    const r = await injectAsAgent(tree, vmi, image.path);
    assert.deepEqual(
      [r.action, r.domain, r.bus, r.targetDev, r.flags, r.domainState, r.resumed],
      ['attached', vm.domain, 'scsi', 'sdzz', ['--live'], 'paused', false],
    );

    // The copy in the launcher's ephemeral-disks: the store's bytes, the agent's file.
    const copyName = `vmseed-${basename(image.path)}`;
    const copy = join(b.pod.emptyDir('ephemeral-disks'), 'vmseed', copyName);
    assert.equal(createHash('sha256').update(readFileSync(copy)).digest('hex'), image.sha256);
    assert.equal((await modeOwner(copy)).uid, 107);
    const seedPath = `/var/run/kubevirt-ephemeral-disks/vmseed/${copyName}`;
    const live = parseDomainDisks(await b.virsh(['dumpxml', vm.domain]));
    const seed = live.find((d) => d.alias === 'ua-vmseed_seed');
    assert.deepEqual(
      [seed?.sourceFile, seed?.bus, seed?.targetDev, seed?.readonly, seed?.address],
      [seedPath, 'scsi', 'sdzz', true, { type: 'drive', controller: '0', bus: '0', target: '7', unit: '0' }],
    );
    const config = parseDomainDisks(await b.virsh(['dumpxml', '--inactive', vm.domain]));
    assert.ok(!config.some((d) => d.alias === 'ua-vmseed_seed'), 'live only: not in the persistent definition');
    for (let i = 0; i < 2; i++) assert.deepEqual(await kubevirt.sync(), quiet);

    await kubevirt.unpause();
    const started = Date.now();
    const con = await waitUntil(
      'cloud-init to finish',
      () => {
        const text = consoleOf(b, vm);
        return cloudInitFinished(text) ? text : undefined;
      },
      600_000,
      () => consoleOf(b, vm).slice(-3000),
    );
    console.log(`# Debian guest: cloud-init finished ${((Date.now() - started) / 1000).toFixed(1)} s after unpause`);
    assert.match(con, /Datasource DataSourceNoCloud \[seed=\/dev\/sd[a-z]+\]/, 'NoCloud from the SCSI seed');
    assert.match(con, new RegExp(`cloud-init\\[\\d+\\]: ${marker}\\r?$`, 'm'), 'runcmd ran');
    assert.match(con, new RegExp(`cloud-init\\[\\d+\\]: HOST=${NAME}\\r?$`, 'm'), "the meta-data's hostname");
    for (let i = 0; i < 2; i++) assert.deepEqual(await kubevirt.sync(), quiet);
    assert.deepEqual(kubevirt.errors(), []);
  },
);
