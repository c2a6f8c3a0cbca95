// The kubevirt preset's seed disk against the real libvirtd + QEMU (TCG), on
// domains shaped like KubeVirt's: q35, virtio-scsi controller 0, pcie-root-
// ports for hot-plug, a VMI disk on sda (scsi 0:0:0:0) named `vmseed` (so its
// alias is `ua-vmseed`), started paused. Built by makeInjector from the
// preset, as the agent does, with only the socket (the system daemon here)
// and the pods root (a temp dir) overridden. Domains have no OS: enough for
// attach and for a SCSI detach, which does not need the guest.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { existsSync, mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { execFileSync } from 'node:child_process';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { loadConfig } from '../src/config/config.ts';
import { makeInjector } from '../src/commands/agent/agent-command.ts';
import type { LibvirtInjector } from '../src/libvirt/injector.ts';
import { closeLater, e2eAgentLibvirtFlag, e2eInjector } from './support/libvirt-mode.ts';

const closeLaterInjector = (inj: LibvirtInjector) => (closeLater(inj.client), inj);
import { VmseedError } from '../src/errors.ts';
import type { InjectionTarget } from '../src/libvirt/injector-contract.ts';
import {
  ensureLibvirtd,
  uniqueName,
  destroyDomain,
  defineDomain,
  domblklist,
  domstate,
  virsh,
} from './support/libvirtd.ts';
import { parseTemplate } from '../src/libvirt/template.ts';

const POD = '3c3c3c3c-3c3c-4c3c-8c3c-3c3c3c3c3c3c';
let dir: string;
const domains: string[] = [];

before(async () => {
  await ensureLibvirtd();
  dir = mkdtempSync(join(tmpdir(), 'vmseed-e2e-kv-'));
  mkdirSync(join(dir, 'pods', POD, 'volumes/kubernetes.io~empty-dir/ephemeral-disks'), { recursive: true });
});

after(async () => {
  for (const d of domains) await destroyDomain(d);
  rmSync(dir, { recursive: true, force: true });
});

// KubeVirt's domain in miniature (converter: q35, scsi controller 0 of model
// virtio-scsi, pcie-root-ports, ua-<disk name> aliases, sd targets from sda).
function kubevirtDomainXml(name: string, vmiDisk: string, scsi: boolean): string {
  const ports = [1, 2, 3, 4, 5, 6]
    .map((i) => `<controller type='pci' index='${i}' model='pcie-root-port'/>`)
    .join('\n    ');
  const disk = scsi
    ? `<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='${vmiDisk}'/><target dev='sda' bus='scsi'/><alias name='ua-vmseed'/><address type='drive' controller='0' bus='0' target='0' unit='0'/></disk>`
    : `<disk type='file' device='disk'><driver name='qemu' type='raw'/><source file='${vmiDisk}'/><target dev='vda' bus='virtio'/><alias name='ua-vmseed'/></disk>`;
  return `<domain type='qemu'>
  <name>${name}</name>
  <memory unit='MiB'>64</memory>
  <vcpu>1</vcpu>
  <os><type arch='x86_64' machine='q35'>hvm</type></os>
  <features><acpi/></features>
  <devices>
    <emulator>/usr/bin/qemu-system-x86_64</emulator>
    <controller type='pci' index='0' model='pcie-root'/>
    ${ports}
    ${scsi ? "<controller type='scsi' index='0' model='virtio-scsi'/>" : ''}
    ${disk}
  </devices>
</domain>
`;
}

async function pausedDomain(prefix: string, scsi: boolean): Promise<{ name: string; domain: string; vmiDisk: string }> {
  const name = uniqueName(prefix);
  const domain = `e2e_${name}`;
  domains.push(domain);
  const vmiDisk = join(dir, `${name}-vmi.img`);
  writeFileSync(vmiDisk, Buffer.alloc(1024 * 1024));
  await defineDomain(kubevirtDomainXml(domain, vmiDisk, scsi));
  // startStrategy: Paused.
  await virsh('start', '--paused', domain);
  return { name, domain, vmiDisk };
}

function kubevirtInjector(resumed: string[]): LibvirtInjector {
  const config = loadConfig(
    [
      ...e2eAgentLibvirtFlag(),
      '--libvirt-uri',
      'qemu:///system',
      '--publish-dir',
      join(dir, 'pods/{podUID}/volumes/kubernetes.io~empty-dir/ephemeral-disks/vmseed'),
      '--image-path-in-domain',
      '{path}',
    ],
    { NODE_NAME: 'n1' },
    '/',
  )!;
  assert.equal(config.libvirt.platform, 'kubevirt');
  return closeLaterInjector(makeInjector(config, async ({ target }) => void resumed.push(target.name))!);
}

