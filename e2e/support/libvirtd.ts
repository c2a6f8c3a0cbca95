// Starts virtlogd and libvirtd as root without systemd (qemu.conf user/group
// root; virtlogd first, as libvirt's libvirtd.service wants virtlogd.socket)
// and waits until qemu:///system answers.
// Idempotent: several test files may call it at once; a mkdir lock keeps two
// of them from starting a second daemon, and a running daemon is reused.
import { execFile, spawn } from 'node:child_process';
import { mkdirSync, rmdirSync, existsSync, openSync, closeSync, mkdtempSync, writeFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { promisify } from 'node:util';

const run = promisify(execFile);

export const LIBVIRT_URI = 'qemu:///system';
const SOCKET = '/var/run/libvirt/libvirt-sock';
const LOCK = '/tmp/vmseed-libvirtd-start.lock';

async function answers(): Promise<boolean> {
  try {
    await run('virsh', ['-c', LIBVIRT_URI, 'version'], { timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

async function isRunning(name: string): Promise<boolean> {
  try {
    await run('pgrep', ['-x', name]);
    return true;
  } catch {
    return false;
  }
}

function startDetached(cmd: string, args: string[]): void {
  // Own session (setsid): the daemon outlives the test process and never
  // receives the test runner's signals.
  const log = openSync(`/tmp/vmseed-${cmd.split('/').pop()}.log`, 'a');
  const child = spawn('setsid', [cmd, ...args], { detached: true, stdio: ['ignore', log, log] });
  child.unref();
  closeSync(log);
}

async function withLock<T>(fn: () => Promise<T>): Promise<T> {
  const deadline = Date.now() + 60_000;
  for (;;) {
    try {
      mkdirSync(LOCK);
      break;
    } catch {
      if (Date.now() > deadline) throw new Error(`ensureLibvirtd: lock ${LOCK} held for 60 s; remove it if stale`);
      await sleep(100);
    }
  }
  try {
    return await fn();
  } finally {
    rmdirSync(LOCK);
  }
}

export async function ensureLibvirtd(): Promise<void> {
  if (await answers()) return;
  await withLock(async () => {
    if (await answers()) return;
    if (!(await isRunning('virtlogd'))) startDetached('/usr/sbin/virtlogd', []);
    if (!(await isRunning('libvirtd'))) startDetached('/usr/sbin/libvirtd', []);
    // A cold start (capabilities probed, dmidecode, QEMU queried) on a loaded
    // 2-core machine took over 30 s.
    const deadline = Date.now() + 120_000;
    while (Date.now() < deadline) {
      if (existsSync(SOCKET) && (await answers())) return;
      await sleep(100);
    }
    throw new Error(
      'ensureLibvirtd: libvirtd did not answer on qemu:///system within 120 s; see /tmp/vmseed-libvirtd.log',
    );
  });
}

export async function virsh(...args: string[]): Promise<string> {
  const { stdout } = await run('virsh', ['-c', LIBVIRT_URI, ...args], { timeout: 60_000 });
  return stdout;
}

let counter = 0;
export function uniqueName(prefix: string): string {
  counter++;
  return `vmseed-e2e-${prefix}-${process.pid}-${counter}-${Math.random().toString(36).slice(2, 7)}`;
}

// Removes a test domain whatever state it is in.
export async function destroyDomain(name: string): Promise<void> {
  try {
    await run('virsh', ['-c', LIBVIRT_URI, 'destroy', name], { timeout: 30_000 });
  } catch {
    /* not running */
  }
  try {
    await run('virsh', ['-c', LIBVIRT_URI, 'undefine', name], { timeout: 30_000 });
  } catch {
    /* transient or gone */
  }
}

export interface EmptyDomainOptions {
  name: string;
  scsiController?: boolean;
  extraDevices?: string;
}

// A TCG domain with no OS: enough for attach, and for SCSI CD-ROM detach.
// <acpi/> is required for PCI hot-plug of virtio disks.
export function emptyDomainXml(o: EmptyDomainOptions): string {
  return `<domain type='qemu'>
  <name>${o.name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='pc'>hvm</type></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    ${o.scsiController ? "<controller type='scsi' index='0' model='virtio-scsi'/>" : ''}
    ${o.extraDevices ?? ''}
  </devices>
</domain>
`;
}

export async function defineDomain(xml: string, how: 'define' | 'create' = 'define'): Promise<void> {
  const dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-dom-'));
  try {
    writeFileSync(join(dir, 'domain.xml'), xml);
    await run('virsh', ['-c', LIBVIRT_URI, how, join(dir, 'domain.xml')], { timeout: 60_000 });
  } finally {
    rmSync(dir, { recursive: true, force: true });
  }
}

export interface BlkRow {
  type: string;
  device: string;
  target: string;
  source: string;
}

// `virsh domblklist DOM --details [--inactive]`, the check the issue names.
export async function domblklist(name: string, inactive = false): Promise<BlkRow[]> {
  const out = await virsh('domblklist', name, '--details', ...(inactive ? ['--inactive'] : []));
  return out
    .split('\n')
    .slice(2)
    .map((l) => l.trim())
    .filter((l) => l !== '')
    .map((l) => {
      const [type, device, target, ...rest] = l.split(/\s+/);
      return { type, device, target, source: rest.join(' ') };
    });
}

export async function domstate(name: string): Promise<string> {
  return (await virsh('domstate', name)).trim();
}
