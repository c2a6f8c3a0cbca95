// The injector's decisions, against a fake libvirt behind the ProcessSpawner
// seam: it answers like virsh 9.0 did here (dominfo layout, dumpxml shape,
// the real error messages virsh 9.0 printed, see test/libvirt/virsh.test.ts).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { renderTemplate } from '../../src/libvirt/template.ts';
import type { DomainDisk } from '../../src/libvirt/disk-xml.ts';
import { VmseedError } from '../../src/errors.ts';
import { changeCalls as mutating, EventingFakeClient, FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import type { ImagePublisher } from '../../src/libvirt/publish.ts';
import type { ProcessSpawner } from '../../src/libvirt/virsh/runner.ts';
import { parseTemplate } from '../../src/libvirt/template.ts';

const other = (dev: string): DomainDisk => ({
  type: 'file',
  device: 'disk',
  bus: 'virtio',
  targetDev: dev,
  sourceFile: `/images/${dev}.qcow2`,
  alias: `virtio-disk0`,
  serial: undefined,
  readonly: false,
});
const ours = (dev: string, src: string, alias = 'ua-vmseed_seed'): DomainDisk => ({
  type: 'file',
  device: 'disk',
  bus: dev.startsWith('sd') ? 'scsi' : 'virtio',
  targetDev: dev,
  sourceFile: src,
  alias,
  serial: 'cidata',
  readonly: true,
});

function setup(d: Partial<FakeDomain>, name = 'ns1_vm1') {
  const lv = new FakeLibvirt();
  lv.domains.set(name, {
    state: 'running',
    persistent: true,
    live: [other('vda')],
    config: [other('vda')],
    unplugs: true,
    ...d,
  });
  return lv;
}

const T: InjectionTarget = { namespace: 'ns1', name: 'vm1', uid: 'u-1', datasource: 'nocloud', annotations: {} };
const GATED: InjectionTarget = { ...T, annotations: { 'vmseed.io/resume-after-seed': 'true' } };
// What the reconciler tells the injector for such a VMI (seed-gate.ts resumeAfterSeed).
const RESUME = { resume: true };
const noSleep = async () => {};

test('shut-off persistent: --config only, on the fixed far target vdzz', async () => {
  const lv = setup({ state: 'shut off' });
  const r = await new LibvirtInjector({ spawner: lv }).inject(T, '/seeds/a.iso');
  assert.deepEqual(
    [r.action, r.flags, r.targetDev, r.domainState, r.seededAfterBoot, r.resumed],
    ['attached', ['--config'], 'vdzz', 'shutoff', false, false],
  );
  assert.deepEqual(
    mutating(lv).map((c) => [c[0], c[1], ...c.slice(3)]),
    [['attach-device', 'ns1_vm1', '--config']],
  );
  assert.equal(lv.domains.get('ns1_vm1')!.config[1].sourceFile, '/seeds/a.iso');
});

test('running persistent: --live --config and seeded after boot', async () => {
  const lv = setup({});
  const r = await new LibvirtInjector({ spawner: lv }).inject(GATED, '/seeds/a.iso', RESUME);
  assert.deepEqual(
    [r.action, r.flags, r.domainState, r.persistent, r.seededAfterBoot, r.resumed],
    ['attached', ['--live', '--config'], 'running', true, true, false],
  );
});

test('paused transient with the gate annotation: --live only, then the resume hook', async () => {
  const lv = setup({ state: 'paused', persistent: false, config: [] });
  const resumed: string[] = [];
  const inj = new LibvirtInjector({
    spawner: lv,
    resume: async (ctx) => {
      resumed.push(`${ctx.domain}@${ctx.uri}:${ctx.target.uid}`);
    },
  });
  const r = await inj.inject(GATED, '/seeds/a.iso', RESUME);
  assert.deepEqual([r.flags, r.resumed, r.seededAfterBoot, r.persistent], [['--live'], true, false, false]);
  assert.deepEqual(resumed, ['ns1_vm1@qemu:///system:u-1']);
  // the hook, not virsh resume, was used
  assert.equal(
    lv.calls.some((c) => c[0] === 'resume'),
    false,
  );
});

test('paused, not told to resume (no annotation, or not "true"), stays paused; default hook is virsh resume', async () => {
  const lv = setup({ state: 'paused' });
  const r = await new LibvirtInjector({ spawner: lv }).inject(
    { ...T, annotations: { 'vmseed.io/resume-after-seed': 'yes' } },
    '/s.iso',
  );
  assert.equal(r.resumed, false);
  assert.equal(lv.domains.get('ns1_vm1')!.state, 'paused');
  const lv2 = setup({ state: 'paused' });
  await new LibvirtInjector({ spawner: lv2 }).inject(GATED, '/s.iso', RESUME);
  assert.deepEqual(
    mutating(lv2).map((c) => c[0]),
    ['attach-device', 'resume'],
  );
  assert.equal(lv2.domains.get('ns1_vm1')!.state, 'running');
});

test('same source already in live and config: nothing to do (a paused gated domain is still resumed)', async () => {
  const lv = setup({
    state: 'paused',
    live: [other('vda'), ours('vdzz', '/s.iso')],
    config: [other('vda'), ours('vdzz', '/s.iso')],
  });
  const r = await new LibvirtInjector({ spawner: lv }).inject(GATED, '/s.iso', RESUME);
  assert.deepEqual([r.action, r.targetDev, r.flags, r.resumed], ['none', 'vdzz', [], true]);
  assert.deepEqual(
    mutating(lv).map((c) => c[0]),
    ['resume'],
  );
});

test('run twice: one disk, not two', async () => {
  const lv = setup({});
  const inj = new LibvirtInjector({ spawner: lv });
  await inj.inject(T, '/s.iso');
  const r = await inj.inject(T, '/s.iso');
  assert.equal(r.action, 'none');
  assert.equal(r.seededAfterBoot, false);
  assert.equal(lv.domains.get('ns1_vm1')!.live.filter((d) => d.alias === 'ua-vmseed_seed').length, 1);
  assert.equal(lv.domains.get('ns1_vm1')!.config.filter((d) => d.alias === 'ua-vmseed_seed').length, 1);
});

test('seed changed: detach the old disk where it is, wait until gone, attach on the same target', async () => {
  const lv = setup({
    live: [other('vda'), ours('vdzz', '/old.iso')],
    config: [other('vda'), ours('vdzz', '/old.iso')],
  });
  const r = await new LibvirtInjector({ spawner: lv, sleep: noSleep }).inject(T, '/new.iso');
  assert.deepEqual([r.action, r.targetDev, r.flags], ['replaced', 'vdzz', ['--live', '--config']]);
  assert.deepEqual(
    mutating(lv).map((c) => [c[0], c.at(-1)]),
    [
      ['detach-device', '--live'],
      ['detach-device', '--config'],
      ['attach-device', '--config'],
    ],
  );
  assert.deepEqual(
    lv.domains.get('ns1_vm1')!.live.map((d) => d.sourceFile),
    ['/images/vda.qcow2', '/new.iso'],
  );
});

test('live has it, config lost it: attach --config only, same target', async () => {
  const lv = setup({ live: [other('vda'), ours('vdzz', '/s.iso')] });
  const r = await new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso');
  assert.deepEqual([r.action, r.flags, r.targetDev], ['attached', ['--config'], 'vdzz']);
});

test('the first free targets stay free: with vda..vdc and sda used the seed still goes to vdzz / sdzz', async () => {
  const used = [other('vda'), other('vdb'), { ...other('sda'), bus: 'scsi' }];
  const lv = setup({ live: [...used], config: [...used, other('vdc')], scsi: true });
  assert.equal((await new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso')).targetDev, 'vdzz');
  const lv2 = setup({ live: [...used], config: [...used], scsi: true });
  assert.equal((await new LibvirtInjector({ spawner: lv2, bus: 'scsi' }).inject(T, '/s.iso')).targetDev, 'sdzz');
});

test('our target held by a disk that is not ours: TARGET_IN_USE, terminal; that disk untouched, no other name taken', async () => {
  const foreign = { ...other('vdzz'), alias: 'ua-data' };
  const lv = setup({ live: [other('vda'), foreign], config: [other('vda'), foreign] });
  await assert.rejects(
    new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso'),
    (e: unknown) =>
      e instanceof VmseedError &&
      e.code === 'TARGET_IN_USE' &&
      e.kind === 'terminal' &&
      /vdzz \(alias ua-data\)/.test(e.message),
  );
  assert.deepEqual(mutating(lv), []);
  // Eject finds nothing of ours either.
  assert.equal((await new LibvirtInjector({ spawner: lv }).eject(T)).action, 'none');
  assert.deepEqual(mutating(lv), []);
});

test('scsi bus: a read-only disk on sdzz at drive address target 7; virtio vdzz when the domain has no SCSI controller', async () => {
  const lv = setup({ state: 'shut off', scsi: true });
  const r = await new LibvirtInjector({ spawner: lv, bus: 'scsi' }).inject(T, '/s.iso');
  assert.deepEqual([r.bus, r.targetDev], ['scsi', 'sdzz']);
  assert.deepEqual(
    [lv.domains.get('ns1_vm1')!.config[1].device, lv.domains.get('ns1_vm1')!.config[1].alias],
    ['disk', 'ua-vmseed_seed'],
  );
  const lv2 = setup({ state: 'shut off' });
  const r2 = await new LibvirtInjector({ spawner: lv2, bus: 'scsi' }).inject(T, '/s.iso');
  assert.deepEqual([r2.bus, r2.targetDev], ['virtio', 'vdzz']);
});

test('live only (KubeVirt): --live on a persistent running domain, its config never read or changed; not running → retried', async () => {
  const lv = setup({ scsi: true });
  const inj = new LibvirtInjector({ spawner: lv, bus: 'scsi', liveOnly: true, sleep: noSleep });
  const r = await inj.inject(T, '/s.iso');
  assert.deepEqual([r.action, r.flags, r.targetDev], ['attached', ['--live'], 'sdzz']);
  assert.deepEqual(
    lv.domains.get('ns1_vm1')!.config.map((d) => d.targetDev),
    ['vda'],
  );
  assert.equal(
    lv.calls.some((c) => c.includes('--inactive') || c.includes('--config')),
    false,
  );
  assert.equal((await inj.inject(T, '/s.iso')).action, 'none');
  assert.deepEqual((await inj.inject(T, '/t.iso')).flags, ['--live']);
  assert.deepEqual(await inj.eject(T), { action: 'detached', domain: 'ns1_vm1' });
  assert.equal(
    lv.calls.some((c) => c.includes('--config')),
    false,
  );
  const off = setup({ state: 'shut off', scsi: true });
  await assert.rejects(
    new LibvirtInjector({ spawner: off, liveOnly: true }).inject(T, '/s.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_STATE_UNSUPPORTED' && e.retryable,
  );
  assert.deepEqual(mutating(off), []);
});

test('a ua-vmseed disk (a VMI disk named vmseed on KubeVirt) is not ours and stays', async () => {
  const vmiDisk = ours('sda', '/var/run/kubevirt-private/vmi-disks/vmseed/disk.img', 'ua-vmseed');
  const kv = setup({ state: 'paused', live: [other('vda'), vmiDisk], config: [], scsi: true });
  const inj = new LibvirtInjector({ spawner: kv, bus: 'scsi', liveOnly: true, sleep: noSleep });
  assert.equal((await inj.inject(T, '/s.iso')).action, 'attached');
  await inj.eject(T);
  assert.deepEqual(
    kv.domains.get('ns1_vm1')!.live.map((d) => d.alias),
    ['virtio-disk0', 'ua-vmseed'],
  );
});

test('domain missing: DOMAIN_NOT_FOUND, retryable; nothing attached', async () => {
  const lv = setup({}, 'other_vm');
  await assert.rejects(
    new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND' && e.retryable,
  );
  assert.deepEqual(mutating(lv), []);
});

test('libvirt answering for another domain (a handle remembered across a rename): DOMAIN_NOT_FOUND, retryable; nothing attached', async () => {
  const lv = setup({});
  // The XML libvirt returns names the domain it found.
  lv.domains.get('ns1_vm1')!.domainXml = '';
  const client = new EventingFakeClient(lv);
  const renamed = Object.assign(Object.create(client) as EventingFakeClient, {
    domainView: async (uri: string, domain: string, o?: object) => {
      const v = await client.domainView(uri, domain, o);
      return {
        ...v,
        liveXml: v.liveXml.replace('<name>ns1_vm1</name>', '<name>ns1_vm1_old</name>'),
        ...(v.inactiveXml
          ? { inactiveXml: v.inactiveXml.replace('<name>ns1_vm1</name>', '<name>ns1_vm1_old</name>') }
          : {}),
      };
    },
  });
  await assert.rejects(
    new LibvirtInjector({ client: renamed }).inject(T, '/s.iso'),
    (e: unknown) =>
      e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND' && e.retryable && /ns1_vm1_old/.test(e.message),
  );
  assert.deepEqual(mutating(lv), []);
});

test('a domain shutting down is retried later', async () => {
  const lv = setup({ state: 'in shutdown' });
  await assert.rejects(
    new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_STATE_UNSUPPORTED' && e.retryable,
  );
});

test('real libvirt errors surface with their codes', async () => {
  const lv = setup({});
  lv.failNext.set(
    'attach-device',
    "error: Failed to attach device from /tmp/x\nerror: Cannot access storage file '/s.iso': No such file or directory\n",
  );
  await assert.rejects(
    new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'SEED_FILE_NOT_ACCESSIBLE',
  );
  lv.failNext.set(
    'attach-device',
    'error: Failed to attach device from /tmp/x\nerror: unsupported configuration: non unique alias detected: ua-vmseed_seed\n',
  );
  await assert.rejects(
    new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'ALIAS_IN_USE',
  );
});

test('eject: detach with the same flags, poll until gone; absent disk or domain → none', async () => {
  const lv = setup({ live: [other('vda'), ours('vdzz', '/s.iso')], config: [other('vda'), ours('vdzz', '/s.iso')] });
  const inj = new LibvirtInjector({ spawner: lv, sleep: noSleep });
  assert.deepEqual(await inj.eject(T), { action: 'detached', domain: 'ns1_vm1' });
  assert.deepEqual(
    lv.domains.get('ns1_vm1')!.live.map((d) => d.targetDev),
    ['vda'],
  );
  assert.deepEqual(
    lv.domains.get('ns1_vm1')!.config.map((d) => d.targetDev),
    ['vda'],
  );
  assert.deepEqual(await inj.eject(T), { action: 'none', domain: 'ns1_vm1' });
  assert.deepEqual(await new LibvirtInjector({ spawner: setup({}, 'x_y') }).eject(T), {
    action: 'none',
    domain: 'ns1_vm1',
  });
});

test('eject: a guest that never releases the disk → DETACH_TIMEOUT after polling', async () => {
  const lv = setup({ unplugs: false, live: [ours('vdzz', '/s.iso')], config: [] });
  let polls = 0;
  const inj = new LibvirtInjector({
    spawner: lv,
    detachTimeoutMs: 30,
    pollIntervalMs: 5,
    sleep: (ms) => {
      polls++;
      return new Promise((r) => setTimeout(r, ms));
    },
  });
  await assert.rejects(
    inj.eject(T),
    (e: unknown) => e instanceof VmseedError && e.code === 'DETACH_TIMEOUT' && e.retryable,
  );
  assert.ok(polls >= 2, `polled ${polls} times`);
});

test('eject of a shut-off domain: --config only, no polling of the live domain', async () => {
  const lv = setup({ state: 'shut off', config: [ours('vdzz', '/s.iso')] });
  await new LibvirtInjector({ spawner: lv }).eject(T);
  assert.deepEqual(
    mutating(lv).map((c) => c.at(-1)),
    ['--config'],
  );
  assert.equal(lv.domains.get('ns1_vm1')!.config.length, 0);
});

test('templates: domain name, per-VMI socket URI, image path as the domain sees it', async () => {
  const lv = setup({ state: 'shut off' }, 'vm-u-7');
  const inj = new LibvirtInjector({
    spawner: lv,
    domainTemplate: parseTemplate('domain', 'vm-{uid}'),
    uriTemplate: parseTemplate('uri', 'qemu+unix:///system?socket=/var/run/kubevirt/{uid}/libvirt-sock'),
    imagePathTemplate: parseTemplate('image-path', '/var/run/kubevirt-private/vmseed/{namespace}/{name}/{basename}'),
  });
  const t = { ...T, uid: 'u-7' };
  await inj.inject(t, '/var/lib/vmseed/images/ns1/vm1/nocloud.iso');
  assert.ok(lv.uris.every((u) => u === 'qemu+unix:///system?socket=/var/run/kubevirt/u-7/libvirt-sock'));
  assert.equal(lv.domains.get('vm-u-7')!.config[1].sourceFile, '/var/run/kubevirt-private/vmseed/ns1/vm1/nocloud.iso');
  assert.equal(renderTemplate('{namespace}_{name}', { namespace: 'a', name: 'b' }), 'a_b');
});

test('calls for one domain are serialised; different domains run concurrently', async () => {
  const lv = setup({ state: 'shut off' });
  lv.domains.set('ns1_vm2', { state: 'shut off', persistent: true, live: [], config: [], unplugs: true });
  const inj = new LibvirtInjector({ spawner: lv });
  const [a, b, c] = await Promise.all([
    inj.inject(T, '/s.iso'),
    inj.inject(T, '/s.iso'),
    inj.inject({ ...T, name: 'vm2' }, '/s.iso'),
  ]);
  assert.deepEqual([a.action, b.action, c.action], ['attached', 'none', 'attached']);
});

test('with events (the RPC client): eject waits on device-removed, no polling; a guest that never releases → DETACH_TIMEOUT on a re-read', async () => {
  const lv = setup({ live: [other('vda'), ours('vdzz', '/s.iso')], config: [other('vda'), ours('vdzz', '/s.iso')] });
  let slept = 0;
  const inj = new LibvirtInjector({ client: new EventingFakeClient(lv), sleep: async () => void slept++ });
  assert.deepEqual(await inj.eject(T), { action: 'detached', domain: 'ns1_vm1' });
  assert.deepEqual(
    lv.domains.get('ns1_vm1')!.live.map((d) => d.targetDev),
    ['vda'],
  );
  // One read before (dominfo + 2× dumpxml), none after the detaches.
  assert.deepEqual(
    lv.calls.map((c) => c[0]),
    ['dominfo', 'dumpxml', 'dumpxml', 'detach-device', 'detach-device'],
  );
  assert.equal(slept, 0);

  const stuck = setup({ unplugs: false, live: [ours('vdzz', '/s.iso')], config: [] });
  const slow = new LibvirtInjector({ client: new EventingFakeClient(stuck), detachTimeoutMs: 30 });
  await assert.rejects(
    slow.eject(T),
    (e: unknown) => e instanceof VmseedError && e.code === 'DETACH_TIMEOUT' && e.retryable,
  );
  assert.deepEqual(
    stuck.calls.map((c) => c[0]),
    ['dominfo', 'dumpxml', 'dumpxml', 'detach-device', 'dumpxml'],
  );
});

test('with events: a reconnect while waiting re-reads the domain (an event sent while it was down is lost)', async () => {
  const lv = setup({ unplugs: false, live: [ours('vdzz', '/s.iso')], config: [] });
  const client = new EventingFakeClient(lv);
  const inj = new LibvirtInjector({ client, detachTimeoutMs: 60_000 });
  const ejected = inj.eject(T);
  // The guest lets go while the connection is down; libvirt's event is lost.
  while (!lv.calls.some((c) => c[0] === 'detach-device')) await new Promise((r) => setImmediate(r));
  lv.domains.get('ns1_vm1')!.live = [];
  client.emit({ type: 'connection', uri: 'qemu:///system', state: 'up', reconnected: true });
  assert.deepEqual(await ejected, { action: 'detached', domain: 'ns1_vm1' });
});

test('one read, one write: a running persistent domain is dominfo + live + inactive XML, then one attach-device with both flags', async () => {
  const lv = setup({});
  await new LibvirtInjector({ spawner: lv }).inject(T, '/s.iso');
  assert.deepEqual(
    lv.calls.map((c) => [c[0], ...c.filter((a) => a.startsWith('--'))]),
    [['dominfo'], ['dumpxml'], ['dumpxml', '--inactive'], ['attach-device', '--live', '--config']],
  );
});

// A promise with its resolve, to hold one step of an injection.
function gate(): { wait: Promise<void>; open(): void } {
  let open!: () => void;
  const wait = new Promise<void>((r) => (open = r));
  return { wait, open };
}

test("publish runs beside the read; older copies are pruned after inject() answers, before the domain's next change; idle() waits for that", async () => {
  const lv = setup({ state: 'running', persistent: false, config: [], live: [] });
  const publishing = gate();
  const pruning = gate();
  const steps: string[] = [];
  const publisher: ImagePublisher = {
    publish: async () => {
      steps.push('publish');
      await publishing.wait;
      return '/pub/vmseed-nocloud.iso';
    },
    prune: async (_t, keep) => {
      steps.push(`prune keeps ${keep}`);
      await pruning.wait;
      steps.push('pruned');
    },
    unpublish: async () => void steps.push('unpublish'),
  };
  // Each virsh call as it starts, in the same log as the copy's steps.
  const logged: ProcessSpawner = {
    run: (file, argv, o) => (steps.push(String(argv[3])), lv.run(file, argv, o)),
    holdSocket: (path) => lv.holdSocket(path),
  };
  const inj = new LibvirtInjector({ spawner: logged, publisher, liveOnly: true });
  const injecting = inj.inject(T, '/seeds/nocloud.iso');
  // The read went out first, and was answered while the copy was still
  // being made.
  for (let i = 0; i < 100 && !(steps.includes('dumpxml') && steps.includes('publish')); i++)
    await new Promise((r) => setImmediate(r));
  assert.equal(steps[0], 'dominfo', 'the read before the copy');
  assert.deepEqual(
    steps.filter((x) => x !== 'dominfo' && x !== 'dumpxml'),
    ['publish'],
  );
  assert.deepEqual(
    lv.calls.map((c) => c[0]),
    ['dominfo', 'dumpxml'],
  );
  const copySteps = () => steps.filter((x) => !/^(dominfo|dumpxml|attach-device|detach-device)$/.test(x));
  publishing.open();
  const r = await injecting;
  assert.equal(r.action, 'attached');
  assert.equal(lv.domains.get('ns1_vm1')!.live[0].sourceFile, '/pub/vmseed-nocloud.iso');
  assert.deepEqual(copySteps(), ['publish', 'prune keeps /pub/vmseed-nocloud.iso'], 'answered while the prune runs');

  // The next change to the domain waits for the prune.
  const calls = lv.calls.length;
  const ejecting = inj.eject(T);
  assert.equal(await inj.idle(50), false);
  assert.equal(lv.calls.length, calls, 'nothing sent for the eject yet');
  pruning.open();
  assert.equal((await ejecting).action, 'detached');
  assert.deepEqual(copySteps(), ['publish', 'prune keeps /pub/vmseed-nocloud.iso', 'pruned', 'unpublish']);
  assert.equal(await inj.idle(), true);
});

test('a failed copy is the answer at once, without waiting for a read that does not come back; nothing attached, nothing pruned', async () => {
  const lv = setup({ state: 'running', persistent: false, config: [], live: [] });
  const reading = gate();
  const held: ProcessSpawner = {
    holdSocket: (path) => lv.holdSocket(path),
    run: async (file, argv, o) => {
      await reading.wait;
      return lv.run(file, argv, o);
    },
  };
  let pruned = false;
  const publisher: ImagePublisher = {
    publish: async () => {
      throw new VmseedError('SEED_PUBLISH_FAILED', "the launcher's volume is not there", { kind: 'retryable' });
    },
    prune: async () => void (pruned = true),
    unpublish: async () => {},
  };
  const inj = new LibvirtInjector({ spawner: held, publisher, liveOnly: true });
  await assert.rejects(
    inj.inject(T, '/seeds/nocloud.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'SEED_PUBLISH_FAILED',
  );
  reading.open();
  assert.equal(await inj.idle(), true);
  assert.deepEqual(mutating(lv), []);
  assert.equal(pruned, false);
});
