// The seed gate's last case: a domain already running when its seed arrives.
// The guest may have booted without it; that stays true for the VMI's life,
// so the warning stays on the status after later reconciles, and the Event
// is written once and the counter counts it once (not repeated).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, RecordingInjector, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import type { InjectionResult, InjectionTarget } from '../../src/libvirt/injector-contract.ts';

class RunningDomainInjector extends RecordingInjector {
  override async inject(t: InjectionTarget, imagePath: string): Promise<InjectionResult> {
    const r = await super.inject(t, imagePath);
    // As LibvirtInjector reports an attach: the URI and when it was made.
    const attached = r.action === 'attached' ? { uri: 'qemu:///system', attachedAt: Date.now() } : {};
    return { ...r, flags: ['--live'], domainState: 'running', seededAfterBoot: r.action !== 'none', ...attached };
  }
}

test(
  'seeded after boot: warning state and a SeedWarning Event that survive a resync',
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const h = await startAgent(fake, { stateDir: dir.path, injector: new RunningDomainInjector() });
    t.after(h.stop);

    fake.applyVmi(vmi('late'));
    const rec = await waitFor('late seeded', () => {
      const r = h.agent.status.get('default/late');
      return r?.state === 'warning' ? r : undefined;
    });
    assert.equal(rec.injection?.seededAfterBoot, true);
    assert.deepEqual(
      rec.warnings.map((w) => w.code),
      ['SEEDED_AFTER_BOOT'],
    );

    h.agent.resync();
    await new Promise((r) => setTimeout(r, 200));
    await h.agent.queue.idle();
    const again = h.agent.status.get('default/late')!;
    assert.equal(again.state, 'warning');
    assert.deepEqual(
      again.warnings.map((w) => w.code),
      ['SEEDED_AFTER_BOOT'],
    );

    await h.agent.events.flush();
    const warnings = fake.events().filter((e) => e.reason === 'SeedWarning' && e.involvedObject.name === 'late');
    assert.equal(warnings.length, 1, 'one Event object');
    assert.match(warnings[0].message, /^SEEDED_AFTER_BOOT: /);
    assert.equal(warnings[0].count ?? 1, 1, 'not repeated by the resync');
    const counted = (await h.metrics.seededAfterBoot.get()).values.find((v) => v.labels.datasource === 'disk');
    assert.equal(counted?.value, 1, 'vmseed_seeded_after_boot_total{datasource="disk"}: once, not again by the resync');
  },
);

// The injector as LibvirtInjector reports a domain that is running from its
// second call on: the first seed attached while it was paused (or running,
// `firstLate`), every later one replacing it on the running guest.
class UpdatedWhileRunningInjector extends RecordingInjector {
  readonly #firstLate: boolean;
  #calls = 0;
  constructor(firstLate: boolean) {
    super();
    this.#firstLate = firstLate;
  }
  override async inject(t: InjectionTarget): Promise<InjectionResult> {
    const r = await super.inject(t, `/seeds/${++this.#calls}.iso`);
    const running = this.#calls > 1 || this.#firstLate;
    const attached = r.action === 'attached' ? { uri: 'qemu:///system', attachedAt: Date.now() } : {};
    return {
      ...r,
      flags: ['--live'],
      domainState: running ? 'running' : 'paused',
      seededAfterBoot: running,
      ...attached,
    };
  }
}

for (const firstLate of [false, true])
  test(
    `a seed updated on a running guest: ${firstLate ? 'the late first seed stays the warning' : 'no seeded-after-boot warning'}`,
    { timeout: 60_000 },
    async (t) => {
      const { fake, dir } = await fakeKubeAndDir(t);
      const injector = new UpdatedWhileRunningInjector(firstLate);
      const h = await startAgent(fake, { stateDir: dir.path, injector });
      t.after(h.stop);
      fake.applyVmi(vmi('edited'));
      await waitFor('first seed', () => (injector.actions('inject', 'attached').length === 1 ? true : undefined));
      fake.applyVmi(vmi('edited', { userData: 'second version' }));
      await waitFor('seed replaced', () => (injector.actions('inject', 'replaced').length === 1 ? true : undefined));
      await h.agent.queue.idle();
      const rec = h.agent.status.get('default/edited')!;
      assert.equal(rec.injection?.domainState, 'running');
      assert.equal(rec.injection?.seededAfterBoot, firstLate);
      assert.deepEqual(
        rec.warnings.map((w) => w.code),
        firstLate ? ['SEEDED_AFTER_BOOT'] : [],
      );
      const counted = (await h.metrics.seededAfterBoot.get()).values.find((v) => v.labels.datasource === 'disk');
      assert.equal(counted?.value ?? 0, firstLate ? 1 : 0);
    },
  );
