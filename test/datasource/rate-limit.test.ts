import assert from 'node:assert/strict';
import { test } from 'node:test';
import { RateLimiter } from '../../src/datasource/flood/rate-limit.ts';

test('buckets are per key: one noisy source does not starve another', () => {
  let ms = 0;
  const rl = new RateLimiter({ ratePerSecond: 1, burst: 2, now: () => ms });
  assert.deepEqual([rl.take('a'), rl.take('a'), rl.take('a')], [true, true, false]);
  assert.equal(rl.take('b'), true);
  ms += 999;
  assert.equal(rl.take('a'), false);
  ms += 1;
  assert.equal(rl.take('a'), true);
});

test('memory stays bounded under a flood of distinct sources; refilled buckets go first', () => {
  const ms = 0;
  const rl = new RateLimiter({ ratePerSecond: 10, burst: 5, maxKeys: 100, now: () => ms });
  for (let i = 0; i < 10_000; i++) rl.take(`10.0.${i >> 8}.${i & 255}`);
  assert.ok(rl.size <= 100, `size ${rl.size}`);
});

test('eviction drops refilled buckets, never a drained one (which would reset its limit)', () => {
  let ms = 0;
  const rl = new RateLimiter({ ratePerSecond: 1, burst: 5, maxKeys: 3, now: () => ms });
  for (let i = 0; i < 5; i++) assert.equal(rl.take('victim'), true);
  assert.equal(rl.take('victim'), false);
  rl.take('a');
  rl.take('b');
  ms += 1000; // a, b full again; victim has 1 token
  rl.take('c'); // over maxKeys: a and b are forgotten
  assert.equal(rl.size, 2);
  assert.equal(rl.take('victim'), true);
  assert.equal(rl.take('victim'), false, 'victim was evicted and got a fresh burst');
});

test('bad settings are refused', () => {
  assert.throws(() => new RateLimiter({ ratePerSecond: 0, burst: 1 }), RangeError);
  assert.throws(() => new RateLimiter({ ratePerSecond: 1, burst: 0 }), RangeError);
});
