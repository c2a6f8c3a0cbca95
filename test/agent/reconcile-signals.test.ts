// Each reconcile's own signal: aborted when its VMI is deleted, replaced,
// moved away or superseded by a newer generation (and at the stop deadline),
// and given to every libvirt call the reconcile makes. A VMI deleted while
// its attach hangs stops that attach at once, and with one worker the next
// VMI's reconcile runs instead of waiting behind it.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { FakeLibvirt, type FakeDomain } from '../support/fake-libvirt.ts';
import { ReconcileSignals } from '../../src/agent/reconcile-signals.ts';
import { ShutdownDeadline } from '../../src/agent/shutdown.ts';
import { cancelledBy, VmseedError } from '../../src/errors.ts';
import { LibvirtInjector } from '../../src/libvirt/injector.ts';
import { KubeConnectionApi, type KubeApi } from '../../src/kube/api-client.ts';
import { kubevirtUnpause } from '../../src/agent/domain/kubevirt-resume.ts';
import type { DeviceFlags } from '../../src/libvirt/libvirt-client.ts';
import { VirshLibvirtClient } from '../../src/libvirt/virsh/virsh-client.ts';
import type { VmiObject } from '../../src/api/objects.ts';

const withMeta = (uid: string, generation?: number): VmiObject => {
  const v = vmi('a');
  v.metadata.uid = uid;
  if (generation !== undefined) v.metadata.generation = generation;
  return v;
};

const reasonOf = (s: AbortSignal) => (s.reason instanceof VmseedError ? s.reason : undefined);

test('the signal ends a reconcile whose VMI was deleted, replaced, moved away or given a newer generation, and no other', () => {
  const signals = new ReconcileSignals();
  const s = signals.begin('default/a', withMeta('u1', 1));
  signals.changed('default/a', withMeta('u1', 1), true); // a status update, a resync
  signals.changed('default/b', undefined, false); // another key
  assert.equal(s.aborted, false);
  signals.changed('default/a', withMeta('u1', 2), true);
  assert.equal(reasonOf(s)?.code, 'CANCELLED');
  assert.match(reasonOf(s)!.message, /newer generation \(2\)/);
  signals.end('default/a');

  const cases: Array<[VmiObject | undefined, boolean, RegExp]> = [
    [undefined, false, /was deleted/],
    [withMeta('u2', 1), true, /replaced by a new object/],
    [withMeta('u1', 1), false, /not this node's any more/],
  ];
  for (const [now, here, why] of cases) {
    const one = signals.begin('default/a', withMeta('u1', 1));
    signals.changed('default/a', now, here);
    assert.match(reasonOf(one)?.message ?? '', why);
    assert.equal(reasonOf(one)?.kind, 'retryable');
    signals.end('default/a');
  }
  // A reconcile that began without an object only cleans up: it runs on.
  const cleanup = signals.begin('default/a', undefined);
  signals.changed('default/a', withMeta('u3', 1), true);
  assert.equal(cleanup.aborted, false);
});

test('the signal follows the stop deadline too', async () => {
  const deadline = new ShutdownDeadline();
  const s = new ReconcileSignals(deadline).begin('default/a', withMeta('u1'));
  deadline.arm(0);
  await waitFor('the deadline', () => s.aborted);
  assert.equal(cancelledBy(s).code, 'CANCELLED');
  deadline.dispose();
});

// libvirt that never answers the attach to `stuck`'s domain: the call ends
// only when its signal aborts, as the RPC client's and virsh's calls do.
class HangingAttach extends VirshLibvirtClient {
  readonly hung: Array<AbortSignal | undefined> = [];

  override attachDevice(uri: string, domain: string, xml: string, o: DeviceFlags): Promise<void> {
    if (domain !== 'default_stuck') return super.attachDevice(uri, domain, xml, o);
    const signal = o.signal;
    this.hung.push(signal);
    return new Promise((_, reject) =>
      signal?.addEventListener('abort', () => reject(cancelledBy(signal, 'the attach')), { once: true }),
    );
  }
}

const shutOff = (): FakeDomain => ({ state: 'shut off', persistent: true, live: [], config: [], unplugs: true });

test(
  "a VMI deleted while its attach hangs: the attach is cancelled, the next VMI's reconcile runs, the image goes",
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const lv = new FakeLibvirt();
    lv.domains.set('default_stuck', shutOff());
    lv.domains.set('default_next', shutOff());
    const client = new HangingAttach({ spawner: lv });
    // One worker: anything the hung reconcile held would hold `next` too.
    const h = await startAgent(fake, { stateDir: dir.path, injector: new LibvirtInjector({ client }), concurrency: 1 });
    t.after(h.stop);
    fake.applyVmi(vmi('stuck'));
    await waitFor('the attach to hang', () => client.hung.length > 0, 30_000);
    assert.ok(client.hung[0], 'the attach was given the reconcile signal');
    fake.applyVmi(vmi('next'));
    fake.deleteVmi('default', 'stuck');
    await waitFor('the next VMI seeded', () => h.agent.status.get('default/next')?.state === 'ready', 30_000);
    assert.equal(client.hung[0].aborted, true);
    assert.match(String((client.hung[0].reason as Error).message), /default\/stuck was deleted/);
    assert.equal(lv.domains.get('default_next')!.config.length, 1, 'the next VMI got its disk');
    await waitFor('the deleted VMI forgotten', () => h.agent.status.get('default/stuck') === undefined, 30_000);
    const images = await h.store.list();
    assert.deepEqual(
      images.map((i) => i.name),
      ['next'],
      'the deleted VMI has no image left',
    );
    assert.equal(lv.domains.get('default_stuck')!.config.length, 0, 'nothing was attached to the deleted VMI');
    assert.ok(
      h.lines.some((l) => {
        const o = JSON.parse(l) as { code?: string; msg?: string };
        return o.code === 'CANCELLED' && /was deleted/.test(o.msg ?? '');
      }),
      'the cancel is logged with its reason',
    );
  },
);

