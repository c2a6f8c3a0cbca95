// The slow test guest: a debootstrapped Debian 12 with cloud-init and systemd,
// as a raw ext4 image (mke2fs -d, no loop mount), booted by direct kernel boot
// with the shared cloud kernel and a small busybox initramfs that mounts
// /dev/vda and switch_roots to systemd. Per-test copies are qcow2 overlays.
import { chmod, copyFile, mkdir, readFile, writeFile } from 'node:fs/promises';
import path from 'node:path';
import { cachedFixture } from './cache.ts';
import { run, sh } from './exec.ts';
import { ensureKernel, resolveModules } from './kernel.ts';

export const DEBIAN_SUITE = 'bookworm';
export const DEBIAN_INCLUDE = [
  'systemd-sysv',
  'udev',
  'kmod',
  'cloud-init',
  'python3-cffi-backend', // without it python3-cryptography fails to configure
  'ifupdown',
  'isc-dhcp-client',
  'netbase',
  'locales', // cloud-init's locale module fails without it
] as const;
const INITRAMFS_MODULES = ['virtio_pci', 'virtio_blk'] as const;
const ROOTFS_SIZE = '2G';
const INIT_SCRIPT = new URL('./debian-init.sh', import.meta.url);

const CLOUD_CFG = `# vmseed test guest
datasource_list: [NoCloud, ConfigDrive, None]
# C.UTF-8 is built into glibc: nothing for cc_locale to generate under TCG.
locale: C.UTF-8
`;
const FSTAB = '/dev/vda / ext4 rw,errors=remount-ro 0 1\n';

export interface DebianGuest {
  kernel: string;
  initramfs: string;
  /** Raw ext4 image. A read-only template: boot a cloneRootfs() copy. */
  rootfs: string;
  /** Kernel command line that boots it with the console on ttyS0. */
  cmdline: string;
}

export interface RootfsClone {
  /** qcow2 overlay backed by the template (the domain XML / QEMU drive must say format qcow2). */
  path: string;
  format: 'qcow2';
}

/** apt's candidate versions, one apt-cache call for all. */
async function aptCandidates(pkgs: readonly string[]): Promise<Record<string, string>> {
  const out = (await run('apt-cache', ['policy', ...pkgs])).stdout;
  const result: Record<string, string> = {};
  for (const block of out.split(/^(?=\S)/m)) {
    const name = /^(\S+):/.exec(block)?.[1];
    const cand = /Candidate: (\S+)/.exec(block)?.[1];
    if (name && cand && cand !== '(none)') result[name] = cand;
  }
  for (const p of pkgs) if (!result[p]) throw new Error(`apt has no candidate for ${p} (run apt-get update)`);
  return result;
}

async function debianMirror(): Promise<string> {
  const text = await readFile('/etc/apt/sources.list.d/debian.sources', 'utf8').catch(() => '');
  const m = /^URIs:\s*(\S+\/debian)\/?\s*$/m.exec(text);
  return m ? m[1] : 'http://deb.debian.org/debian';
}

let debianOnce: Promise<DebianGuest> | undefined;

/** Kernel, initramfs and root filesystem template of the Debian guest, built once into the fixture cache (memoized per process). */
export function ensureDebianGuest(): Promise<DebianGuest> {
  debianOnce ??= buildDebianGuest().catch((e) => {
    debianOnce = undefined;
    throw e;
  });
  return debianOnce;
}

