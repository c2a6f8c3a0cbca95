// PathSettler: a path is read once quiet, one read at a time; a touch
// during a read voids it and reads again; a recheck reads again without
// voiding; 'confirm' looks once more; a path touched without pause is
// still read.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { PathSettler, type SettleResult } from '../../src/agent/local/settle.ts';
import { waitFor } from '../support/agent-harness.ts';

const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function recorder(answer: (n: number) => SettleResult = () => 'done', during?: (n: number) => Promise<void>) {
  const reads: Array<{ path: string; current: boolean }> = [];
  let running = 0;
  let overlapped = false;
  const settler = new PathSettler({
    settleMs: 20,
    maxWaitMs: 100,
    read: async (path, current) => {
      if (++running > 1) overlapped = true;
      const n = reads.length;
      await during?.(n);
      reads.push({ path, current: current() });
      running--;
      return answer(n);
    },
    onError: () => assert.fail('no read throws'),
  });
  return { settler, reads, overlapped: () => overlapped };
}

test('a burst of touches is one read, after it', { timeout: 30_000 }, async () => {
  const { settler, reads } = recorder();
  for (let i = 0; i < 20; i++) settler.touch('/a');
  settler.touch('/b');
  await waitFor('idle', () => settler.pending === 0);
  assert.deepEqual(reads.map((r) => r.path).sort(), ['/a', '/b']);
  await settler.close();
});

test('a touch during a read voids it and another read follows; never two at once', { timeout: 30_000 }, async () => {
  let settler: PathSettler | undefined;
  const r = recorder(
    () => 'done',
    async (n) => {
      if (n === 0) settler?.touch('/a');
      await sleep(5);
    },
  );
  settler = r.settler;
  settler.touch('/a');
  await waitFor('idle', () => settler.pending === 0);
  assert.deepEqual(
    r.reads.map((x) => x.current),
    [false, true],
  );
  assert.equal(r.overlapped(), false);
  await settler.close();
});

test('a recheck during a read reads again without voiding it', { timeout: 30_000 }, async () => {
  let settler: PathSettler | undefined;
  const r = recorder(
    () => 'done',
    async (n) => {
      if (n === 0) settler?.recheck('/a');
      await sleep(5);
    },
  );
  settler = r.settler;
  settler.touch('/a');
  await waitFor('idle', () => settler.pending === 0);
  assert.deepEqual(
    r.reads.map((x) => x.current),
    [true, true],
  );
  await settler.close();
});

test("'confirm' reads once more with no touch", { timeout: 30_000 }, async () => {
  const { settler, reads } = recorder((n) => (n === 0 ? 'confirm' : 'done'));
  settler.touch('/a');
  await waitFor('idle', () => settler.pending === 0);
  assert.equal(reads.length, 2);
  await settler.close();
});

test('a path touched without pause is still read while the touches go on', { timeout: 30_000 }, async () => {
  const { settler, reads } = recorder();
  // Touched until read (maxWaitMs is 100 ms): a deadline rather than a fixed
  // 400 ms, as a starved loop may run the last touch before the read's timer.
  const end = Date.now() + 10_000;
  while (reads.length === 0 && Date.now() < end) {
    settler.touch('/a');
    await sleep(2);
  }
  assert.ok(reads.length >= 1, 'read at most maxWaitMs after the first touch');
  await settler.close();
});
