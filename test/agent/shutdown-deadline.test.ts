// The one stop deadline: its signals abort in order from the moment stop
// begins, and each reconcile's steps get a signal of their own that follows
// it, so a render waiting on the deadline ends CANCELLED and the stop
// reports the work cancelled, not abandoned.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { fakeKubeAndDir, startAgent, vmi, waitFor } from '../support/agent-harness.ts';
import { aborted, ShutdownDeadline } from '../../src/agent/shutdown.ts';
import { cancelledError } from '../../src/errors.ts';
import type { RenderSeed } from '../../src/agent/deps.ts';

test('the deadline: nothing aborts before arm; then the reconciles, the settle grace and the close, in order', async () => {
  const d = new ShutdownDeadline();
  const one = d.forReconcile();
  assert.deepEqual(
    [d.reconciles.aborted, d.settled.aborted, d.closed.aborted, one.aborted],
    [false, false, false, false],
  );
  const order: string[] = [];
  const seen = Promise.all(
    (
      [
        ['reconciles', d.reconciles],
        ['reconcile', one],
        ['settled', d.settled],
        ['closed', d.closed],
      ] as const
    ).map(([name, s]) => aborted(s).then(() => order.push(name))),
  );
  d.arm(20, 3000);
  d.arm(60_000, 60_000); // the first arm counts
  await seen;
  d.dispose();
  assert.deepEqual(order, ['reconciles', 'reconcile', 'settled', 'closed']);
  assert.ok(d.forReconcile().aborted, 'a reconcile starting past the deadline is cancelled from the start');
});

test('drained: the stop finished in time, so nothing is cancelled afterwards', async () => {
  const d = new ShutdownDeadline();
  d.arm(20);
  d.drained();
  await new Promise((r) => setTimeout(r, 100));
  assert.deepEqual([d.reconciles.aborted, d.settled.aborted], [false, false]);
});

test('a render waiting past the stop deadline gets its reconcile signal aborted: CANCELLED, no image, stop says cancelled', async (t) => {
  const { fake, dir } = await fakeKubeAndDir(t);
  const signals: AbortSignal[] = [];
  const render: RenderSeed = (_vmi, _refs, options) =>
    new Promise((_, reject) => {
      const signal = options.signal!;
      signals.push(signal);
      signal.addEventListener('abort', () => reject(cancelledError('the render')), { once: true });
    });
  const h = await startAgent(fake, { stateDir: dir.path, render });
  t.after(h.stop);
  fake.applyVmi(vmi('slow'));
  await waitFor('the render started', () => signals.length > 0);
  assert.notEqual(signals[0], h.agent.shutdown.reconciles, "the reconcile's own signal, not the process-wide one");
  assert.equal(await h.agent.stop(200), false);
  assert.equal(h.agent.stopOutcome, 'cancelled');
  assert.ok(signals[0].aborted);
  assert.ok(
    h.lines.some((l) => (JSON.parse(l) as { code?: string }).code === 'CANCELLED'),
    'the cancelled reconcile is logged as CANCELLED',
  );
  assert.deepEqual(await h.store.list(), [], 'no image written');
});