test(
  "a gated VMI deleted while KubeVirt's unpause hangs: the unpause call is cancelled, the next VMI's reconcile runs",
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const lv = new FakeLibvirt();
    lv.domains.set('default_stuck', { ...shutOff(), state: 'paused' });
    lv.domains.set('default_next', shutOff());
    // virt-api never answers this unpause; only the reconcile's end can stop the call.
    let release = () => {};
    const held = new Promise<void>((r) => (release = r));
    const asked: string[] = [];
    fake.onUnpause(async (_ns, name) => {
      asked.push(name);
      await held;
    });
    const connection = fake.connection();
    t.after(async () => {
      release();
      await connection.close();
    });
    const real = new KubeConnectionApi(connection, { timeoutMs: 600_000 });
    // What became of the call itself, not only of the reconcile waiting on it.
    const calls: Array<{ signal: AbortSignal | undefined; outcome?: unknown }> = [];
    const api: KubeApi = {
      request: (method, path, body, contentType, signal) => {
        const call: (typeof calls)[number] = { signal };
        calls.push(call);
        return real.request(method, path, body, contentType, signal).catch((e: unknown) => {
          call.outcome = e;
          throw e;
        });
      },
    };
    const injector = new LibvirtInjector({ spawner: lv, resume: kubevirtUnpause(api) });
    const h = await startAgent(fake, { stateDir: dir.path, injector, concurrency: 1 });
    t.after(h.stop);
    const gated = vmi('stuck');
    gated.spec.startStrategy = 'Paused';
    gated.metadata.annotations!['vmseed.io/resume-after-seed'] = 'true';
    gated.status = { ...gated.status, phase: 'Running', conditions: [{ type: 'Paused', status: 'True' }] };
    fake.applyVmi(gated);
    await waitFor('the unpause to hang', () => asked.length > 0, 30_000);
    fake.applyVmi(vmi('next'));
    fake.deleteVmi('default', 'stuck');
    await waitFor('the next VMI seeded', () => h.agent.status.get('default/next')?.state === 'ready', 30_000);
    assert.equal(lv.domains.get('default_next')!.config.length, 1, 'the next VMI got its disk');
    assert.deepEqual(fake.unpaused, [], 'the hung unpause never completed');
    assert.equal(calls.length, 1);
    assert.equal(calls[0].signal?.aborted, true, "the unpause call was given the reconcile's signal");
    await waitFor('the unpause call itself to end', () => calls[0].outcome !== undefined, 10_000);
    assert.match(String((calls[0].outcome as Error).message), /default\/stuck was deleted/);
    assert.ok(
      h.lines.some((l) => {
        const o = JSON.parse(l) as { code?: string; msg?: string };
        return o.code === 'CANCELLED' && /default\/stuck was deleted/.test(o.msg ?? '');
      }),
      'the cancel is logged with its reason',
    );
  },
);
