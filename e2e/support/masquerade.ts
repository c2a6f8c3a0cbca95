// A VM attached the way KubeVirt's masquerade binding attaches one, inside
// a test's "launcher pod" namespace: a bridge holding the guest's gateway
// address, the VM's tap on it, forwarding on, and the guest's traffic NATed
// to the pod's own address on eth0. Plus the busybox guest booted on it.
import { spawn } from 'node:child_process';
import { ensureBusyboxGuest, busyboxCmdline, parseConsole, type ConsoleResult } from './guest/busybox.ts';
import { qemuArgs } from './guest/qemu.ts';
import { sh, type PodNode } from '../../test/support/netns.ts';

// `gateway`: the busybox guest's static config wants 10.0.2.2 (guest
// 10.0.2.15); KubeVirt's DHCP hands out 10.0.2.1 (guest 10.0.2.2).
export async function masqueradeBinding(env: PodNode, gateway = '10.0.2.2'): Promise<void> {
  for (const cmd of [
    ['ip', 'link', 'add', 'k6t-eth0', 'type', 'bridge'],
    ['ip', 'addr', 'add', `${gateway}/24`, 'dev', 'k6t-eth0'],
    ['ip', 'link', 'set', 'k6t-eth0', 'up'],
    ['ip', 'tuntap', 'add', 'dev', 'tap0', 'mode', 'tap'],
    ['ip', 'link', 'set', 'tap0', 'master', 'k6t-eth0'],
    ['ip', 'link', 'set', 'tap0', 'up'],
    ['sysctl', '-qw', 'net.ipv4.ip_forward=1'],
  ])
    await sh(env.inPod(cmd));
  await sh(env.inPod(['nft', '-f', '-']), {
    input:
      'table ip kubevirt-masq {\n  chain postrouting {\n    type nat hook postrouting priority srcnat; policy accept;\n    ip saddr 10.0.2.0/24 oifname "eth0" counter masquerade\n  }\n}\n',
  });
}

// The busybox guest on tap0 in the pod namespace, fetching `<url><file>`.
export async function bootBusyboxInPod(
  pod: string,
  url: string,
  files: string[],
  timeoutMs: number,
): Promise<ConsoleResult> {
  const guest = await ensureBusyboxGuest();
  const args = qemuArgs({
    kernel: guest.kernel,
    initrd: guest.initramfs,
    append: busyboxCmdline({ url, files, fetchTimeoutSeconds: 15 }),
    timeoutMs,
    extraQemuArgs: [
      '-netdev',
      'tap,id=net0,ifname=tap0,script=no,downscript=no',
      '-device',
      'virtio-net-pci,netdev=net0',
    ],
  });
  const child = spawn('ip', ['netns', 'exec', pod, 'qemu-system-x86_64', ...args], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '';
  let err = '';
  child.stdout.setEncoding('utf8').on('data', (c: string) => (out += c));
  child.stderr.setEncoding('utf8').on('data', (c: string) => (err += c));
  const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
  const code = await new Promise<number | null>((r) => child.once('close', (c) => r(c)));
  clearTimeout(timer);
  const parsed = parseConsole(out);
  if (!parsed.done)
    throw new Error(`guest did not finish (exit ${code}): ${err.slice(-1000)}\nconsole tail:\n${out.slice(-2000)}`);
  return parsed;
}
