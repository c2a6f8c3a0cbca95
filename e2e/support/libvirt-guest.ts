// A libvirt domain running the busybox test guest (direct kernel boot under
// TCG, serial console to a file). It answers ACPI unplug, so virtio disk
// detach really completes, and its /init prints the seed it finds.
import { readFile } from 'node:fs/promises';
import { setTimeout as sleep } from 'node:timers/promises';
import { ensureBusyboxGuest } from './guest/busybox.ts';
import { parseConsole, type ConsoleResult } from './guest/console.ts';

export interface GuestDomainOptions {
  name: string;
  consoleLog: string;
  // Extra kernel parameters, e.g. `vmseed.after=stay`.
  cmdline?: string;
  scsiController?: boolean;
}

function esc(s: string): string {
  return s.replace(/&/g, '&amp;').replace(/</g, '&lt;').replace(/'/g, '&apos;');
}

export async function guestDomainXml(o: GuestDomainOptions): Promise<string> {
  const g = await ensureBusyboxGuest();
  return `<domain type='qemu'>
  <name>${esc(o.name)}</name>
  <memory unit='MiB'>256</memory>
  <vcpu>1</vcpu>
  <os>
    <type arch='x86_64' machine='pc'>hvm</type>
    <kernel>${esc(g.kernel)}</kernel>
    <initrd>${esc(g.initramfs)}</initrd>
    <cmdline>${esc(`console=ttyS0 panic=-1 ${o.cmdline ?? ''}`)}</cmdline>
  </os>
  <features><acpi/></features>
  <on_reboot>destroy</on_reboot>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    ${o.scsiController ? "<controller type='scsi' index='0' model='virtio-scsi'/>" : ''}
    <serial type='file'><source path='${esc(o.consoleLog)}'/><target port='0'/></serial>
    <console type='file'><source path='${esc(o.consoleLog)}'/><target type='serial' port='0'/></console>
  </devices>
</domain>
`;
}

// Polls the console log until `done(result)` holds.
export async function waitForConsole(
  path: string,
  done: (r: ConsoleResult, text: string) => boolean,
  timeoutMs: number,
): Promise<ConsoleResult> {
  const deadline = Date.now() + timeoutMs;
  let text: string;
  for (;;) {
    try {
      text = await readFile(path, 'utf8');
    } catch {
      text = '';
    }
    const r = parseConsole(text);
    if (done(r, text)) return r;
    if (Date.now() > deadline)
      throw new Error(
        `guest console ${path} did not reach the expected state in ${timeoutMs} ms; last lines:\n${text.split('\n').slice(-15).join('\n')}`,
      );
    await sleep(200);
  }
}
