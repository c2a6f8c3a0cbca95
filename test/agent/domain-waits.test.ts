// A VMI waiting for its domain is reconciled when libvirt says the domain
// appeared, not after its backoff: the agent in local mode with the real
// renderer, ISO builder and store, the injector over a fake libvirt with
// events (the RPC client's face), and a retry backoff of ten minutes, so
// only the event can bring the retry within the test.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Agent } from '../../src/agent/controller.ts';
import { clientDomainEvents, DomainWaits, type DomainEvents } from '../../src/agent/domain/waits.ts';
import { LocalDirSource } from '../../src/agent/local/local-vmi-source.ts';
import { LogEventRecorder } from '../../src/agent/events.ts';
import { renderSeed } from '../../src/cloudinit/render.ts';
import { buildSeedImage } from '../../src/disk/seed-image.ts';
import { ImageStore } from '../../src/disk/store.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { VmseedError } from '../../src/errors.ts';
import type { InjectionTarget, Injector } from '../../src/libvirt/injector-contract.ts';
import { captureLogger } from '../support/capture-logger.ts';
import { EventingFakeClient, FakeLibvirt } from '../support/fake-libvirt.ts';

const VMI = `apiVersion: kubevirt.io/v1
kind: VirtualMachineInstance
metadata:
  name: web
  namespace: ns
  annotations:
    vmseed.io/resume-after-seed: "true"
spec:
  domain: {}
  volumes:
    - name: cloudinit
      cloudInitNoCloud:
        userData: |
          #cloud-config
          hostname: web
`;

