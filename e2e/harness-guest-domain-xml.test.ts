// Harness test (of the test fixtures, not of vmseed).
// The test-domain XML builder against libvirt itself: the schema validator,
// then real transient domains under TCG running the busybox guest, reading a
// seed disk and fetching over user networking with a guestfwd to loopback.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { createServer } from 'node:http';
import type { AddressInfo } from 'node:net';
import { mkdtemp, readFile, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { testDomainXml } from './support/guest/domain-xml.ts';
import { ensureLibvirtd } from './support/libvirtd.ts';
import { busyboxCmdline, ensureBusyboxGuest, parseConsole } from './support/guest/busybox.ts';

const virsh = (...args: string[]) =>
  execFileSync('virsh', ['-c', 'qemu:///system', ...args], {
    encoding: 'utf8',
    timeout: 30_000,
    killSignal: 'SIGKILL',
    stdio: ['ignore', 'pipe', 'pipe'],
  });

async function waitForDone(log: string, timeoutMs: number): Promise<string> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const text = await readFile(log, 'utf8').catch(() => '');
    if (parseConsole(text).done) return text;
    if (Date.now() > deadline)
      throw new Error(`guest did not finish in ${timeoutMs} ms; console tail:\n${text.slice(-2000)}`);
    await sleep(200);
  }
}

async function withDomain(xml: string, name: string, fn: () => Promise<void>): Promise<void> {
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-domxml-'));
  const file = path.join(dir, 'domain.xml');
  await writeFile(file, xml);
  await ensureLibvirtd();
  try {
    virsh('create', file);
    await fn();
  } finally {
    try {
      virsh('destroy', name);
    } catch {
      // already gone: the guest powered off and the transient domain vanished
    }
    await rm(dir, { recursive: true, force: true });
  }
}

test('harness: test domain XML with every option passes virt-xml-validate and escapes values', async () => {
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-domxml-'));
  try {
    const xml = testDomainXml({
      name: 'vmseed-validate',
      kernel: '/k/vmlinuz',
      initrd: '/k/initrd&<x>',
      cmdline: `console=ttyS0 vmseed.url=http://10.0.2.100/v1/a&b/ quote="'`,
      consoleLog: '/tmp/console.log',
      rootDisk: { path: '/img/root.qcow2', format: 'qcow2' },
      scsiController: true,
      userNet: { guestfwd: { guestIp: '10.0.2.100', guestPort: 80, hostPort: 8080 } },
    });
    const file = path.join(dir, 'd.xml');
    await writeFile(file, xml);
    execFileSync('virt-xml-validate', [file, 'domain'], { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
    assert.match(xml, /<initrd>\/k\/initrd&amp;&lt;x&gt;<\/initrd>/);
    assert.match(xml, /guestfwd=tcp:10\.0\.2\.100:80-cmd:\/bin\/busybox nc 127\.0\.0\.1 8080/);
    assert.match(xml, /<qemu:del capability="seccomp-sandbox"\/>/);
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('harness: libvirt boots the busybox guest from the builder XML and it reads a cidata disk', async () => {
  const guest = await ensureBusyboxGuest();
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-domxml-'));
  try {
    await writeFile(path.join(dir, 'user-data'), '#cloud-config\n{}\n');
    await writeFile(path.join(dir, 'meta-data'), 'instance-id: x\n');
    const iso = path.join(dir, 'seed.iso');
    execFileSync('genisoimage', [
      '-quiet',
      '-o',
      iso,
      '-V',
      'cidata',
      '-J',
      '-R',
      path.join(dir, 'user-data'),
      path.join(dir, 'meta-data'),
    ]);
    const name = `vmseed-guesttest-${process.pid}-disk`;
    const log = path.join(dir, 'console.log');
    const xml = testDomainXml({
      name,
      kernel: guest.kernel,
      initrd: guest.initramfs,
      cmdline: busyboxCmdline({ files: ['user-data', 'meta-data'], waitSeconds: 30 }),
      consoleLog: log,
      rootDisk: { path: iso, format: 'raw', readonly: true },
      scsiController: true,
    });
    await withDomain(xml, name, async () => {
      const r = parseConsole(await waitForDone(log, 60_000));
      assert.equal(r.files.get('user-data')?.toString(), '#cloud-config\n{}\n');
      assert.equal(r.files.get('meta-data')?.toString(), 'instance-id: x\n');
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});

test('harness: libvirt domain with restricted user networking reaches a loopback server only through guestfwd', async () => {
  const guest = await ensureBusyboxGuest();
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-domxml-'));
  const server = createServer((req, res) => {
    if (req.url === '/v1/t/user-data') res.end('served over http\n');
    else res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  try {
    const name = `vmseed-guesttest-${process.pid}-net`;
    const log = path.join(dir, 'console.log');
    const port = (server.address() as AddressInfo).port;
    const xml = testDomainXml({
      name,
      kernel: guest.kernel,
      initrd: guest.initramfs,
      cmdline: busyboxCmdline({ url: 'http://10.0.2.100/v1/t/', files: ['user-data', 'meta-data'] }),
      consoleLog: log,
      userNet: { guestfwd: { guestIp: '10.0.2.100', guestPort: 80, hostPort: port } },
    });
    await withDomain(xml, name, async () => {
      const r = parseConsole(await waitForDone(log, 60_000));
      assert.equal(r.files.get('user-data')?.toString(), 'served over http\n');
      assert.deepEqual(r.missing, ['meta-data']);
    });
  } finally {
    server.close();
    await rm(dir, { recursive: true, force: true });
  }
});

test('harness: vmseed.after=stay: the guest reads a hot-plugged seed, answers the unplug and reports the label gone', async () => {
  const guest = await ensureBusyboxGuest();
  const dir = await mkdtemp(path.join(tmpdir(), 'vmseed-domxml-'));
  try {
    await writeFile(path.join(dir, 'user-data'), 'hot-plugged\n');
    const iso = path.join(dir, 'seed.iso');
    execFileSync('genisoimage', ['-quiet', '-o', iso, '-V', 'cidata', '-J', '-R', path.join(dir, 'user-data')]);
    const name = `vmseed-guesttest-${process.pid}-stay`;
    const log = path.join(dir, 'console.log');
    const xml = testDomainXml({
      name,
      kernel: guest.kernel,
      initrd: guest.initramfs,
      cmdline: busyboxCmdline({ files: ['user-data'], waitSeconds: 120, after: 'stay' }),
      consoleLog: log,
    });
    await withDomain(xml, name, async () => {
      virsh('attach-disk', name, iso, 'vdb', '--mode', 'readonly', '--targetbus', 'virtio', '--live');
      const r = parseConsole(await waitForDone(log, 60_000));
      assert.equal(r.files.get('user-data')?.toString(), 'hot-plugged\n');
      virsh('detach-disk', name, 'vdb', '--live');
      const deadline = Date.now() + 30_000;
      let gone: number | undefined;
      while (gone === undefined && Date.now() < deadline) {
        gone = parseConsole(await readFile(log, 'utf8')).labelGoneUptime;
        await sleep(200);
      }
      assert.ok(gone !== undefined && gone > (r.labelFound?.uptime ?? 0), 'VMSEED-LABEL-GONE after the detach');
      assert.doesNotMatch(virsh('domblklist', name), /vdb/);
    });
  } finally {
    await rm(dir, { recursive: true, force: true });
  }
});
