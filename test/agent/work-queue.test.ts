import { test } from 'node:test';
import assert from 'node:assert/strict';
import { WorkQueue, type WorkResult } from '../../src/agent/work-queue.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';

const tick = (ms = 5) => new Promise((r) => setTimeout(r, ms));
// A stop deadline `ms` from now (a ref'd timer: the hung handler below
// holds nothing that keeps the test alive).
const deadline = (ms: number) => {
  const c = new AbortController();
  setTimeout(() => c.abort(), ms);
  return c.signal;
};

test('de-duplicates waiting keys and never runs one key twice at once', async () => {
  let running = 0;
  let maxSame = 0;
  const runs: string[] = [];
  const gate: Array<() => void> = [];
  const q = new WorkQueue({
    concurrency: 4,
    backoff: { baseMs: 10, maxMs: 100 },
    versionOf: () => '1',
    handler: async (key) => {
      runs.push(key);
      running++;
      maxSame = Math.max(maxSame, running);
      await new Promise<void>((r) => gate.push(r));
      running--;
      return 'success';
    },
  });
  q.add('a');
  q.add('a'); // already running → runs once more afterwards
  q.add('a');
  await tick();
  assert.deepEqual(runs, ['a']);
  gate.shift()!();
  await tick();
  assert.deepEqual(runs, ['a', 'a']);
  assert.equal(maxSame, 1);
  gate.shift()!();
  await q.idle();
  assert.deepEqual(runs, ['a', 'a']);
});

test('concurrency limit', async () => {
  let running = 0;
  let peak = 0;
  const q = new WorkQueue({
    concurrency: 3,
    backoff: { baseMs: 10, maxMs: 100 },
    versionOf: () => '1',
    handler: async () => {
      peak = Math.max(peak, ++running);
      await tick(10);
      running--;
      return 'success';
    },
  });
  for (let i = 0; i < 20; i++) q.add(`k${i}`);
  await q.idle();
  assert.equal(peak, 3);
});

test('retryable failures back off exponentially (capped) and reset on success', async (t) => {
  // A mocked setTimeout is the clock: each delay is checked to the
  // millisecond, whatever the machine's load.
  t.mock.timers.enable({ apis: ['setTimeout'] });
  const settle = () => new Promise((r) => setImmediate(r));
  let n = 0;
  const metrics = createMetrics({ version: 't', processMetrics: false });
  const q = new WorkQueue({
    concurrency: 1,
    backoff: { baseMs: 20, maxMs: 80 },
    versionOf: () => '1',
    metrics,
    handler: async (): Promise<WorkResult> => (++n < 6 ? 'retry' : 'success'),
  });
  q.add('k');
  await settle();
  assert.equal(n, 1);
  // 20, 40, 80, then capped at 80.
  for (const delay of [20, 40, 80, 80, 80]) {
    const before: number = n;
    t.mock.timers.tick(delay - 1);
    await settle();
    assert.equal(n, before, `not retried before ${delay} ms`);
    t.mock.timers.tick(1);
    await settle();
    assert.equal(n, before + 1, `retried after ${delay} ms`);
  }
  assert.equal(n, 6);
  assert.equal(q.failures('k'), 0, 'reset on success');
  assert.match(await metrics.registry.getSingleMetricAsString('workqueue_retries_total'), /\{name="vmi"\} 5$/);
});

test('terminal failures wait until the resourceVersion changes', async () => {
  let version = '1';
  let runs = 0;
  const q = new WorkQueue({
    concurrency: 1,
    backoff: { baseMs: 1, maxMs: 1 },
    versionOf: () => version,
    handler: async () => {
      runs++;
      return 'terminal';
    },
  });
  q.add('k');
  await q.idle();
  q.add('k');
  q.add('k');
  await q.idle();
  await tick(20);
  assert.equal(runs, 1);
  version = '2';
  q.add('k');
  await q.idle();
  assert.equal(runs, 2);
});

test('a timed park: adds do not end it, it ends by itself after retryAfterMs, a new version ends it at once, forget() drops its timer', async () => {
  let version = '1';
  const runs: number[] = [];
  const t0 = performance.now();
  const q = new WorkQueue({
    concurrency: 1,
    backoff: { baseMs: 1, maxMs: 1 },
    versionOf: () => version,
    handler: async () => {
      runs.push(performance.now() - t0);
      return { terminal: true, retryAfterMs: 150 };
    },
  });
  q.add('k');
  await q.idle();
  q.add('k'); // a resync during the park
  await tick(60);
  q.add('k');
  await q.idle();
  assert.equal(runs.length, 1);
  await tick(150);
  await q.idle();
  assert.equal(runs.length, 2, 'run again when the park ended, with no add');
  assert.ok(runs[1] - runs[0] >= 140, `${runs[1] - runs[0]} ms apart`);
  version = '2';
  q.add('k');
  await q.idle();
  assert.equal(runs.length, 3, 'a new version runs at once');
  q.forget('k');
  await tick(250);
  assert.equal(runs.length, 3, 'forgotten: its park timer went with it');
  await q.shutdown(deadline(100));
});

test('shutdown stops taking work and waits for in-flight work within the deadline', async () => {
  let finished = 0;
  const q = new WorkQueue({
    concurrency: 2,
    backoff: { baseMs: 1, maxMs: 1 },
    versionOf: () => '1',
    handler: async () => {
      await tick(50);
      finished++;
      return 'success';
    },
  });
  for (const k of ['a', 'b', 'c', 'd']) q.add(k);
  await tick();
  assert.equal(await q.shutdown(deadline(1000)), true);
  assert.equal(finished, 2, 'in-flight finished, queued dropped');
  q.add('e');
  await tick(80);
  assert.equal(finished, 2);
  const slow = new WorkQueue({
    concurrency: 1,
    backoff: { baseMs: 1, maxMs: 1 },
    versionOf: () => '1',
    handler: () => new Promise(() => {}),
  });
  slow.add('x');
  await tick();
  assert.equal(await slow.shutdown(deadline(30)), false);
});

test('keys that failed last time hold at most all workers but one: a new key runs while their retries hang', async () => {
  const until = async (what: () => boolean, ms: number) => {
    const end = Date.now() + ms;
    while (!what()) {
      if (Date.now() > end) return false;
      await tick(5);
    }
    return true;
  };
  const hanging: Array<() => void> = [];
  const failedOnce = new Set<string>();
  const started: string[] = [];
  const q = new WorkQueue({
    concurrency: 3,
    backoff: { baseMs: 1, maxMs: 1 },
    versionOf: () => '1',
    handler: async (key) => {
      started.push(key);
      if (key === 'new') return 'success';
      // Fails at once the first time; its retries hang, as on a launcher
      // whose libvirt never answers.
      if (!failedOnce.has(key)) {
        failedOnce.add(key);
        return 'retry';
      }
      await new Promise<void>((r) => hanging.push(r));
      return 'retry';
    },
  });
  for (const k of ['hung-1', 'hung-2', 'hung-3', 'hung-4']) q.add(k);
  assert.ok(await until(() => hanging.length === 2, 10_000), `${hanging.length} retries hanging`);
  q.add('new');
  assert.ok(await until(() => started.includes('new'), 10_000), 'the new key ran beside the hanging retries');
  assert.equal(hanging.length, 2, 'the retries held two workers of three');
  const stopped = q.shutdown(deadline(5_000));
  for (const r of hanging) r();
  assert.equal(await stopped, true);
});