async function buildDebianGuest(): Promise<DebianGuest> {
  const kernel = await ensureKernel();
  const init = await readFile(INIT_SCRIPT, 'utf8');
  const mirror = await debianMirror();
  const inputs: Record<string, unknown> = {
    suite: DEBIAN_SUITE,
    mirror,
    include: [...DEBIAN_INCLUDE],
    // debootstrap takes the newest from the mirror; the host's apt lists track
    // the same mirror, so their candidates stand for what goes in.
    versions: await aptCandidates(['cloud-init', 'systemd', 'debootstrap', 'busybox-static']),
    kernelPackage: kernel.package,
    kernelVersion: kernel.packageVersion,
    initramfsModules: [...INITRAMFS_MODULES],
    init,
    cloudCfg: CLOUD_CFG,
    fstab: FSTAB,
    size: ROOTFS_SIZE,
    layout: 1,
  };
  const { dir } = await cachedFixture('debian-guest', inputs, async (tmp) => {
    const root = path.join(tmp, 'root');
    await run(
      'debootstrap',
      ['--variant=minbase', `--include=${DEBIAN_INCLUDE.join(',')}`, DEBIAN_SUITE, root, mirror],
      { timeoutMs: 15 * 60_000 },
    );
    const modDest = path.join(root, 'usr', 'lib', 'modules');
    await mkdir(modDest, { recursive: true });
    await run('cp', ['-a', kernel.modulesDir, path.join(modDest, kernel.version)], { timeoutMs: 120_000 });
    await run('chroot', [root, 'depmod', kernel.version]);
    await writeFile(path.join(root, 'etc', 'fstab'), FSTAB);
    await writeFile(path.join(root, 'etc', 'hostname'), 'vmseed-guest\n');
    await writeFile(path.join(root, 'etc', 'cloud', 'cloud.cfg.d', '90_vmseed.cfg'), CLOUD_CFG);
    await writeFile(path.join(root, 'etc', 'default', 'locale'), 'LANG=C.UTF-8\n');
    // Fresh identity per boot; an empty machine-id makes systemd generate one.
    await writeFile(path.join(root, 'etc', 'machine-id'), '');
    await sh('rm -rf "$1"/var/cache/apt/archives/*.deb "$1"/var/lib/apt/lists/*_Packages', [root]);
    await run(
      'mke2fs',
      ['-q', '-t', 'ext4', '-L', 'vmseed-root', '-d', root, path.join(tmp, 'rootfs.img'), ROOTFS_SIZE],
      {
        timeoutMs: 300_000,
      },
    );
    await run('rm', ['-rf', root], { timeoutMs: 120_000 });

    const ird = path.join(tmp, 'initrd');
    for (const d of ['bin', 'etc', 'lib/modules', 'proc', 'sys', 'dev', 'newroot'])
      await mkdir(path.join(ird, d), { recursive: true });
    await copyFile('/bin/busybox', path.join(ird, 'bin', 'busybox'));
    await chmod(path.join(ird, 'bin', 'busybox'), 0o755);
    await writeFile(path.join(ird, 'init'), init, { mode: 0o755 });
    const mods = await resolveModules(kernel.modulesDir, INITRAMFS_MODULES);
    for (const m of mods)
      await copyFile(path.join(kernel.modulesDir, m.rel), path.join(ird, 'lib', 'modules', `${m.name}.ko`));
    await writeFile(path.join(ird, 'etc', 'vmseed-modules'), mods.map((m) => m.name).join('\n') + '\n');
    await sh('cd "$1" && find . | sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2"', [
      ird,
      path.join(tmp, 'initramfs.cpio.gz'),
    ]);
    await run('rm', ['-rf', ird]);
  });
  return {
    kernel: kernel.vmlinuz,
    initramfs: path.join(dir, 'initramfs.cpio.gz'),
    rootfs: path.join(dir, 'rootfs.img'),
    // no_timer_check: as for the busybox guest (support/guest/busybox.ts).
    cmdline: 'console=ttyS0 panic=-1 no_timer_check net.ifnames=0',
  };
}

/** A writable per-test root disk in `dir`: a qcow2 overlay on the cached template (instant, ~200 KiB). */
export async function cloneRootfs(dir: string, template?: string): Promise<RootfsClone> {
  const base = template ?? (await ensureDebianGuest()).rootfs;
  await mkdir(dir, { recursive: true });
  const p = path.join(dir, 'root.qcow2');
  await run('qemu-img', ['create', '-q', '-f', 'qcow2', '-F', 'raw', '-b', base, p]);
  return { path: p, format: 'qcow2' };
}

// cloud-init's last console line, "Cloud-init v. X finished at <date>.
// Datasource <ds>.  Up N seconds", can arrive in more than one read of the
// console: waiting for "finished at" alone stopped a run before the
// datasource words were there. Complete once "seconds" follows it.
export function cloudInitFinished(consoleText: string): boolean {
  const m = /Cloud-init v\. \S+ finished at/.exec(consoleText);
  return m !== null && /Up [\d.]+ seconds/.test(consoleText.slice(m.index));
}
