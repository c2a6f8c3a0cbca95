// The seed's attach made ready while the domain is only defined (KubeVirt's
// launcher defines it, then starts it), sent from libvirt's start event
// before any reconcile runs, and reported by the reconcile that follows.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { EventingFakeClient, FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { VmseedError } from '../../src/errors.ts';
import type { InjectionTarget } from '../../src/libvirt/injector-contract.ts';
import type { DomainDisk } from '../../src/libvirt/disk-xml.ts';

const URI = 'qemu:///system';
const target: InjectionTarget = { namespace: 'ns', name: 'vm', uid: 'u', datasource: 'nocloud', annotations: {} };
const defined = (): FakeDomain => ({
  state: 'shut off',
  persistent: true,
  live: [],
  config: [],
  unplugs: true,
  scsi: true,
});

function setup() {
  const lv = new FakeLibvirt();
  const client = new EventingFakeClient(lv);
  const injector = new LibvirtInjector({ client, liveOnly: true, bus: 'scsi' });
  return { lv, client, injector };
}

const notRunning = (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_STATE_UNSUPPORTED';

// What libvirt does at `virsh start`, then its event.
function start(lv: FakeLibvirt, client: EventingFakeClient, domain = 'ns_vm'): void {
  const d = lv.domains.get(domain)!;
  d.state = 'running';
  d.live = [...d.config];
  client.emit({
    type: 'lifecycle',
    uri: URI,
    domain,
    uuid: '0e3f6c44-2b7e-4a4e-9d59-0c1a3a6f7b10',
    event: 'started',
    detail: 0,
  });
}

const attaches = (lv: FakeLibvirt) => lv.calls.filter((c) => c[0] === 'attach-device');

async function until(what: string, pred: () => boolean): Promise<void> {
  const end = Date.now() + 20_000;
  while (!pred()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 5));
  }
}

