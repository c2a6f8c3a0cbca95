// SLOW (~1 min under TCG): the Debian guest fixture boots directly under QEMU
// (no libvirt) with a genisoimage NoCloud seed, and cloud-init applies it:
// the datasource, a runcmd marker, a user with an SSH key and write_files all
// show on the serial console.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { cloneRootfs, ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { runQemu } from './support/guest/qemu.ts';

test(
  'SLOW: Debian guest under TCG applies a genisoimage NoCloud seed with cloud-init (datasource, runcmd, user + ssh key, write_files)',
  { timeout: 300_000 },
  async () => {
    const guest = await ensureDebianGuest();
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-debian-test-'));
    try {
      const marker = `VMSEED-RUNCMD-${randomBytes(6).toString('hex')}`;
      const key = `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${randomBytes(24).toString('base64').replace(/[+/=]/g, 'x')} tester@vmseed`;
      const userData = [
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
        '',
      ].join('\n');
      await writeFile(path.join(dir, 'user-data'), userData);
      await writeFile(path.join(dir, 'meta-data'), 'instance-id: iid-debian-test\nlocal-hostname: seeded\n');
      const iso = path.join(dir, 'seed.iso');
      execFileSync('genisoimage', [
        '-quiet',
        '-o',
        iso,
        '-V',
        'cidata',
        '-J',
        '-R',
        path.join(dir, 'user-data'),
        path.join(dir, 'meta-data'),
      ]);
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
      console.log(`# debian guest: cloud-init finished after ${run.seconds.toFixed(1)} s wall (boot under TCG)`);
    } finally {
      await rm(dir, { recursive: true, force: true });
    }
  },
);
