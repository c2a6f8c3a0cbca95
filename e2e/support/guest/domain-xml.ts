// libvirt domain XML for test domains: TCG (`type='qemu'`), ACPI (needed for
// PCI hot-plug and for the guest to answer unplug requests), direct kernel
// boot, the serial console written to a file, and optionally a root disk, a
// virtio-scsi controller and QEMU user networking with a guestfwd to loopback.
import { XMLBuilder } from 'fast-xml-parser';
import { guestfwdSpec } from './qemu.ts';

export interface TestDomainOptions {
  name: string;
  kernel: string;
  initrd: string;
  cmdline: string;
  /** Where QEMU writes the serial console (ttyS0). Must be writable by the QEMU process. */
  consoleLog: string;
  memoryMiB?: number;
  vcpus?: number;
  /** Root disk, target vda on virtio. A cloneRootfs() overlay is format qcow2. */
  rootDisk?: { path: string; format: 'raw' | 'qcow2'; readonly?: boolean };
  /** Adds a virtio-scsi controller (index 0) for SCSI CD-ROM hot-plug. */
  scsiController?: boolean;
  /**
   * QEMU user networking, restrict=on (the guest reaches nothing but the
   * forwards). libvirt 9.0's <interface type='user'> cannot express restrict
   * or guestfwd, so the netdev goes through <qemu:commandline>.
   */
  userNet?: { guestfwd?: { guestIp: string; guestPort: number; hostPort: number } };
  uuid?: string;
}

/**
 * The user-mode NIC sits in a fixed high PCI slot on pci.0: libvirt does not
 * know about passthrough devices and hands out slots from the bottom when it
 * hot-plugs disks.
 */
const USERNET_PCI_ADDR = '0x1e';

export function testDomainXml(o: TestDomainOptions): string {
  if (!/^[A-Za-z0-9_.+-]+$/.test(o.name))
    throw new Error(`domain name ${JSON.stringify(o.name)}: use letters, digits, _ . + -`);
  const devices: Record<string, unknown> = {};
  if (o.rootDisk) {
    devices.disk = {
      '@_type': 'file',
      '@_device': 'disk',
      driver: { '@_name': 'qemu', '@_type': o.rootDisk.format },
      source: { '@_file': o.rootDisk.path },
      target: { '@_dev': 'vda', '@_bus': 'virtio' },
      ...(o.rootDisk.readonly ? { readonly: '' } : {}),
    };
  }
  if (o.scsiController) devices.controller = { '@_type': 'scsi', '@_index': '0', '@_model': 'virtio-scsi' };
  devices.serial = { '@_type': 'file', source: { '@_path': o.consoleLog }, target: { '@_port': '0' } };
  devices.memballoon = { '@_model': 'none' };

  const domain: Record<string, unknown> = {
    '@_type': 'qemu',
    ...(o.userNet ? { '@_xmlns:qemu': 'http://libvirt.org/schemas/domain/qemu/1.0' } : {}),
    name: o.name,
    ...(o.uuid ? { uuid: o.uuid } : {}),
    memory: { '@_unit': 'MiB', '#text': String(o.memoryMiB ?? 256) },
    vcpu: String(o.vcpus ?? 1),
    os: {
      type: { '@_arch': 'x86_64', '@_machine': 'pc', '#text': 'hvm' },
      kernel: o.kernel,
      initrd: o.initrd,
      cmdline: o.cmdline,
    },
    features: { acpi: '' },
    on_poweroff: 'destroy',
    on_reboot: 'destroy',
    on_crash: 'destroy',
    devices,
  };
  if (o.userNet) {
    let netdev = 'user,id=vmseednet0,restrict=on';
    if (o.userNet.guestfwd) netdev += `,guestfwd=${guestfwdSpec(o.userNet.guestfwd)}`;
    domain['qemu:commandline'] = {
      'qemu:arg': [
        { '@_value': '-netdev' },
        { '@_value': netdev },
        { '@_value': '-device' },
        { '@_value': `virtio-net-pci,netdev=vmseednet0,bus=pci.0,addr=${USERNET_PCI_ADDR}` },
      ],
    };
    // libvirt starts QEMU with `-sandbox ...,spawn=deny`, and the guestfwd
    // relay is a process QEMU spawns per connection: seccomp kills QEMU at the
    // guest's first connect. Dropping the capability makes libvirt omit
    // -sandbox for this test domain only (a `-sandbox` passthrough cannot
    // loosen a filter already installed).
    if (o.userNet.guestfwd) domain['qemu:capabilities'] = { 'qemu:del': { '@_capability': 'seccomp-sandbox' } };
  }
  const builder = new XMLBuilder({
    ignoreAttributes: false,
    attributeNamePrefix: '@_',
    format: true,
    suppressEmptyNode: true,
  });
  return builder.build({ domain });
}