async function until(what: string, pred: () => boolean, ms = 10_000): Promise<void> {
  const end = Date.now() + ms;
  while (!pred()) {
    if (Date.now() > end) assert.fail(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

async function localAgent(
  t: { after(fn: () => Promise<void>): void },
  injector: Injector,
  domainEvents: DomainEvents | undefined,
) {
  const dir = await mkdtemp(join(tmpdir(), 'vmseed-waits-'));
  t.after(() => rm(dir, { recursive: true, force: true }));
  const { logger, lines } = captureLogger('debug');
  const agent = new Agent({
    version: 't',
    nodeName: 'n1',
    stateDir: join(dir, 'seeds'),
    config: {},
    makeSource: (onKey) => new LocalDirSource({ dir: join(dir, 'vmis'), logger, onKey }),
    refs: (source) => source as LocalDirSource,
    render: renderSeed,
    build: buildSeedImage,
    store: new ImageStore({ root: join(dir, 'seeds') }),
    injector,
    ...(domainEvents ? { domainEvents } : {}),
    events: new LogEventRecorder(logger),
    logger,
    concurrency: 2,
    renderOptions: { kubevirtVolumes: 'own', maxUserDataBytes: 1 << 20, maxNetworkDataBytes: 1 << 20 },
    resyncPeriodMs: 3_600_000,
    retryBackoff: { baseMs: 600_000, maxMs: 600_000 },
    fsync: false,
  });
  const { mkdir } = await import('node:fs/promises');
  await mkdir(join(dir, 'vmis'));
  await writeFile(join(dir, 'vmis', 'web.yaml'), VMI);
  await agent.start();
  t.after(async () => void (await agent.stop(2_000)));
  return { agent, lines };
}

test('libvirt platform: a domain defined after its VMI is seeded on the defined event, and resumed when started paused', async (t) => {
  const lv = new FakeLibvirt();
  const client = new EventingFakeClient(lv);
  const injector = new LibvirtInjector({ client });
  const watched: string[] = [];
  const events = clientDomainEvents(
    { onEvent: (l) => client.onEvent(l), watch: (uri) => (watched.push(uri), () => {}) },
    (x) => injector.locate(x),
    ['qemu:///system'],
  );
  const { agent } = await localAgent(t, injector, events);
  assert.deepEqual(watched, ['qemu:///system'], 'the one host URI, from the start');
  await until('the first attempt to fail', () => agent.status.get('ns/web')?.lastError?.code === 'DOMAIN_NOT_FOUND');

  // Another domain's event changes nothing.
  client.emit({ type: 'lifecycle', uri: 'qemu:///system', domain: 'ns_other', uuid: 'u', event: 'defined', detail: 0 });
  lv.domains.set('ns_web', { state: 'paused', persistent: true, live: [], config: [], unplugs: true });
  const attempts = lv.calls.filter((c) => c[0] === 'dominfo').length;
  await new Promise((r) => setTimeout(r, 100));
  assert.equal(lv.calls.filter((c) => c[0] === 'dominfo').length, attempts);

  client.emit({ type: 'lifecycle', uri: 'qemu:///system', domain: 'ns_web', uuid: 'u', event: 'started', detail: 1 });
  // The status is written after the injector returns: wait for both.
  await until(
    'the seed attached, the domain resumed, the VMI ready',
    () => lv.domains.get('ns_web')!.state === 'running' && agent.status.get('ns/web')?.lastError === undefined,
  );
  assert.equal(lv.domains.get('ns_web')!.live.filter((d) => d.alias === 'ua-vmseed_seed').length, 1);
});

test('without events (the virsh client) the same VMI waits for its backoff', async (t) => {
  const lv = new FakeLibvirt();
  const injector = new LibvirtInjector({ spawner: lv });
  const { agent } = await localAgent(t, injector, undefined);
  await until('the first attempt to fail', () => agent.status.get('ns/web')?.lastError?.code === 'DOMAIN_NOT_FOUND');
  lv.domains.set('ns_web', { state: 'paused', persistent: true, live: [], config: [], unplugs: true });
  await new Promise((r) => setTimeout(r, 300));
  assert.equal(lv.domains.get('ns_web')!.state, 'paused');
});

// The VMI's launcher pod is known: its socket is where the domain will be.
const target: InjectionTarget = {
  namespace: 'ns',
  name: 'web',
  uid: 'u',
  datasource: 'nocloud',
  annotations: {},
  launcherPods: ['pod-a'],
};

// DomainWaits started over `events`, wrapping `inner`; what it enqueues.
function started(events: DomainEvents, inner: Injector) {
  const enqueued: string[] = [];
  const { logger } = captureLogger('debug');
  const waits = new DomainWaits(events, (k) => enqueued.push(k), logger);
  waits.start();
  return { waits, inj: waits.wrap(inner), enqueued };
}

// KubeVirt: one socket per launcher, watched only while its VMI waits.
test('per-launcher URIs: watched while the VMI waits for its domain, released once seeded; a reconnect re-runs the waiting VMI', async () => {
  const watching = new Map<string, number>();
  let listener: ((uri: string, domain: string | undefined, event: string) => void) | undefined;
  const events: DomainEvents = {
    subscribe: (l) => ((listener = l), () => (listener = undefined)),
    watch: (uri) => {
      watching.set(uri, (watching.get(uri) ?? 0) + 1);
      return () => watching.set(uri, watching.get(uri)! - 1);
    },
    locate: (x: InjectionTarget) => {
      if (!x.launcherPods?.length) throw new VmseedError('LAUNCHER_POD_UNKNOWN', 'no pod', { kind: 'retryable' });
      return { uri: `sock:${x.launcherPods[0]}`, domain: `${x.namespace}_${x.name}` };
    },
  };
  let exists = false;
  const inner: Injector = {
    inject: async (x) => {
      if (!exists) throw new VmseedError('DOMAIN_NOT_FOUND', 'not yet', { kind: 'retryable' });
      return {
        action: 'attached',
        domain: `${x.namespace}_${x.name}`,
        targetDev: 'sdzz',
        bus: 'scsi',
        flags: ['--live'],
        domainState: 'paused',
        persistent: false,
        seededAfterBoot: false,
        resumed: false,
      };
    },
    eject: async (x) => ({ action: 'none', domain: `${x.namespace}_${x.name}` }),
  };
  const { waits, inj, enqueued } = started(events, inner);

  // No launcher pod yet: nothing to watch (the VMI's update brings the pod).
  // The injector's own error passes through; locate's is not the VMI's error.
  await assert.rejects(inj.inject({ ...target, launcherPods: [] }, '/i.iso'), { code: 'DOMAIN_NOT_FOUND' });
  assert.equal(watching.size, 0);
  await assert.rejects(
    inj.inject(target, '/i.iso'),
    (e: unknown) => e instanceof VmseedError && e.code === 'DOMAIN_NOT_FOUND',
  );
  assert.deepEqual([...watching], [['sock:pod-a', 1]]);
  assert.deepEqual(waits.waiting, ['ns/web']);
  // Retried while still missing: still one watch.
  await assert.rejects(inj.inject(target, '/i.iso'), { code: 'DOMAIN_NOT_FOUND' });
  assert.deepEqual([...watching], [['sock:pod-a', 1]]);

  listener!('sock:pod-a', 'ns_web', 'stopped');
  listener!('sock:pod-b', 'ns_web', 'started');
  assert.deepEqual(enqueued, []);
  listener!('sock:pod-a', undefined, 'connected');
  listener!('sock:pod-a', 'ns_web', 'started');
  assert.deepEqual(enqueued, ['ns/web', 'ns/web']);

  exists = true;
  assert.equal((await inj.inject(target, '/i.iso')).action, 'attached');
  assert.deepEqual([...watching], [['sock:pod-a', 0]]);
  assert.deepEqual(waits.waiting, []);
  listener!('sock:pod-a', 'ns_web', 'started');
  assert.equal(enqueued.length, 2);

  // A terminal failure is not a wait.
  exists = false;
  inner.inject = async () => {
    throw new VmseedError('TARGET_IN_USE', 'x', { kind: 'terminal' });
  };
  await assert.rejects(inj.inject(target, '/i.iso'), { code: 'TARGET_IN_USE' });
  assert.deepEqual(waits.waiting, []);
  waits.stop();
  assert.equal(listener, undefined);
});

// The injector sent the seed's attach from the start event itself
// (prepared-attach.ts): the reconcile that event brings waits for libvirt's
// answer rather than competing with it.
test('a start whose seed attach the injector sent from the event: the VMI is reconciled once libvirt answered it', async () => {
  let listener: ((uri: string, domain: string | undefined, event: string) => void) | undefined;
  const events: DomainEvents = {
    subscribe: (l) => ((listener = l), () => (listener = undefined)),
    watch: () => () => {},
    locate: (x: InjectionTarget) => ({ uri: 'sock:pod-a', domain: `${x.namespace}_${x.name}` }),
  };
  let sending: Promise<void> | undefined;
  const inner: Injector = {
    inject: async () => {
      throw new VmseedError('DOMAIN_STATE_UNSUPPORTED', 'not running', { kind: 'retryable' });
    },
    eject: async (x) => ({ action: 'none', domain: `${x.namespace}_${x.name}` }),
    attachingAtStart: (uri, domain) => (uri === 'sock:pod-a' && domain === 'ns_web' ? sending : undefined),
  };
  const { waits, inj, enqueued } = started(events, inner);
  await assert.rejects(inj.inject(target, '/i.iso'), { code: 'DOMAIN_STATE_UNSUPPORTED' });
  assert.deepEqual(waits.waiting, ['ns/web']);

  let answer: (() => void) | undefined;
  sending = new Promise<void>((resolve) => (answer = resolve));
  listener!('sock:pod-a', 'ns_web', 'started');
  listener!('sock:pod-a', 'ns_web', 'suspended');
  await new Promise((r) => setTimeout(r, 50));
  assert.deepEqual(enqueued, [], 'not while the attach waits for its answer');
  sending = undefined;
  answer!();
  await until('the reconcile after the answer', () => enqueued.length === 2);
  assert.deepEqual(enqueued, ['ns/web', 'ns/web']);

  // Nothing in flight: at once, as before.
  listener!('sock:pod-a', 'ns_web', 'defined');
  assert.equal(enqueued.length, 3);
  waits.stop();
});
