// SLOW (~1 min under TCG): a KubeVirt volume whose network data vmseed cannot
// interpret (a mapping without "version", as users paste from netplan) is
// written as given, as KubeVirt does, with NETWORKDATA_UNPARSED; cloud-init
// 22.4 in the Debian guest still applies the user-data next to it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { runCli } from '../test/support/cli.ts';
import { cloneRootfs, ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { runQemu } from './support/guest/qemu.ts';

// Above QEMU's own 300 s limit below, so a slow boot fails with the console
// tail rather than as a cancelled test.
test(
  'SLOW: Debian guest applies user-data next to network data cloud-init cannot use (vmseed build --vmi)',
  { timeout: 420_000 },
  async () => {
    const guest = await ensureDebianGuest();
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-debian-kvnet-'));
    try {
      const marker = `VMSEED-KVNET-${randomBytes(6).toString('hex')}`;
      const vmi = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: kvnet, namespace: default}
spec:
  domain:
    firmware: {uuid: 2f1d7c53-3f43-4b8f-9a57-0e4a3d2a9b11}
    devices: {disks: [{name: cloudinitdisk, disk: {bus: virtio}}]}
  volumes:
    - name: cloudinitdisk
      cloudInitNoCloud:
        userData: |
          #cloud-config
          runcmd:
            - echo ${marker}
        networkData: |
          ethernets:
            eth0: {dhcp4: true}
`;
      await writeFile(path.join(dir, 'vmi.yaml'), vmi);
      const iso = path.join(dir, 'seed.iso');
      const built = await runCli(['build', '--vmi', path.join(dir, 'vmi.yaml'), '-o', iso], dir);
      assert.equal(built.code, 0, built.err);
      assert.match(built.err, /warning: NETWORKDATA_UNPARSED: spec\.volumes\[0\]\.cloudInitNoCloud\.networkData/);
      const root = await cloneRootfs(dir, guest.rootfs);
      const run = await runQemu({
        kernel: guest.kernel,
        initrd: guest.initramfs,
        append: guest.cmdline,
        drives: [
          { path: root.path, format: root.format, readonly: false },
          { path: iso, format: 'raw', readonly: true },
        ],
        memoryMb: 512,
        timeoutMs: 300_000,
        consoleFile: process.env.VMSEED_DEBIAN_CONSOLE ?? path.join(dir, 'console.log'),
        until: (c) => c.includes(marker) && cloudInitFinished(c),
      });
      const c = run.console;
      const tail = () => `console tail:\n${c.slice(-4000)}`;
      assert.ok(run.stoppedByUntil, `cloud-init did not finish in time; ${tail()}`);
      assert.ok(
        /Datasource DataSourceNoCloud \[seed=\/dev\/vdb\]/.test(c),
        `NoCloud datasource on the seed disk; ${tail()}`,
      );
      assert.ok(
        new RegExp(`cloud-init\\[\\d+\\]: ${marker}\\r?$`, 'm').test(c),
        `runcmd of the user-data ran; ${tail()}`,
      );
      // What the warning tells the user happens: init-local gives up on the network config.
      assert.ok(
        c.includes('Unknown network config version: None'),
        `init-local rejected the network config; ${tail()}`,
      );
      console.log(
        `# debian guest (unparseable network data): cloud-init finished after ${run.seconds.toFixed(1)} s wall`,
      );
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);
