// An INTERNAL error (a bug, or an input nothing else caught) and a render
// that keeps running out of the render worker's deadline are retried a
// bounded number of times, then reported terminal until the VMI changes.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { setTimeout as sleep } from 'node:timers/promises';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { MAX_INTERNAL_ATTEMPTS, MAX_RENDER_TIMEOUTS } from '../../src/agent/reconcile-recorder.ts';
import { VmseedError } from '../../src/errors.ts';
import type { RenderSeed } from '../../src/agent/deps.ts';
import type {
  EjectionResult,
  InjectionResult,
  InjectionTarget,
  Injector,
} from '../../src/libvirt/injector-contract.ts';

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

// The VMI's status once it shows `code` as a terminal error.
function terminal(h: Awaited<ReturnType<typeof startAgent>>, key: string, code: string) {
  return waitFor(
    `terminal ${code}`,
    () => {
      const s = h.agent.status.get(key);
      return s?.lastError?.code === code && s.lastError.kind === 'terminal' ? s : undefined;
    },
    15_000,
  );
}

test(
  `INTERNAL is retried ${MAX_INTERNAL_ATTEMPTS} times in all, then terminal; a change to the VMI tries again`,
  { timeout: 30_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const injector = new ThrowingInjector();
    const h = await startAgent(fake, { stateDir: dir.path, injector });
    t.after(h.stop);
    fake.applyVmi(vmi('poison'));
    const rec = await terminal(h, 'default/poison', 'INTERNAL');
    assert.equal(injector.calls, MAX_INTERNAL_ATTEMPTS);
    assert.match(rec.lastError!.message, /stops retrying/);
    assert.doesNotMatch(rec.lastError!.message, /Invalid string length/, 'the cause is not echoed');
    // The backoff tops out at 400 ms here: a further retry would have come.
    await sleep(1500);
    assert.equal(injector.calls, MAX_INTERNAL_ATTEMPTS);
    fake.applyVmi(vmi('poison', { userData: 'changed' }));
    await waitFor('tried again after a change', () => injector.calls > MAX_INTERNAL_ATTEMPTS, 20_000);
  },
);

// A renderer whose steps run out of the render worker's deadline, as the
// render pool reports it, after `before` failures of another kind.
function timingOutRender(before: number): { render: RenderSeed; calls(): number; at(call: number): number } {
  let calls = 0;
  const times: number[] = [];
  return {
    calls: () => calls,
    // When the n-th call (from 1) began.
    at: (call) => times[call - 1],
    render: async () => {
      calls++;
      times.push(Date.now());
      if (calls <= before)
        throw new VmseedError('SECRET_NOT_FOUND', 'userDataSecretRef: Secret default/s not found yet; will retry', {
          kind: 'retryable',
          field: 'userDataSecretRef',
        });
      throw new VmseedError(
        'RENDER_TIMEOUT',
        'rendering took more than 10000 ms on the render worker (step mergeParts); the worker was ended and the render is retried with backoff',
        { kind: 'retryable' },
      );
    },
  };
}

test(
  `RENDER_TIMEOUT: ${MAX_RENDER_TIMEOUTS} times for one version of the VMI, then terminal and parked; failures of other kinds before do not count; the park ends (then doubles), a change tries again at once`,
  { timeout: 60_000 },
  async (t) => {
    const { fake, dir } = await fakeKubeAndDir(t);
    const r = timingOutRender(4);
    // A park long enough that the checks made during it (1.5 s after the
    // status showed it) stay inside it on a loaded machine.
    const h = await startAgent(fake, { stateDir: dir.path, render: r.render, renderTimeoutParkMs: 8000 });
    t.after(h.stop);
    fake.applyVmi(vmi('heavy'));
    const rec = await terminal(h, 'default/heavy', 'RENDER_TIMEOUT');
    assert.equal(r.calls(), 4 + MAX_RENDER_TIMEOUTS);
    assert.match(
      rec.lastError!.message,
      /3 times for this version of the VMI; vmseed tries again in 8.00 s or when the VMI changes/,
    );
    // The backoff tops out at 400 ms here: a further retry would have come.
    // A resync does not end the park either.
    await sleep(1000);
    h.agent.resync();
    await sleep(500);
    // Unless this test was starved past the park's end (then a retry is due).
    if (Date.now() - r.at(4 + MAX_RENDER_TIMEOUTS) < 7900) assert.equal(r.calls(), 4 + MAX_RENDER_TIMEOUTS);
    // The park ends: one more try, a fourth timeout, parked twice as long.
    const again = await waitFor(
      'one try after the park',
      () => {
        const s = h.agent.status.get('default/heavy');
        return r.calls() === 5 + MAX_RENDER_TIMEOUTS &&
          s?.lastError?.kind === 'terminal' &&
          /4 times/.test(s.lastError.message)
          ? s
          : undefined;
      },
      25_000,
    );
    // Between the calls themselves: the park starts after the last timed-out
    // call and lasts 8 s, however late this test saw it start.
    const parked = r.at(5 + MAX_RENDER_TIMEOUTS) - r.at(4 + MAX_RENDER_TIMEOUTS);
    assert.ok(parked >= 7900, `not before the park ended (${parked} ms)`);
    assert.match(again.lastError!.message, /tries again in 16.00 s/);
    fake.applyVmi(vmi('heavy', { userData: 'changed' }));
    await waitFor(
      'three more after the change',
      () =>
        h.agent.status.get('default/heavy')?.lastError?.kind === 'terminal' &&
        r.calls() === 5 + 2 * MAX_RENDER_TIMEOUTS,
      15_000,
    );
  },
);