function target(name: string): InjectionTarget {
  return {
    namespace: 'e2e',
    name,
    uid: `uid-${name}`,
    datasource: 'nocloud',
    annotations: {},
    launcherPods: [POD],
  };
}

function storeImage(name: string, fill: string): string {
  const d = mkdtempSync(join(dir, 'store-'));
  const p = join(
    d,
    `nocloud-${Buffer.from(name + fill)
      .toString('hex')
      .slice(-16)
      .padStart(16, '0')}.iso`,
  );
  writeFileSync(p, Buffer.alloc(64 * 1024, fill));
  return p;
}

test('q35 with virtio-scsi: the seed is a read-only SCSI disk sdzz at 0:0:7:0, alias ua-vmseed_seed, live only; replaced and detached; the VMI disk ua-vmseed untouched', async () => {
  const { name, domain, vmiDisk } = await pausedDomain('kvscsi', true);
  const resumed: string[] = [];
  const inj = kubevirtInjector(resumed);
  const first = storeImage(name, 'a');
  const r = await inj.inject(target(name), first, { resume: true });
  assert.deepEqual(
    [r.action, r.bus, r.targetDev, r.flags, r.domainState, r.resumed],
    ['attached', 'scsi', 'sdzz', ['--live'], 'paused', true],
  );
  const copy = (r2: string) =>
    join(dir, 'pods', POD, 'volumes/kubernetes.io~empty-dir/ephemeral-disks/vmseed', `vmseed-${r2.split('/').pop()}`);
  assert.deepEqual(await domblklist(domain), [
    { type: 'file', device: 'disk', target: 'sda', source: vmiDisk },
    { type: 'file', device: 'disk', target: 'sdzz', source: copy(first) },
  ]);
  assert.deepEqual(
    (await domblklist(domain, true)).map((b) => b.target),
    ['sda'],
    'never in the persistent config KubeVirt owns',
  );
  const xml = await virsh('dumpxml', domain);
  assert.match(
    xml,
    /<target dev='sdzz' bus='scsi'\/>\s*<readonly\/>[\s\S]*?<alias name='ua-vmseed_seed'\/>\s*<address type='drive' controller='0' bus='0' target='7' unit='0'\/>/,
  );
  assert.match(xml, /<target dev='sda' bus='scsi'\/>[\s\S]*?<alias name='ua-vmseed'\/>/);
  // The seed gate asked KubeVirt (the hook); virsh resume was not used.
  assert.deepEqual(resumed, [name]);
  assert.equal(await domstate(domain), 'paused');

  const second = storeImage(name, 'b');
  const r2 = await inj.inject(target(name), second, { resume: true });
  assert.deepEqual([r2.action, r2.flags], ['replaced', ['--live']]);
  assert.deepEqual(
    (await domblklist(domain)).map((b) => [b.target, b.source]),
    [
      ['sda', vmiDisk],
      ['sdzz', copy(second)],
    ],
  );
  assert.equal(existsSync(copy(first)), false, 'the older copy pruned');

  // SCSI detaches at once, also from a paused guest.
  assert.equal((await inj.eject(target(name))).action, 'detached');
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.target),
    ['sda'],
  );
  assert.equal(existsSync(copy(second)), false);
});

test('q35 without a SCSI controller: the virtio fallback vdzz, live only; its detach needs a guest (DETACH_TIMEOUT without one)', async () => {
  const { name, domain, vmiDisk } = await pausedDomain('kvvirtio', false);
  const inj = kubevirtInjector([]);
  const image = storeImage(name, 'c');
  const r = await inj.inject(target(name), image, { resume: true });
  assert.deepEqual([r.action, r.bus, r.targetDev, r.flags], ['attached', 'virtio', 'vdzz', ['--live']]);
  assert.deepEqual(
    (await domblklist(domain)).map((b) => [b.target, b.source === vmiDisk]),
    [
      ['vda', true],
      ['vdzz', false],
    ],
  );
  assert.deepEqual(
    (await domblklist(domain, true)).map((b) => b.target),
    ['vda'],
  );
  assert.match(
    await virsh('dumpxml', domain),
    /<target dev='vdzz' bus='virtio'\/>[\s\S]*?<alias name='ua-vmseed_seed'\/>/,
  );
  const quick = e2eInjector({
    uriTemplate: parseTemplate('uri', 'qemu:///system'),
    liveOnly: true,
    detachTimeoutMs: 1000,
    pollIntervalMs: 200,
  });
  await assert.rejects(
    quick.eject({ ...target(name), launcherPods: undefined }),
    (e: unknown) => e instanceof VmseedError && e.code === 'DETACH_TIMEOUT' && e.retryable,
  );
});

