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

let busyboxOnce: Promise<BusyboxGuest> | undefined;

/** Kernel + initramfs of the busybox guest, built once into the fixture cache (memoized per process). */
export function ensureBusyboxGuest(): Promise<BusyboxGuest> {
  busyboxOnce ??= buildBusyboxGuest().catch((e) => {
    busyboxOnce = undefined;
    throw e;
  });
  return busyboxOnce;
}

async function buildBusyboxGuest(): Promise<BusyboxGuest> {
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
    for (const m of mods)
      await copyFile(path.join(kernel.modulesDir, m.rel), path.join(root, 'lib', 'modules', `${m.name}.ko`));
    await writeFile(path.join(root, 'etc', 'vmseed-modules'), mods.map((m) => m.name).join('\n') + '\n');
    await sh('cd "$1" && find . | sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2"', [
      root,
      path.join(tmp, 'initramfs.cpio.gz'),
    ]);
    await run('rm', ['-rf', root]);
  });
  return { kernel: kernel.vmlinuz, initramfs: path.join(dir, 'initramfs.cpio.gz'), modulesVersion: kernel.version };
}

/** Kernel command line for the busybox guest (see init.sh for the vmseed.* parameters). */
export interface BusyboxCmdlineOptions {
  /** Volume label to wait for (default cidata). Ignored with url. */
  label?: string;
  /** Files to print, paths inside the image or relative to url; may contain '/'. */
  files: string[];
  /** How long the guest polls for the label (default 60). */
  waitSeconds?: number;
  /** HTTP mode: fetch `<url><file>` with eth0 at 10.0.2.15/24, gateway 10.0.2.2. */
  url?: string;
  /** HTTP mode: seconds per file fetch before giving up (default 20). */
  fetchTimeoutSeconds?: number;
  /** poweroff (default) after printing; stay: keep running (answers ACPI unplug) and print VMSEED-LABEL-GONE when the disk leaves. */
  after?: 'poweroff' | 'stay';
}

export function busyboxCmdline(o: BusyboxCmdlineOptions): string {
  for (const f of o.files)
    if (/[\s,]/.test(f)) throw new Error(`file name cannot be passed on the kernel command line: ${JSON.stringify(f)}`);
  const p = [
    'console=ttyS0',
    'panic=-1',
    // Under TCG on a loaded host the kernel's IO-APIC timer check can miss
    // its ticks and panic ("IO-APIC + timer doesn't work"); the check proves
    // nothing about a virtual timer.
    'no_timer_check',
    'quiet',
    `vmseed.files=${o.files.join(',')}`,
    `vmseed.wait=${o.waitSeconds ?? 60}`,
  ];
  if (o.url) p.push(`vmseed.url=${o.url}`);
  else p.push(`vmseed.label=${o.label ?? 'cidata'}`);
  if (o.fetchTimeoutSeconds !== undefined) p.push(`vmseed.fetchtimeout=${o.fetchTimeoutSeconds}`);
  if (o.after) p.push(`vmseed.after=${o.after}`);
  return p.join(' ');
}
