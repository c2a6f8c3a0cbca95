import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createEventLoopMonitor } from '../../src/http/health.ts';

function fakeClock(start = 1000) {
  let t = start;
  return { now: () => t, advance: (ms: number) => (t += ms) };
}

test('regular beats: healthy', () => {
  const clock = fakeClock();
  const m = createEventLoopMonitor({ intervalMs: 100, thresholdMs: 500, windowMs: 10_000, clock });
  for (let i = 0; i < 20; i++) {
    clock.advance(105);
    m.beat();
  }
  const r = m.report();
  assert.equal(r.healthy, true);
  assert.deepEqual(r.reasons, []);
  assert.equal(r.maxLagMs, 5);
});

test('a late beat beyond the threshold is unhealthy until the window has passed', () => {
  const clock = fakeClock();
  const m = createEventLoopMonitor({ intervalMs: 100, thresholdMs: 500, windowMs: 10_000, clock });
  clock.advance(100 + 800);
  m.beat();
  let r = m.report();
  assert.equal(r.healthy, false);
  assert.match(r.reasons[0], /blocked for 800 ms/);
  assert.equal(r.maxLagMs, 800);
  // Keep beating on time: the block ages out of the window.
  for (let i = 0; i < 101; i++) {
    clock.advance(100);
    m.beat();
  }
  r = m.report();
  assert.equal(r.healthy, true, r.reasons.join());
});

test('a lag below the threshold stays healthy', () => {
  const clock = fakeClock();
  const m = createEventLoopMonitor({ intervalMs: 100, thresholdMs: 500, clock });
  clock.advance(100 + 499);
  m.beat();
  assert.equal(m.report().healthy, true);
});

test('no beat for longer than interval + threshold: unhealthy now', () => {
  const clock = fakeClock();
  const m = createEventLoopMonitor({ intervalMs: 100, thresholdMs: 500, clock });
  clock.advance(700);
  const r = m.report();
  assert.equal(r.healthy, false);
  assert.match(r.reasons[0], /heartbeat missing for 700 ms/);
});

test('the real timer sees a real blocked event loop', async () => {
  // A 5 s window: a stall of the loaded machine before the block is
  // forgotten while the test waits to start healthy.
  const m = createEventLoopMonitor({ intervalMs: 20, thresholdMs: 400, windowMs: 5000 });
  try {
    // Healthy first: polled, as a loaded machine may stall the loop at any time.
    for (const end = performance.now() + 20_000; !m.report().healthy && performance.now() < end;)
      await new Promise((r) => setTimeout(r, 60));
    assert.equal(m.report().healthy, true);
    const until = performance.now() + 900;
    while (performance.now() < until) {
      // busy: the loop is blocked
    }
    await new Promise((r) => setTimeout(r, 60));
    const r = m.report();
    assert.equal(r.healthy, false);
    assert.ok(r.maxLagMs >= 800, `maxLag ${r.maxLagMs}`);
  } finally {
    m.stop();
  }
});
