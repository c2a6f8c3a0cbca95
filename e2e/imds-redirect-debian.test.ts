// SLOW (a Debian guest under TCG): cloud-init 22.4 in a real guest applies
// user-data it fetched from 169.254.169.254 through the node-level redirect.
// Network namespaces made by this test only: a "node" namespace runs the
// datasource listener on the node's address and vmseed's nftables DNAT; a
// "launcher pod" namespace (veth to the node, default route through it)
// holds the guest attached as KubeVirt's masquerade binding attaches one: a
// tap on a bridge, a DHCP server handing the guest its address (busybox
// udhcpd standing in for virt-launcher's), and NAT to the pod's address.
// The guest has no seed disk: only the DMI serial
// `ds=nocloud-net;s=http://169.254.169.254/v1/<token>/`.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import pino from 'pino';
import { signToken } from '../src/datasource/tokens.ts';
import { execNft, RedirectKeeper } from '../src/redirect/keeper.ts';
import { cloneRootfs, ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { qemuArgs } from './support/guest/qemu.ts';
import { masqueradeBinding } from './support/masquerade.ts';
import { makePodNode, sh, startNodeDatasource, stopChild } from '../test/support/netns.ts';

test(
  'SLOW: Debian guest behind a masquerade-style tap gets its seed from 169.254.169.254 over the redirect and cloud-init applies it',
  { timeout: 600_000 },
  async (t) => {
    const guest = await ensureDebianGuest();
    const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-imds-debian-'));
    const env = await makePodNode();
    const cleanups: Array<() => Promise<unknown>> = [];
    t.after(async () => {
      for (const c of cleanups.reverse()) await c().catch(() => {});
      await env.remove();
      await rm(dir, { recursive: true, force: true });
    });
    await masqueradeBinding(env, '10.0.2.1');
    // KubeVirt's masquerade addresses: gateway 10.0.2.1, guest 10.0.2.2.
    const conf = path.join(dir, 'udhcpd.conf');
    await writeFile(
      conf,
      `start 10.0.2.2\nend 10.0.2.2\ninterface k6t-eth0\nlease_file ${path.join(dir, 'leases')}\noption subnet 255.255.255.0\noption router 10.0.2.1\noption lease 3600\n`,
    );
    await writeFile(path.join(dir, 'leases'), '');
    const dhcp = spawn('ip', ['netns', 'exec', env.pod, 'busybox', 'udhcpd', '-f', conf], { stdio: 'ignore' });
    cleanups.push(async () => void dhcp.kill('SIGKILL'));

    const key = randomBytes(32);
    const ds = await startNodeDatasource(env, key, 'uid-debian');
    cleanups.push(() => stopChild(ds));
    const keeper = new RedirectKeeper({
      spec: {
        table: 'vmseed',
        to: { host: env.nodeAddress, port: 8081 },
        podInterfaces: ['veth*'],
        metadata: { address: '169.254.169.254', port: 80 },
      },
      runner: execNft({ prefix: env.inNode([]) }),
      logger: pino({ level: 'silent' }),
      // The pod is a launcher: the only sources redirected.
      launchers: async () => [env.podAddress],
    });
    await keeper.tick('start');
    assert.equal(keeper.inPlace, true);
    cleanups.push(() => keeper.stop());

    const seedUrl = `http://169.254.169.254/v1/${signToken(new Uint8Array(key), 'uid-debian')}/`;
    const root = await cloneRootfs(dir, guest.rootfs);
    const args = qemuArgs({
      kernel: guest.kernel,
      initrd: guest.initramfs,
      append: guest.cmdline,
      drives: [{ path: root.path, format: root.format, readonly: false }],
      memoryMb: 512,
      timeoutMs: 540_000,
      extraQemuArgs: [
        '-smbios',
        `type=1,serial=ds=nocloud-net;s=${seedUrl}`,
        '-netdev',
        'tap,id=net0,ifname=tap0,script=no,downscript=no',
        '-device',
        'virtio-net-pci,netdev=net0',
      ],
    });
    const qemu = spawn('ip', ['netns', 'exec', env.pod, 'qemu-system-x86_64', ...args], {
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    cleanups.push(async () => void qemu.kill('SIGKILL'));
    let c = '';
    qemu.stdout.setEncoding('utf8').on('data', (d: string) => (c += d));
    const deadline = Date.now() + 540_000;
    while (Date.now() < deadline && !cloudInitFinished(c) && qemu.exitCode === null)
      await new Promise((r) => setTimeout(r, 500));
    qemu.kill('SIGKILL');
    if (process.env.VMSEED_DEBIAN_CONSOLE) await writeFile(process.env.VMSEED_DEBIAN_CONSOLE, c);
    const tail = () => `console tail:\n${c.slice(-3000)}`;
    assert.ok(cloudInitFinished(c), `cloud-init did not finish; ${tail()}`);
    assert.ok(c.includes(`DataSourceNoCloudNet [seed=dmi,${seedUrl}]`), `NoCloudNet over the redirect; ${tail()}`);
    // nocloudSeed('vm')'s user-data: runcmd `echo secret-of-vm`.
    assert.match(c, /cloud-init\[\d+\]: secret-of-vm\r?$/m, `runcmd from the fetched user-data; ${tail()}`);
    assert.match(
      (await sh(env.inPod(['nft', 'list', 'table', 'ip', 'kubevirt-masq']))).stdout,
      /counter packets [1-9]/,
    );
  },
);
