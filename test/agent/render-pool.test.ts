// The render pool (src/agent/render-pool.ts): large documents go to a
// worker thread and come back as the same results and the same typed
// errors; small ones stay in this thread; a step past its deadline, one
// that blows the worker's heap cap, one cancelled by its signal or by
// close(), and one beyond the queue bound each fail with a stable code, and
// the pool goes on with a new worker.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RenderPool } from '../../src/agent/render-pool.ts';
import { runPure } from '../../src/cloudinit/pure-ops.ts';
import { SeedBudget } from '../../src/cloudinit/limits.ts';
import { VmseedError } from '../../src/errors.ts';
import { aliasBomb, denseCloudConfig } from '../hostile/corpus.ts';

const MISBEHAVING = new URL('../fixtures/render-pool/misbehaving-worker.ts', import.meta.url);
const utf8 = (s: string) => new Uint8Array(Buffer.from(s, 'utf8'));

async function rejection(p: Promise<unknown>): Promise<VmseedError> {
  try {
    await p;
  } catch (e) {
    assert.ok(e instanceof VmseedError, `not a VmseedError: ${String(e)}`);
    return e;
  }
  assert.fail('expected a rejection');
}

test('a large merge runs on the worker and gives what the same step gives inline; small ones stay here', async (t) => {
  const pool = new RenderPool({ minBytes: 64 * 1024 });
  t.after(() => pool.close());
  const dense = utf8(denseCloudConfig(100 * 1024));
  const budget = new SeedBudget({ maxUserDataBytes: 1024 * 1024, maxNetworkDataBytes: 0 });
  const parts = { generated: { hostname: 'h' }, inline: { bytes: dense, field: 'f' }, mode: 'merge' as const };
  const here = runPure('composeUserData', [parts, budget.snapshot()]);
  const there = await pool.run('composeUserData', [parts, budget.snapshot()], dense.length);
  assert.equal(pool.offloaded, 1);
  assert.equal(pool.started, 1);
  assert.deepEqual(there, here);
  assert.equal(there.budget.userData, dense.length, 'the budget charged on the worker comes back');

  const small = utf8('#cloud-config\nhostname: x\n');
  assert.deepEqual(await pool.run('lintUserData', [small, 'f'], small.length), []);
  assert.equal(pool.offloaded, 1, 'a small document is not sent');
});

test('a typed error from the worker keeps its code, kind and field', async (t) => {
  const pool = new RenderPool({ minBytes: 0 });
  t.after(() => pool.close());
  const bomb = utf8(`#cloud-config\n${aliasBomb(6, 10)}\n`);
  const e = await rejection(pool.run('lintUserData', [bomb, 'vmseed.io/cloud-init.secretRef'], bomb.length));
  assert.equal(e.code, 'YAML_TOO_COMPLEX');
  assert.equal(e.kind, 'terminal');
  assert.equal(e.field, 'vmseed.io/cloud-init.secretRef');
  // __proto__ stays an own key across the thread boundary.
  const spec = await pool.run('parseAnnotation', ['metaData:\n  __proto__: {polluted: true}\n'], 0);
  assert.deepEqual(Object.keys(spec.extras.metaData ?? {}), ['__proto__']);
  assert.equal(({} as Record<string, unknown>).polluted, undefined);
});

test('a step past its deadline ends the worker with RENDER_TIMEOUT; the next step gets a new worker', async (t) => {
  const pool = new RenderPool({ minBytes: 0, deadlineMs: 1000, workerUrl: MISBEHAVING });
  t.after(() => pool.close());
  const e = await rejection(pool.run('lintUserData', [utf8('x'), 'hang'], 1));
  assert.equal(e.code, 'RENDER_TIMEOUT');
  assert.equal(e.kind, 'retryable');
  assert.equal(pool.workers, 0, 'the hung worker is gone');
  assert.deepEqual(await pool.run('lintUserData', [utf8('#cloud-config\n'), 'f'], 1), []);
  assert.equal(pool.started, 2);
});

test("a step that passes the worker's heap cap fails with RENDER_WORKER_FAILED, not the process", async (t) => {
  const pool = new RenderPool({ minBytes: 0, deadlineMs: 60_000, maxOldGenerationSizeMb: 16, workerUrl: MISBEHAVING });
  t.after(() => pool.close());
  const e = await rejection(pool.run('lintUserData', [utf8('x'), 'oom'], 1));
  assert.equal(e.code, 'RENDER_WORKER_FAILED');
  assert.equal(e.kind, 'retryable');
  assert.match(e.message, /16 MiB heap/);
  assert.deepEqual(await pool.run('lintUserData', [utf8('#cloud-config\n'), 'f'], 1), []);
});

test('the signal cancels a running step and a queued one; beyond the queue bound RENDER_QUEUE_FULL; close() cancels the rest', async (t) => {
  const pool = new RenderPool({ minBytes: 0, deadlineMs: 60_000, maxQueue: 1, workerUrl: MISBEHAVING });
  t.after(() => pool.close());
  const stop = new AbortController();
  const running = rejection(pool.run('lintUserData', [utf8('x'), 'hang'], 1, stop.signal));
  const queued = rejection(pool.run('lintUserData', [utf8('#cloud-config\n'), 'f'], 1, stop.signal));
  const full = await rejection(pool.run('lintUserData', [utf8('#cloud-config\n'), 'f'], 1));
  assert.equal(full.code, 'RENDER_QUEUE_FULL');
  assert.equal(full.kind, 'retryable');
  stop.abort();
  assert.equal((await running).code, 'CANCELLED');
  assert.equal((await queued).code, 'CANCELLED');
  assert.equal(pool.workers, 0, 'the worker running the cancelled step is ended');
  await rejection(pool.run('lintUserData', [utf8('x'), 'f'], 1, stop.signal)).then((e) =>
    assert.equal(e.code, 'CANCELLED'),
  );

  const late = rejection(pool.run('lintUserData', [utf8('x'), 'hang'], 1));
  const waiting = rejection(pool.run('lintUserData', [utf8('x'), 'f'], 1));
  await pool.close();
  assert.equal((await late).code, 'CANCELLED');
  assert.equal((await waiting).code, 'CANCELLED');
  assert.equal(pool.workers, 0);
});

test('a worker that never gets ready fails its step with RENDER_WORKER_FAILED after startMs', async (t) => {
  const pool = new RenderPool({
    minBytes: 0,
    startMs: 500,
    workerUrl: new URL('../fixtures/render-pool/silent-worker.ts', import.meta.url),
  });
  t.after(() => pool.close());
  const e = await rejection(pool.run('lintUserData', [utf8('x'), 'f'], 1));
  assert.equal(e.code, 'RENDER_WORKER_FAILED');
  assert.match(e.message, /did not start within 500 ms/);
  assert.equal(pool.offloaded, 0, 'the step was never sent');
  assert.equal(pool.workers, 0);
});
