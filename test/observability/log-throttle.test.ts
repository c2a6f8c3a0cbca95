// The once-a-minute log throttle the annotation writer, the report receiver
// and the IMDS endpoints share: the first line of a kind goes out, the next
// ones within the minute are held back and counted, the count rides on the
// next line admitted and starts again from there; kinds do not share
// windows, and the kinds tracked are capped. The clock is the test's.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { LOG_EVERY_MS, LogThrottle, MAX_KINDS } from '../../src/core/log-throttle.ts';

test('the first line of a kind is admitted without a count', () => {
  const t = new LogThrottle<string>();
  assert.deepEqual(t.admit('a', 1_000), {});
});

test('lines within the minute are held back, counted, and the count resets on the next admitted line', () => {
  const t = new LogThrottle<string>();
  assert.deepEqual(t.admit('a', 0), {});
  assert.equal(t.admit('a', 1), undefined);
  assert.equal(t.admit('a', 30_000), undefined);
  assert.equal(t.admit('a', LOG_EVERY_MS - 1), undefined);
  assert.deepEqual(t.admit('a', LOG_EVERY_MS), { suppressedSinceLast: 3 });
  // The window restarts at the admitted line, and so does the count.
  assert.equal(t.admit('a', 2 * LOG_EVERY_MS - 1), undefined);
  assert.deepEqual(t.admit('a', 2 * LOG_EVERY_MS), { suppressedSinceLast: 1 });
  // A later line with none held back says so, rather than looking like a first.
  assert.deepEqual(t.admit('a', 5 * LOG_EVERY_MS), { suppressedSinceLast: 0 });
});

test('kinds are independent: one held back does not hold back or count another', () => {
  const t = new LogThrottle<string | number>();
  assert.deepEqual(t.admit('vm', 0), {});
  assert.equal(t.admit('vm', 10), undefined);
  assert.equal(t.admit('vm', 20), undefined);
  assert.deepEqual(t.admit(405, 30), {});
  assert.equal(t.admit(405, 40), undefined);
  assert.deepEqual(t.admit('node', 50), {});
  assert.deepEqual(t.admit('vm', LOG_EVERY_MS), { suppressedSinceLast: 2 });
  assert.equal(t.admit(405, LOG_EVERY_MS), undefined, "405's window opened at 30");
  assert.deepEqual(t.admit(405, LOG_EVERY_MS + 30), { suppressedSinceLast: 2 });
  assert.deepEqual(t.admit('node', LOG_EVERY_MS + 50), { suppressedSinceLast: 0 });
});

test('an interval other than the minute', () => {
  const t = new LogThrottle<string>({ everyMs: 100 });
  assert.deepEqual(t.admit('a', 0), {});
  assert.equal(t.admit('a', 99), undefined);
  assert.deepEqual(t.admit('a', 100), { suppressedSinceLast: 1 });
});

test('the kinds tracked are capped; the one admitted longest ago makes room', () => {
  const t = new LogThrottle<string>({ maxKinds: 2 });
  t.admit('a', 0);
  t.admit('b', 1);
  assert.equal(t.admit('a', 2), undefined);
  t.admit('c', 3);
  assert.equal(t.size, 2);
  // 'a' went: its next line is admitted at once, as a first one.
  assert.deepEqual(t.admit('a', 4), {});
  // ... which made room by dropping 'b'; 'c' is still held back.
  assert.equal(t.admit('c', 5), undefined);
  assert.deepEqual(t.admit('b', 6), {});
  assert.equal(t.size, 2);
});

test('an open set of kinds stays within the default cap, and the recent ones keep their windows', () => {
  const t = new LogThrottle<number>();
  const kinds = MAX_KINDS * 10;
  for (let k = 0; k < kinds; k++) assert.deepEqual(t.admit(k, k), {});
  assert.equal(t.size, MAX_KINDS);
  assert.equal(t.admit(kinds - 1, kinds), undefined, 'the last kind admitted is still tracked');
  assert.deepEqual(t.admit(0, kinds), {}, 'the first kind admitted was dropped');
});

test('a cap below one is refused', () => {
  assert.throws(() => new LogThrottle({ maxKinds: 0 }), RangeError);
  assert.throws(() => new LogThrottle({ maxKinds: 1.5 }), RangeError);
});