test('our target taken by a disk that is not ours: TARGET_IN_USE, terminal; nothing attached under another name', async () => {
  const name = uniqueName('kvtaken');
  const domain = `e2e_${name}`;
  domains.push(domain);
  const other = join(dir, `${name}-other.img`);
  writeFileSync(other, Buffer.alloc(1024 * 1024));
  await defineDomain(
    kubevirtDomainXml(domain, other, true).replace(
      "<target dev='sda' bus='scsi'/><alias name='ua-vmseed'/><address type='drive' controller='0' bus='0' target='0' unit='0'/>",
      "<target dev='sdzz' bus='scsi'/><alias name='ua-data'/><address type='drive' controller='0' bus='0' target='0' unit='0'/>",
    ),
  );
  await virsh('start', '--paused', domain);
  await assert.rejects(
    kubevirtInjector([]).inject(target(name), storeImage(name, 'd'), { resume: true }),
    (e: unknown) => e instanceof VmseedError && e.code === 'TARGET_IN_USE' && e.kind === 'terminal',
  );
  assert.deepEqual(
    (await domblklist(domain)).map((b) => b.target),
    ['sdzz'],
  );
});

// The preset's socket URI is built from --pods-dir, percent-encoded; libvirt
// decodes it (virURIParseParams). A pods directory with a `%` in it, the
// launcher's socket there standing for the system daemon's: the whole
// preset (socket, publish directory) reaches the domain; only the image path
// differs (QEMU here shares our mount namespace).
test("the preset's encoded socket URI reaches libvirt: --pods-dir with a % in it", async () => {
  const podsDir = '/tmp/%q';
  rmSync(podsDir, { recursive: true, force: true });
  const runtime = join(podsDir, POD, 'volumes/kubernetes.io~empty-dir/libvirt-runtime');
  mkdirSync(runtime, { recursive: true });
  mkdirSync(join(podsDir, POD, 'volumes/kubernetes.io~empty-dir/ephemeral-disks'), { recursive: true });
  // A bind mount, not a symlink: the RPC client dials only a real socket.
  const socket = join(runtime, 'virtqemud-sock');
  writeFileSync(socket, '');
  execFileSync('mount', ['--bind', '/var/run/libvirt/libvirt-sock', socket]);
  try {
    const config = loadConfig(
      [...e2eAgentLibvirtFlag(), '--pods-dir', podsDir, '--image-path-in-domain', '{path}'],
      { NODE_NAME: 'n1' },
      '/',
    )!;
    assert.equal(
      config.libvirt.uri,
      'qemu+unix:///session?socket=/tmp/%25q/{podUID}/volumes/kubernetes.io~empty-dir/libvirt-runtime/virtqemud-sock',
    );
    const { name, domain } = await pausedDomain('kvuri', true);
    const resumed: string[] = [];
    // The system daemon answers on that socket; `session` in the path is
    // what KubeVirt uses for its per-launcher daemon.
    const inj = makeInjector(
      {
        ...config,
        libvirt: {
          ...config.libvirt,
          uri: parseTemplate('uri', config.libvirt.uri.replace('///session', '///system')),
        },
      },
      async ({ target }) => void resumed.push(target.name),
    )!;
    closeLaterInjector(inj);
    const r = await inj.inject(target(name), storeImage(name, 'e'), { resume: true });
    assert.deepEqual([r.action, r.targetDev, r.flags], ['attached', 'sdzz', ['--live']]);
    assert.deepEqual(
      (await domblklist(domain)).map((b) => b.target),
      ['sda', 'sdzz'],
    );
    assert.ok(
      (await domblklist(domain))[1].source.startsWith(
        join(podsDir, POD, 'volumes/kubernetes.io~empty-dir/ephemeral-disks/vmseed/'),
      ),
    );
    assert.deepEqual(resumed, [name]);
  } finally {
    execFileSync('umount', [socket]);
    rmSync(podsDir, { recursive: true, force: true });
  }
});
