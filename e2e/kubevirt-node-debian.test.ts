// SLOW (one Debian boot under TCG, 1-2 min): the Debian cloud-init guest in a
// replica KubeVirt launcher (see e2e/kubevirt-node.test.ts) finds vmseed's
// KubeVirt-mode seed (SCSI sdzz in ephemeral-disks, attached live only by
// uid 107 with group 0 through /pods) after KubeVirt's unpause, and applies it;
// KubeVirt's launcher sync stays quiet.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { createKubeletTree, type KubeletTree } from './support/kubelet-tree.ts';
import { startLauncher, type Launcher } from './support/session-libvirtd.ts';
import { startKubevirtVm } from './support/kubevirt-domain.ts';
import { agentVirsh, consoleOf, kubevirtSeedDisk, publishAsAgent, seedIso, xmlFile } from './support/replica-seed.ts';
import { ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { waitUntil } from './support/agent-process.ts';
import { KubevirtSync } from '../test/support/kubevirt-sync.ts';

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
  "SLOW: a Debian guest in the launcher applies the SCSI seed with cloud-init after KubeVirt's unpause",
  { timeout: 420_000 },
  async (t) => {
    const [b] = launchers;
    const vm = await startKubevirtVm(b, {
      namespace: 'team-a',
      name: 'vm-debian',
      uuid: randomUUID(),
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
    const marker = `VMSEED-RUNCMD-${randomUUID().slice(0, 8)}`;
    const iso = await seedIso(`#cloud-config\nruncmd:\n  - echo ${marker}\n`);
    t.after(() => iso.cleanup());
    await publishAsAgent(tree, b.pod.uid, 'ephemeral-disks', 'vmseed', iso.path, iso.basename);
    await agentVirsh(tree, b.pod.uid, [
      'attach-device',
      vm.domain,
      await xmlFile(tree, 'seed', kubevirtSeedDisk(iso.basename)),
      '--live',
    ]);
    await kubevirt.unpause();
    const started = Date.now();
    const con = await waitUntil(
      'cloud-init to finish',
      () => {
        const text = consoleOf(b, vm);
        return cloudInitFinished(text) ? text : undefined;
      },
      360_000,
      () => consoleOf(b, vm).slice(-3000),
    );
    console.log(`# Debian guest: cloud-init finished ${((Date.now() - started) / 1000).toFixed(1)} s after unpause`);
    assert.match(con, /Datasource DataSourceNoCloud \[seed=\/dev\/sd[a-z]+\]/, 'NoCloud from the SCSI seed');
    assert.match(con, new RegExp(`cloud-init\\[\\d+\\]: ${marker}\\r?$`, 'm'), 'runcmd ran');
    for (let i = 0; i < 2; i++)
      assert.deepEqual(await kubevirt.sync(), {
        resumed: false,
        detached: [],
        attached: [],
        updated: [],
        skippedNotReady: [],
      });
  },
);
