// The fast test guest: Debian's cloud kernel + a busybox-static initramfs whose
// /init (init.sh) prints seed files on the serial console. See init.sh for the
// vmseed.* kernel parameters it understands.
import { copyFile, mkdir, readFile, writeFile, chmod } from 'node:fs/promises';
import path from 'node:path';
import { cachedFixture } from './cache.ts';
import { run, sh } from './exec.ts';
import { ensureKernel, resolveModules } from './kernel.ts';

export { parseConsole } from './console.ts';
export type { ConsoleResult } from './console.ts';

/** Seed readers (virtio disk, SCSI CD-ROM, ISO 9660) and virtio-net for HTTP mode. */
export const BUSYBOX_MODULES = [
  'virtio_pci',
  'virtio_blk',
  'virtio_scsi',
  'sd_mod',
  'sr_mod',
  'cdrom',
  'isofs',
  'virtio_net',
] as const;

const BUSYBOX_BIN = '/bin/busybox';
const INIT_SCRIPT = new URL('./init.sh', import.meta.url);

export interface BusyboxGuest {
  kernel: string;
  initramfs: string;
  /** uname -r of the kernel, e.g. 6.1.0-56-cloud-amd64 */
  modulesVersion: string;
}

async function dpkgVersion(pkg: string): Promise<string> {
  return (await run('dpkg-query', ['-W', '-f=${Version}', pkg])).stdout.trim();
}

export async function ensureBusyboxGuest(): Promise<BusyboxGuest> {
  const kernel = await ensureKernel();
  const init = await readFile(INIT_SCRIPT, 'utf8');
  const inputs = {
    kernelPackage: kernel.package,
    kernelVersion: kernel.packageVersion,
    busybox: await dpkgVersion('busybox-static'),
    modules: [...BUSYBOX_MODULES],
    init,
    layout: 1,
  };
  const { dir } = await cachedFixture('busybox-initramfs', inputs, async (tmp) => {
    const root = path.join(tmp, 'root');
    for (const d of ['bin', 'etc', 'lib/modules', 'proc', 'sys', 'dev', 'mnt', 'tmp']) {
      await mkdir(path.join(root, d), { recursive: true });
    }
    await copyFile(BUSYBOX_BIN, path.join(root, 'bin', 'busybox'));
    await chmod(path.join(root, 'bin', 'busybox'), 0o755);
    await writeFile(path.join(root, 'init'), init, { mode: 0o755 });
    const mods = await resolveModules(kernel.modulesDir, BUSYBOX_MODULES);
    for (const m of mods) await copyFile(path.join(kernel.modulesDir, m.rel), path.join(root, 'lib', 'modules', `${m.name}.ko`));
    await writeFile(path.join(root, 'etc', 'vmseed-modules'), mods.map((m) => m.name).join('\n') + '\n');
    await sh('cd "$1" && find . | sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2"', [root, path.join(tmp, 'initramfs.cpio.gz')]);
    await run('rm', ['-rf', root]);
  });
  return { kernel: kernel.vmlinuz, initramfs: path.join(dir, 'initramfs.cpio.gz'), modulesVersion: kernel.version };
}