test('defined, not started: the attach is prepared; the start event sends it at once, and the next reconcile reports it attached', async () => {
  const { lv, client, injector } = setup();
  lv.domains.set('ns_vm', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  assert.equal(injector.preparedAttaches, 1);
  assert.deepEqual(attaches(lv), [], 'nothing is attached to a domain that is not running');
  assert.deepEqual(lv.domains.get('ns_vm')!.config, [], "KubeVirt's config is never changed");

  const before = Date.now();
  start(lv, client);
  await until('the attach from the start event', () => lv.domains.get('ns_vm')!.live.length === 1);
  const disk: DomainDisk = lv.domains.get('ns_vm')!.live[0];
  assert.deepEqual(
    [disk.sourceFile, disk.targetDev, disk.bus, disk.alias],
    ['/seeds/nocloud-1.iso', 'sdzz', 'scsi', 'ua-vmseed_seed'],
  );
  assert.equal(attaches(lv).length, 1);
  assert.ok(attaches(lv)[0].includes('--live') && !attaches(lv)[0].includes('--config'));
  assert.equal(injector.preparedAttaches, 0);

  const r = await injector.inject(target, '/seeds/nocloud-1.iso');
  assert.equal(r.action, 'attached', "the attach made at the start is this reconcile's to report");
  assert.deepEqual(r.flags, ['--live']);
  assert.ok(r.attachedAt !== undefined && r.attachedAt >= before);
  assert.equal(attaches(lv).length, 1, 'not attached twice');
  assert.equal((await injector.inject(target, '/seeds/nocloud-1.iso')).action, 'none', 'reported once');
});

test("the attach is queued ahead of the event's other listeners, and is in flight until libvirt answered it", async () => {
  const { lv, client, injector } = setup();
  // Subscribed after the injector was made, before anything was prepared.
  let seen: Promise<void> | undefined;
  client.onEvent((e) => {
    if (e.type === 'lifecycle' && e.event === 'started') seen = injector.attachingAtStart(URI, 'ns_vm');
  });
  lv.domains.set('ns_vm', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  assert.equal(injector.attachingAtStart(URI, 'ns_vm'), undefined, 'nothing in flight before the start');
  start(lv, client);
  assert.ok(seen, 'in flight when a later listener hears the same event');
  await seen;
  assert.equal(lv.domains.get('ns_vm')!.live.length, 1, 'answered: the disk is in place');
  assert.equal(injector.attachingAtStart(URI, 'ns_vm'), undefined, 'no longer in flight once answered');
  assert.equal((await injector.inject(target, '/seeds/nocloud-1.iso')).action, 'attached');
  assert.equal(attaches(lv).length, 1, 'not attached twice');
});

test('the seed changed while the domain waited: the start sends the latest one', async () => {
  const { lv, client, injector } = setup();
  lv.domains.set('ns_vm', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  await assert.rejects(injector.inject(target, '/seeds/nocloud-2.iso'), notRunning);
  assert.equal(injector.preparedAttaches, 1);
  start(lv, client);
  await until('the attach', () => lv.domains.get('ns_vm')!.live.length === 1);
  assert.equal(lv.domains.get('ns_vm')!.live[0].sourceFile, '/seeds/nocloud-2.iso');
  const r = await injector.inject(target, '/seeds/nocloud-2.iso');
  assert.equal(r.action, 'attached');
});

test('a prepared attach that no longer matches is not reported as this seed: the reconcile replaces it', async () => {
  const { lv, client, injector } = setup();
  lv.domains.set('ns_vm', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  start(lv, client);
  await until('the attach', () => lv.domains.get('ns_vm')!.live.length === 1);
  // A new seed arrived right after the start: the disk there is stale.
  const r = await injector.inject(target, '/seeds/nocloud-3.iso');
  assert.equal(r.action, 'replaced');
  assert.equal(
    lv.domains.get('ns_vm')!.live.filter((d) => d.alias === 'ua-vmseed_seed')[0].sourceFile,
    '/seeds/nocloud-3.iso',
  );
});

test('nothing is sent for a VMI that went, a domain never prepared, or our target held by a disk not ours', async () => {
  const { lv, client, injector } = setup();
  lv.domains.set('ns_vm', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  await injector.eject(target);
  assert.equal(injector.preparedAttaches, 0);
  start(lv, client);

  lv.domains.set('ns_other', defined());
  start(lv, client, 'ns_other');

  const held = defined();
  held.config = [
    {
      type: 'file',
      device: 'disk',
      targetDev: 'sdzz',
      bus: 'scsi',
      sourceFile: '/kv/disk.img',
      alias: 'ua-data',
      serial: undefined,
      readonly: false,
    },
  ];
  lv.domains.set('ns_held', held);
  await assert.rejects(injector.inject({ ...target, name: 'held' }, '/seeds/nocloud-1.iso'), notRunning);
  assert.equal(injector.preparedAttaches, 0, 'sdzz is taken in the defined domain: nothing prepared');
  start(lv, client, 'ns_held');

  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(attaches(lv), []);
});

test('without libvirt events (virsh), or where the config may be changed (not live-only), nothing is prepared', async () => {
  const lv = new FakeLibvirt();
  lv.domains.set('ns_vm', defined());
  const virsh = new LibvirtInjector({ spawner: lv, liveOnly: true, bus: 'scsi' });
  await assert.rejects(virsh.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  assert.equal(virsh.preparedAttaches, 0);
  const plain = new LibvirtInjector({ client: new EventingFakeClient(lv), bus: 'scsi' });
  const r = await plain.inject(target, '/seeds/nocloud-1.iso');
  assert.deepEqual([r.action, r.flags], ['attached', ['--config']]);
  assert.equal(plain.preparedAttaches, 0);
});

test("a VMI that ended: its attaches go, prepared or sent and not reported, other VMIs' stay", async () => {
  const { lv, client, injector } = setup();
  lv.domains.set('ns_vm', defined());
  lv.domains.set('ns_other', defined());
  await assert.rejects(injector.inject(target, '/seeds/nocloud-1.iso'), notRunning);
  await assert.rejects(injector.inject({ ...target, name: 'other' }, '/seeds/nocloud-2.iso'), notRunning);
  assert.equal(injector.holds('ns/vm'), true);
  injector.forget('ns/vm');
  assert.equal(injector.holds('ns/vm'), false);
  assert.equal(injector.holds('ns/other'), true);
  start(lv, client);
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(attaches(lv), [], 'nothing sent for the VMI that ended');

  // Sent at the start, ended before its reconcile reported it.
  start(lv, client, 'ns_other');
  await injector.attachingAtStart(URI, 'ns_other');
  assert.equal(lv.domains.get('ns_other')!.live.length, 1);
  assert.equal(injector.holds('ns/other'), true, 'sent, not reported yet');
  injector.forget('ns/other');
  assert.equal(injector.holds('ns/other'), false);
});
