// Boots test guests with qemu-system-x86_64 under TCG directly (no libvirt).
// Every QEMU started here is killed on timeout, on `until`, on error and when
// this process exits, so a failing test never leaves a guest behind.
import { spawn, type ChildProcess } from 'node:child_process';
import { writeFile } from 'node:fs/promises';
import { busyboxCmdline, ensureBusyboxGuest, parseConsole, type ConsoleResult } from './busybox.ts';

export interface QemuDrive {
  path: string;
  format?: 'raw' | 'qcow2';
  readonly?: boolean;
  /** virtio-blk disk (default), or a CD-ROM / disk on a virtio-scsi controller. */
  bus?: 'virtio' | 'scsi-cd' | 'scsi-hd';
}

export interface QemuNet {
  /** restrict=on (default): the guest reaches nothing but the guestfwd targets. */
  restrict?: boolean;
  /** Guest address:port forwarded to 127.0.0.1:hostPort (QEMU user networking, restrict=on). */
  guestfwd?: { guestIp: string; guestPort: number; hostPort: number };
}

export interface RunQemuOptions {
  kernel: string;
  initrd: string;
  append: string;
  drives?: QemuDrive[];
  net?: QemuNet;
  memoryMb?: number;
  smp?: number;
  timeoutMs: number;
  /** Stop (kill QEMU) as soon as this returns true on the console text so far. */
  until?: (console: string) => boolean;
  /** Also write the console to this file when QEMU ends. */
  consoleFile?: string;
  /** Stop (kill QEMU) when aborted: for a condition the console does not show. */
  signal?: AbortSignal;
  extraQemuArgs?: string[];
}

export interface QemuRun {
  /** QEMU's pid (already exited when the promise settles). */
  pid: number;
  console: string;
  seconds: number;
  exitCode: number | null;
  timedOut: boolean;
  stoppedByUntil: boolean;
}

const live = new Set<ChildProcess>();
let exitHookInstalled = false;
function track(child: ChildProcess): void {
  if (!exitHookInstalled) {
    exitHookInstalled = true;
    process.on('exit', () => {
      for (const c of live) c.kill('SIGKILL');
    });
  }
  live.add(child);
  child.once('exit', () => live.delete(child));
}

/**
 * QEMU's guestfwd value. A `tcp:` target is one chardev connection made once at
 * startup, so only the guest's first connection would work; `cmd:` runs a
 * relay per guest connection (busybox nc: already a fixture dependency).
 */
export function guestfwdSpec(f: { guestIp: string; guestPort: number; hostPort: number }): string {
  if (!/^[0-9.]+$/.test(f.guestIp) || !Number.isInteger(f.guestPort) || !Number.isInteger(f.hostPort)) {
    throw new Error(`invalid guestfwd ${JSON.stringify(f)}`);
  }
  return `tcp:${f.guestIp}:${f.guestPort}-cmd:/bin/busybox nc 127.0.0.1 ${f.hostPort}`;
}

export function qemuArgs(o: RunQemuOptions): string[] {
  const args = [
    '-accel',
    'tcg',
    '-m',
    String(o.memoryMb ?? 256),
    '-smp',
    String(o.smp ?? 1),
    '-nodefaults',
    '-no-user-config',
    '-display',
    'none',
    '-monitor',
    'none',
    '-serial',
    'stdio',
    '-no-reboot',
    '-kernel',
    o.kernel,
    '-initrd',
    o.initrd,
    '-append',
    o.append,
  ];
  const drives = o.drives ?? [];
  if (drives.some((d) => d.bus === 'scsi-cd' || d.bus === 'scsi-hd')) args.push('-device', 'virtio-scsi-pci,id=scsi0');
  drives.forEach((d, i) => {
    if (d.path.includes(',')) throw new Error(`drive path must not contain a comma (QEMU option syntax): ${d.path}`);
    const ro = d.readonly ?? true;
    const media = d.bus === 'scsi-cd' ? ',media=cdrom' : '';
    args.push(
      '-drive',
      `file=${d.path},format=${d.format ?? 'raw'},if=none,id=drive${i}${media}${ro ? ',readonly=on' : ''}`,
    );
    if (d.bus === 'scsi-cd') args.push('-device', `scsi-cd,bus=scsi0.0,drive=drive${i}`);
    else if (d.bus === 'scsi-hd') args.push('-device', `scsi-hd,bus=scsi0.0,drive=drive${i}`);
    else args.push('-device', `virtio-blk-pci,drive=drive${i}`);
  });
  if (o.net) {
    let netdev = `user,id=net0,restrict=${o.net.restrict === false ? 'off' : 'on'}`;
    const f = o.net.guestfwd;
    if (f) netdev += `,guestfwd=${guestfwdSpec(f)}`;
    args.push('-netdev', netdev, '-device', 'virtio-net-pci,netdev=net0');
  }
  args.push(...(o.extraQemuArgs ?? []));
  return args;
}

