// SLOW (~1 min per boot under TCG): the Debian guest fixture boots directly
// under QEMU (no libvirt) with the NoCloud seed `vmseed build` writes, and
// cloud-init applies it: the datasource, the hostname, a runcmd marker, a user
// with an SSH key and write_files all show on the serial console.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { cloneRootfs, ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { runQemu } from './support/guest/qemu.ts';
import { runCli } from '../test/support/cli.ts';

function userData(marker: string, key: string): string {
  return [
    '#cloud-config',
    'users:',
    '  - name: tester',
    '    ssh_authorized_keys:',
    `      - ${key}`,
    'write_files:',
    '  - path: /etc/vmseed-written',
    '    content: "written-by-write_files\\n"',
    'runcmd:',
    `  - echo ${marker}`,
    '  - echo "WF=$(cat /etc/vmseed-written)"',
    '  - echo "KEY=$(cat /home/tester/.ssh/authorized_keys)"',
    '  - echo "HOST=$(hostname)"',
    '',
  ].join('\n');
}

// Boots the guest on `iso` and checks what cloud-init did with the user-data
// above; `hostname` is the one the seed's meta-data asks for.
async function bootAndCheck(dir: string, iso: string, marker: string, key: string, hostname: string): Promise<void> {
  const guest = await ensureDebianGuest();
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
    // A boot under TCG took over 300 s with the machine loaded by parallel runs.
    timeoutMs: 420_000,
    consoleFile: process.env.VMSEED_DEBIAN_CONSOLE ?? path.join(dir, 'console.log'),
    until: (c) => c.includes(marker) && cloudInitFinished(c),
  });
  const c = run.console;
  const tail = () => `console tail:\n${c.slice(-3000)}`;
  assert.ok(run.stoppedByUntil, `cloud-init did not finish in time; ${tail()}`);
  // runcmd output reaches the console through cloud-final's stdout, prefixed by journald.
  const line = (re: string) => new RegExp(`cloud-init\\[\\d+\\]: ${re}\\r?$`, 'm');
  // The kernel's console lines can cut into cloud-init's under load: the
  // datasource line is matched on its own words, not as one run of text.
  assert.ok(
    /DataSourceNoCloud \[seed=\/dev\/vd/.test(c) || (/DataSourceNoCloud/.test(c) && /seed=\/dev\/vdb/.test(c)),
    `NoCloud datasource on the seed disk; ${tail()}`,
  );
  assert.ok(line(marker).test(c), `runcmd marker; ${tail()}`);
  assert.ok(line('WF=written-by-write_files').test(c), `write_files content; ${tail()}`);
  assert.ok(c.includes(`KEY=${key}`), `authorized key of the created user; ${tail()}`);
  assert.ok(line(`HOST=${hostname}`).test(c), `hostname from the meta-data; ${tail()}`);
  console.log(`# debian guest: cloud-init finished after ${run.seconds.toFixed(1)} s wall (boot under TCG)`);
}

const newKey = () =>
  `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${randomBytes(24).toString('base64').replace(/[+/=]/g, 'x')} tester@vmseed`;

test(
  'SLOW: Debian guest under TCG applies the NoCloud seed vmseed build writes (datasource, hostname, runcmd, user + ssh key, write_files)',
  { timeout: 540_000 },
  async () => {
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-debian-test-'));
    try {
      const marker = `VMSEED-RUNCMD-${randomBytes(6).toString('hex')}`;
      const key = newKey();
      const indented = userData(marker, key)
        .split('\n')
        .map((l) => (l ? `          ${l}` : l))
        .join('\n');
      await writeFile(
        path.join(dir, 'vmi.yaml'),
        `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata: {name: seeded, namespace: default}
spec:
  hostname: seeded-by-vmseed
  domain:
    devices: {disks: [{name: cloudinitdisk, disk: {bus: virtio}}]}
  volumes:
    - name: cloudinitdisk
      cloudInitNoCloud:
        userData: |
${indented}
`,
      );
      const iso = path.join(dir, 'seed.iso');
      const built = await runCli(['build', '--vmi', path.join(dir, 'vmi.yaml'), '-o', iso], dir);
      assert.equal(built.code, 0, built.err);
      await bootAndCheck(dir, iso, marker, key, 'seeded-by-vmseed');
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);
