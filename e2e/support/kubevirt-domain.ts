// A domain shaped like the one KubeVirt's converter builds for a small VMI on
// q35 (pkg/virt-launcher/virtwrap/converter), defined in a replica launcher
// and started paused as `spec.startStrategy: Paused` does:
// - controllers: usb none, virtio-scsi index 0 (present unless hotplug is
//   disabled: requiresSCSIController), virtio-serial, pcie-root, and
//   pcie-root-ports including free ones reserved for hotplug;
// - disks with `ua-<name>` aliases and KubeVirt's target naming: the
//   containerdisk vda, a data volume vdb, a sata cloud-init-style cdrom sda
//   from ephemeral-disks (not labelled cidata: the seed is the only cidata);
// - the busybox test guest booted from kernel + initramfs, console to a file
//   in the launcher's private emptyDir.
// Only TCG (`type='qemu'`): /dev/kvm is unusable here.
import { execFile } from 'node:child_process';
import { chown, mkdir, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';
import { promisify } from 'node:util';
import { ensureBusyboxGuest } from './guest/busybox.ts';
import { ensureDebianGuest } from './guest/debian.ts';
import { cachedFixture } from './guest/cache.ts';
import { ensureKernel, resolveModules } from './guest/kernel.ts';
import { sh } from './guest/exec.ts';
import { QEMU_GID, QEMU_UID } from './kubelet-tree.ts';
import type { Launcher } from './session-libvirtd.ts';
import { convertVmiDisks, diskXml, type KvDisk, type VmiDisk } from '../../test/support/kubevirt-sync.ts';

const run = promisify(execFile);

// KubeVirt: 4 free ports for hotplug (calculateHotplugPortCountV1, one
// interface) on top of one per device; libvirt adds more if devices need them.
const ROOT_PORTS = 8;

export interface KubevirtVm {
  namespace: string;
  name: string;
  /** KubeVirt names the domain <namespace>_<name>. */
  domain: string;
  uuid: string;
  vmiDisks: VmiDisk[];
  /** convertVmiDisks(vmiDisks): the domain KubeVirt builds from the VMI spec. */
  spec: KvDisk[];
  /** Launcher path of the serial console log. */
  consoleLog: string;
  xml: string;
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/'/g, '&apos;');
}

export function vmiDisksFor(namespace: string, name: string): VmiDisk[] {
  return [
    { name: 'containerdisk', kind: 'disk', bus: 'virtio', source: '/var/run/kubevirt/container-disks/disk_0.img' },
    { name: 'datadisk', kind: 'disk', bus: 'virtio', source: '/var/run/kubevirt-private/vmi-disks/datadisk/disk.img' },
    {
      name: 'cloudinitdisk',
      kind: 'cdrom',
      bus: 'sata',
      source: `/var/run/kubevirt-ephemeral-disks/cloud-init-data/${namespace}/${name}/noCloud.iso`,
    },
  ];
}

export type GuestKind = 'busybox' | 'debian';

export interface GuestBoot {
  kernel: string;
  initrd: string;
  memoryMiB: number;
}

// The Debian test guest's initramfs loads virtio_blk only. Real cloud images
// also carry virtio_scsi and sd_mod in theirs (Debian's and Ubuntu's boot
// from virtio-scsi root disks on GCE); without them a SCSI disk present at
// boot appears only after cloud-init's ds-identify generator has run, and
// cloud-init stays disabled. A second cpio archive appended to the first
// (the kernel unpacks both, later files win) adds the modules and the list.
const SCSI_MODULES = ['virtio_pci', 'virtio_blk', 'virtio_scsi', 'sd_mod'] as const;

async function debianInitrdWithScsi(base: string): Promise<string> {
  const kernel = await ensureKernel();
  const { dir } = await cachedFixture(
    'debian-initramfs-scsi',
    { base, kernel: kernel.packageVersion, modules: [...SCSI_MODULES], layout: 1 },
    async (tmp) => {
      const root = join(tmp, 'root');
      await mkdir(join(root, 'lib', 'modules'), { recursive: true });
      await mkdir(join(root, 'etc'), { recursive: true });
      const mods = await resolveModules(kernel.modulesDir, SCSI_MODULES);
      for (const m of mods)
        await sh('cp "$1" "$2"', [join(kernel.modulesDir, m.rel), join(root, 'lib', 'modules', `${m.name}.ko`)]);
      await writeFile(join(root, 'etc', 'vmseed-modules'), mods.map((m) => m.name).join('\n') + '\n');
      await sh(
        'cd "$1" && find . | sort | cpio -o -H newc -R 0:0 --quiet | gzip -1 > "$2" && cat "$3" "$2" > "$4" && rm -rf "$1" "$2"',
        [root, join(tmp, 'extra.cpio.gz'), base, join(tmp, 'initramfs.cpio.gz')],
      );
    },
  );
  return join(dir, 'initramfs.cpio.gz');
}

async function guestBoot(kind: GuestKind): Promise<GuestBoot> {
  if (kind === 'debian') {
    const g = await ensureDebianGuest();
    return { kernel: g.kernel, initrd: await debianInitrdWithScsi(g.initramfs), memoryMiB: 512 };
  }
  const g = await ensureBusyboxGuest();
  return { kernel: g.kernel, initrd: g.initramfs, memoryMiB: 256 };
}

export async function kubevirtDomainXml(o: {
  namespace: string;
  name: string;
  uuid: string;
  cmdline: string;
  spec: KvDisk[];
  consoleLog: string;
  guest?: GuestKind;
}): Promise<string> {
  const g = await guestBoot(o.guest ?? 'busybox');
  const controllers = [
    "<controller type='usb' index='0' model='none'/>",
    "<controller type='scsi' index='0' model='virtio-non-transitional'/>",
    "<controller type='virtio-serial' index='0' model='virtio-non-transitional'/>",
    "<controller type='pci' index='0' model='pcie-root'/>",
    ...Array.from({ length: ROOT_PORTS }, (_, i) => `<controller type='pci' index='${i + 1}' model='pcie-root-port'/>`),
  ];
  return `<domain type='qemu'>
  <name>${esc(`${o.namespace}_${o.name}`)}</name>
  <uuid>${o.uuid}</uuid>
  <memory unit='MiB'>${g.memoryMiB}</memory>
  <vcpu placement='static'>1</vcpu>
  <sysinfo type='smbios'><system><entry name='uuid'>${o.uuid}</entry><entry name='manufacturer'>KubeVirt</entry><entry name='product'>None</entry></system></sysinfo>
  <os>
    <type arch='x86_64' machine='q35'>hvm</type>
    <kernel>${esc(g.kernel)}</kernel>
    <initrd>${esc(g.initrd)}</initrd>
    <cmdline>${esc(o.cmdline)}</cmdline>
    <smbios mode='sysinfo'/>
  </os>
  <features><acpi/></features>
  <on_poweroff>destroy</on_poweroff>
  <on_reboot>destroy</on_reboot>
  <on_crash>destroy</on_crash>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    ${controllers.join('\n    ')}
    ${o.spec.map((d) => diskXml(d).trim().split('\n').join('\n    ')).join('\n    ')}
    <serial type='file'><source path='${esc(o.consoleLog)}'/><target port='0'/></serial>
    <console type='file'><source path='${esc(o.consoleLog)}'/><target type='serial' port='0'/></console>
    <memballoon model='none'/>
  </devices>
</domain>
`;
}

async function ownedFile(path: string, size: number): Promise<void> {
  await mkdir(dirname(path), { recursive: true });
  await writeFile(path, Buffer.alloc(size));
  await chown(path, QEMU_UID, QEMU_GID);
}

/**
 * Files the launcher's QEMU opens, made as virt-launcher/virt-handler would
 * (owner 107). With the Debian guest the containerdisk is a qcow2 overlay
 * on the cached root filesystem (KubeVirt's containerdisks are overlays too).
 */
async function makeDiskFiles(launcher: Launcher, vmiDisks: VmiDisk[], guest: GuestKind): Promise<void> {
  for (const d of vmiDisks) {
    const host = launcher.hostPath(d.source);
    if (d.name === 'containerdisk' && guest === 'debian') {
      await mkdir(dirname(host), { recursive: true });
      await run('qemu-img', [
        'create',
        '-q',
        '-f',
        'qcow2',
        '-F',
        'raw',
        '-b',
        (await ensureDebianGuest()).rootfs,
        host,
      ]);
      await chown(host, QEMU_UID, QEMU_GID);
    } else if (d.kind === 'cdrom') {
      const dir = await mkdtemp(join(tmpdir(), 'vmseed-kv-cd-'));
      try {
        await writeFile(join(dir, 'README'), 'KubeVirt cloud-init disk stand-in\n');
        await mkdir(dirname(host), { recursive: true });
        await run('genisoimage', ['-quiet', '-V', 'kv-cd', '-J', '-r', '-o', host, join(dir, 'README')]);
        await chown(host, QEMU_UID, QEMU_GID);
      } finally {
        await rm(dir, { recursive: true, force: true });
      }
    } else {
      await ownedFile(host, 1024 * 1024);
    }
  }
}

/** Defines the VM's domain in the launcher and starts it paused (KubeVirt: DomainDefineXML, then Create with START_PAUSED). */
export async function startKubevirtVm(
  launcher: Launcher,
  o: { namespace: string; name: string; uuid: string; cmdline: string; guest?: GuestKind },
): Promise<KubevirtVm> {
  const vm = await defineKubevirtVm(launcher, o);
  await launcher.virsh(['start', '--paused', vm.domain]);
  return vm;
}

/** The domain defined as KubeVirt's launcher defines it, not started. */
export async function defineKubevirtVm(
  launcher: Launcher,
  o: { namespace: string; name: string; uuid: string; cmdline: string; guest?: GuestKind },
): Promise<KubevirtVm> {
  const guest = o.guest ?? 'busybox';
  const vmiDisks = vmiDisksFor(o.namespace, o.name);
  const spec = convertVmiDisks(vmiDisks);
  if (guest === 'debian') spec[0].driver = { ...spec[0].driver, type: 'qcow2' };
  await makeDiskFiles(launcher, vmiDisks, guest);
  const consoleLog = `/var/run/kubevirt-private/vmseed-test-console-${o.name}.log`;
  const xml = await kubevirtDomainXml({ ...o, spec, consoleLog, guest });
  const domain = `${o.namespace}_${o.name}`;
  await launcher.virsh(['define', '/dev/stdin'], xml);
  return { namespace: o.namespace, name: o.name, domain, uuid: o.uuid, vmiDisks, spec, consoleLog, xml };
}

/** A KubeVirt hotplug volume's file as virt-handler leaves it in hotplug-disks: `<volume>.img`, owner 107, writable. */
export async function makeHotplugVolumeFile(launcher: Launcher, volume: string): Promise<string> {
  const launcherPath = `/var/run/kubevirt/hotplug-disks/${volume}.img`;
  await ownedFile(launcher.hostPath(launcherPath), 1024 * 1024);
  return launcherPath;
}
