// An INTERNAL error (a bug, or an input nothing else caught) is retried a
// bounded number of times, then reported terminal until the VMI changes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { MAX_INTERNAL_ATTEMPTS } from '../../src/agent/reconciler.ts';
import type { EjectionResult, InjectionResult, InjectionTarget, Injector } from '../../src/libvirt/types.ts';

class ThrowingInjector implements Injector {
  calls = 0;
  async inject(_t: InjectionTarget, _p: string): Promise<InjectionResult> {
    this.calls++;
    throw new TypeError('Invalid string length');
  }
  async eject(t: InjectionTarget): Promise<EjectionResult> {
    return { action: 'none', domain: `${t.namespace}_${t.name}` };
  }
}

test(`INTERNAL is retried ${MAX_INTERNAL_ATTEMPTS} times in all, then terminal; a change to the VMI tries again`, { timeout: 30_000 }, async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const injector = new ThrowingInjector();
  const h = await startAgent(fake, { stateDir: dir.path, injector });
  t.after(h.stop);
  fake.applyVmi(vmi('poison'));
  const rec = await waitFor('terminal INTERNAL', () => {
    const r = h.agent.status.get('default/poison');
    return r?.lastError?.code === 'INTERNAL' && r.lastError.kind === 'terminal' ? r : undefined;
  }, 15_000);
  assert.equal(injector.calls, MAX_INTERNAL_ATTEMPTS);
  assert.match(rec.lastError!.message, /stops retrying/);
  assert.doesNotMatch(rec.lastError!.message, /Invalid string length/, 'the cause is not echoed');
  // The backoff tops out at 400 ms here: a further retry would have come.
  await sleep(1500);
  assert.equal(injector.calls, MAX_INTERNAL_ATTEMPTS);
  fake.applyVmi(vmi('poison', { userData: 'changed' }));
  await waitFor('tried again after a change', () => injector.calls > MAX_INTERNAL_ATTEMPTS, 10_000);
});