export function runQemu(o: RunQemuOptions): Promise<QemuRun> {
  const started = process.hrtime.bigint();
  return new Promise((resolve, reject) => {
    const child = spawn('qemu-system-x86_64', qemuArgs(o), { stdio: ['ignore', 'pipe', 'pipe'] });
    track(child);
    let out = '';
    let err = '';
    let timedOut = false;
    let stoppedByUntil = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, o.timeoutMs);
    const stop = () => {
      stoppedByUntil = true;
      child.kill('SIGKILL');
    };
    if (o.signal?.aborted) stop();
    else o.signal?.addEventListener('abort', stop, { once: true });
    child.stdout.setEncoding('utf8').on('data', (chunk: string) => {
      out += chunk;
      if (!stoppedByUntil && o.until?.(out)) {
        stoppedByUntil = true;
        child.kill('SIGKILL');
      }
    });
    child.stderr.setEncoding('utf8').on('data', (chunk: string) => {
      if (err.length < 64 * 1024) err += chunk;
    });
    child.once('error', (e) => {
      clearTimeout(timer);
      reject(e);
    });
    child.once('close', (code) => {
      clearTimeout(timer);
      o.signal?.removeEventListener('abort', stop);
      const seconds = Number(process.hrtime.bigint() - started) / 1e9;
      const result = { pid: child.pid ?? -1, console: out, seconds, exitCode: code, timedOut, stoppedByUntil };
      const done = () => {
        if (!timedOut && !stoppedByUntil && code !== 0) {
          reject(
            new Error(
              `qemu-system-x86_64 exited ${code}: ${err.trim().slice(-2000)}\nconsole tail:\n${out.slice(-2000)}`,
            ),
          );
        } else resolve(result);
      };
      if (o.consoleFile) writeFile(o.consoleFile, out).then(done, reject);
      else done();
    });
  });
}

export interface BootWithImageOptions {
  /** Seed image (ISO 9660). Omit for HTTP mode (url). */
  image?: string;
  label?: string;
  /** Paths inside the image (or relative to url) to print; may contain '/'. */
  files: string[];
  timeoutMs: number;
  /** Attach the image as a SCSI CD-ROM on virtio-scsi instead of a virtio disk. */
  cdrom?: boolean;
  /** HTTP mode: base URL the guest fetches `<url><file>` from (it sits at 10.0.2.15/24, gw 10.0.2.2). */
  url?: string;
  /** With url: forward this guest address:port to 127.0.0.1:hostPort. */
  guestfwd?: { guestIp: string; guestPort: number; hostPort: number };
  /** With url: false turns restrict=on off (only to prove that restrict matters). */
  restrict?: boolean;
  /** HTTP mode: seconds per fetch before the guest gives up (default 20). */
  fetchTimeoutSeconds?: number;
  /** Seconds the guest waits for the label (default: derived from timeoutMs). */
  waitSeconds?: number;
  extraQemuArgs?: string[];
  consoleFile?: string;
}

export interface BootWithImageResult extends ConsoleResult {
  console: string;
  seconds: number;
}

/** Boots the busybox guest on a seed image (or URL) and returns what it printed. */
export async function bootWithImage(o: BootWithImageOptions): Promise<BootWithImageResult> {
  const guest = await ensureBusyboxGuest();
  const append = busyboxCmdline({
    label: o.label,
    files: o.files,
    url: o.url,
    fetchTimeoutSeconds: o.fetchTimeoutSeconds,
    waitSeconds: o.waitSeconds ?? Math.max(5, Math.floor(o.timeoutMs / 1000) - 10),
  });
  const run = await runQemu({
    kernel: guest.kernel,
    initrd: guest.initramfs,
    append,
    drives: o.image ? [{ path: o.image, bus: o.cdrom ? 'scsi-cd' : 'virtio', readonly: true }] : [],
    net: o.url ? { guestfwd: o.guestfwd, restrict: o.restrict } : undefined,
    timeoutMs: o.timeoutMs,
    consoleFile: o.consoleFile,
    extraQemuArgs: o.extraQemuArgs,
  });
  const parsed = parseConsole(run.console);
  if (run.timedOut && !parsed.done) {
    throw new Error(
      `busybox guest did not finish within ${o.timeoutMs} ms; console tail:\n${run.console.slice(-3000)}`,
    );
  }
  return { ...parsed, console: run.console, seconds: run.seconds };
}
