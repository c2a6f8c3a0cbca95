// SLOW (two Debian boots under TCG, ~1 min each; sequential in this one
// file so they never compete for the CPU): the whole chain with a real
// cloud-init. The agent CLI (local mode, --libvirt virsh) seeds a Debian 12
// guest that libvirt started paused, the seed gate resumes it, and cloud-init
// applies the seed: the datasource, runcmd output, the user with its
// authorized key, write_files; with ConfigDrive also the SMBIOS UUID match
// and the static address from network_data.json.
import { test, before } from 'node:test';
import assert from 'node:assert/strict';
import { randomBytes, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { ensureLibvirtd, uniqueName, defineDomain, domblklist, domstate, virsh } from './support/libvirtd.ts';
import { cloneRootfs, ensureDebianGuest, cloudInitFinished } from './support/guest/debian.ts';
import { testDomainXml } from './support/guest/domain-xml.ts';
import { cleanupAll, removeDomainChecked, startAgentProcess, vmiYaml, waitUntil } from './support/agent-process.ts';

const NS = 'e2e';
// Generous: under TCG on a busy 2-core machine a boot has taken 2-3x its
// quiet ~60 s. A timeout fails with the console tail.
const BOOT_TIMEOUT_MS = 420_000;
// QEMU's default MAC for the first NIC (domain-xml.ts sets none).
const GUEST_MAC = '52:54:00:12:34:56';

before(async () => {
  await ensureLibvirtd();
  await ensureDebianGuest();
});

async function waitForConsoleText(path: string, done: (text: string) => boolean, timeoutMs: number): Promise<string> {
  const started = Date.now();
  for (;;) {
    const text = existsSync(path) ? readFileSync(path, 'utf8') : '';
    if (done(text)) {
      console.log(`# ${path}: cloud-init done ${((Date.now() - started) / 1000).toFixed(1)} s after resume`);
      return text;
    }
    if (Date.now() - started > timeoutMs) {
      throw new Error(
        `the guest's console did not show cloud-init finishing within ${timeoutMs} ms; console tail:\n${text.slice(-4000)}`,
      );
    }
    await sleep(500);
  }
}

// runcmd output reaches the serial console through journald, prefixed.
const runcmdLine = (re: string) => new RegExp(`cloud-init\\[\\d+\\]: ${re}\\r?$`, 'm');

interface Case {
  datasource: 'nocloud' | 'configdrive';
  networkData?: string;
  extraRuncmd: string[];
  check(c: string, tail: () => string, uuid: string): void;
}

async function seedAndBoot(t: { after(fn: () => Promise<void>): void }, c: Case): Promise<void> {
  const guest = await ensureDebianGuest();
  const agent = await startAgentProcess();
  const work = await mkdtemp(join(tmpdir(), 'vmseed-e2e-cloudinit-'));
  const name = uniqueName(c.datasource === 'nocloud' ? 'ci-nc' : 'ci-cd');
  const domain = `${NS}_${name}`;
  t.after(() =>
    cleanupAll(
      () => agent.dispose(),
      () => removeDomainChecked(domain),
      () => rm(work, { recursive: true, force: true }),
    ),
  );

  const uuid = randomUUID();
  const consoleLog = join(work, 'console.log');
  const root = await cloneRootfs(work, guest.rootfs);
  await defineDomain(
    testDomainXml({
      name: domain,
      uuid,
      kernel: guest.kernel,
      initrd: guest.initramfs,
      cmdline: guest.cmdline,
      consoleLog,
      memoryMiB: 512,
      rootDisk: { path: root.path, format: root.format },
      ...(c.networkData ? { userNet: {} } : {}),
    }),
  );
  await virsh('start', '--paused', domain);

  const marker = `VMSEED-RUNCMD-${randomBytes(6).toString('hex')}`;
  const user = `u${randomBytes(3).toString('hex')}`;
  const key = `ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI${randomBytes(24).toString('base64').replace(/[+/=]/g, 'x')} ${user}@vmseed`;
  const written = `written-${randomBytes(4).toString('hex')}`;
  const userData = [
    '#cloud-config',
    'users:',
    `  - name: ${user}`,
    '    ssh_authorized_keys:',
    `      - ${key}`,
    'write_files:',
    '  - path: /etc/vmseed-written',
    `    content: "${written}\\n"`,
    'runcmd:',
    `  - echo ${marker}`,
    `  - echo "PASSWD=$(getent passwd ${user})"`,
    `  - echo "KEY=$(cat /home/${user}/.ssh/authorized_keys)"`,
    '  - echo "WF=$(cat /etc/vmseed-written)"',
    '  - echo "IID=$(cat /var/lib/cloud/data/instance-id)"',
    ...c.extraRuncmd.map((r) => `  - ${r}`),
    '',
  ].join('\n');
  const annotation = { datasource: c.datasource, userData, ...(c.networkData ? { networkData: c.networkData } : {}) };
  assert.equal(await domstate(domain), 'paused');
  await agent.put(
    'vm.yaml',
    vmiYaml({ namespace: NS, name, cloudInit: JSON.stringify(annotation), resumeAfterSeed: true, firmwareUuid: uuid }),
  );

  const rec = await waitUntil(
    'the seed injected and the domain resumed',
    async () => {
      const r = await agent.vmi(NS, name);
      return r?.injection && r.state !== 'error' ? r : undefined;
    },
    60_000,
    async () =>
      `agent log tail:\n${agent.log().split('\n').slice(-25).join('\n')}\nstatus: ${JSON.stringify(await agent.vmi(NS, name))}`,
  );
  assert.equal(rec.datasource, c.datasource);
  assert.equal(rec.injection!.resumed, true);
  assert.equal(rec.injection!.targetDev, 'vdzz', 'a fixed far target, never the next free one');
  assert.deepEqual(
    (await domblklist(domain)).map((b) => [b.target, b.source]),
    [
      ['vda', root.path],
      ['vdzz', rec.imagePath],
    ],
  );
  assert.equal(await domstate(domain), 'running');

  const con = await waitForConsoleText(
    consoleLog,
    (text) => text.includes(marker) && cloudInitFinished(text),
    BOOT_TIMEOUT_MS,
  );
  const tail = () => `console tail:\n${con.slice(-4000)}`;
  assert.ok(runcmdLine(marker).test(con), `runcmd output; ${tail()}`);
  assert.ok(
    runcmdLine(`PASSWD=${user}:x:\\d+:\\d+:[^:]*:/home/${user}:\\S+`).test(con),
    `the user exists (getent); ${tail()}`,
  );
  assert.ok(con.includes(`KEY=${key}`), `the user's authorized_keys holds the seed's key; ${tail()}`);
  assert.ok(runcmdLine(`WF=${written}`).test(con), `write_files content; ${tail()}`);
  // instance-id is the VMI's firmware uuid (meta-data instance-id / meta_data.json uuid).
  assert.ok(runcmdLine(`IID=${uuid}`).test(con), `instance-id; ${tail()}`);
  c.check(con, tail, uuid);
  assert.equal(await agent.stop(), 0);
}

test(
  'SLOW: NoCloud seed from the agent, applied by cloud-init in a Debian guest held paused until the seed was in',
  { timeout: BOOT_TIMEOUT_MS + 120_000 },
  async (t) => {
    await seedAndBoot(t, {
      datasource: 'nocloud',
      extraRuncmd: [],
      check: (con, tail) => {
        assert.match(
          con,
          /Datasource DataSourceNoCloud \[seed=\/dev\/vd[a-z]\]/,
          `NoCloud datasource from the seed disk; ${tail()}`,
        );
      },
    });
  },
);

test(
  'SLOW: ConfigDrive seed from the agent: SMBIOS UUID = seed uuid, static address from network_data.json applied',
  { timeout: BOOT_TIMEOUT_MS + 120_000 },
  async (t) => {
    await seedAndBoot(t, {
      datasource: 'configdrive',
      networkData: [
        'version: 2',
        'ethernets:',
        '  eth0:',
        `    match: {macaddress: "${GUEST_MAC}"}`,
        '    set-name: eth0',
        '    addresses: [10.0.2.77/24]',
        '    gateway4: 10.0.2.2',
        '',
      ].join('\n'),
      extraRuncmd: ['echo "SMBIOS=$(cat /sys/class/dmi/id/product_uuid)"', 'ip addr'],
      check: (con, tail, uuid) => {
        assert.match(
          con,
          /Datasource DataSourceConfigDrive \[[^\]]*\]\[source=\/dev\/vd[a-z]\]/,
          `ConfigDrive datasource from the seed disk; ${tail()}`,
        );
        // The domain's SMBIOS UUID equals the seed's uuid (checked as the instance-id above).
        assert.ok(runcmdLine(`SMBIOS=${uuid}`).test(con), `SMBIOS UUID; ${tail()}`);
        assert.ok(runcmdLine(`\\s*link/ether ${GUEST_MAC} .*`).test(con), `the NIC; ${tail()}`);
        // Not 10.0.2.15, which QEMU's DHCP would have handed out.
        assert.ok(
          runcmdLine('\\s*inet 10\\.0\\.2\\.77/24 .*scope global eth0').test(con),
          `static address from network_data.json on eth0; ${tail()}`,
        );
      },
    });
  },
);
