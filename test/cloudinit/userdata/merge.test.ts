// Virtlet's merge (pkg/utils/merge.go) and its test table (merge_test.go),
// for the values YAML produces (every list is []interface{} there, so the
// typed "incompatible slices" case of the Go table cannot arise).
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { mergeCloudConfig, virtletMerge } from '../../../src/cloudinit/userdata/merge.ts';

test("Virtlet's merge_test.go table", () => {
  assert.deepEqual(virtletMerge({ a: 'X' }, { b: 'Y' }), { a: 'X', b: 'Y' });
  assert.deepEqual(virtletMerge({ a: 'X', b: 'Y' }, { c: 'Z', b: 'Q' }), { a: 'X', c: 'Z', b: 'Q' });
  assert.deepEqual(virtletMerge([1, 2], [2, 3]), [1, 2, 2, 3]);
  assert.deepEqual(virtletMerge({ a: [1, 2] }, { a: [3, 4] }), { a: [1, 2, 3, 4] });
  assert.equal(virtletMerge(3, 0), 0);
  assert.equal(virtletMerge(null, null), null);
});

test('nested maps merge, lists append, scalars and kind changes take the override, null deletes', () => {
  const base = { runcmd: [['a1'], ['a2']], nested: { k1: 1, k2: { x: 1 } }, s: 'old', l: [1], m: { a: 1 }, gone: 1 };
  const over = {
    runcmd: [['b1']],
    nested: { k2: { y: 2 } },
    s: 'new',
    l: { now: 'map' },
    m: 'scalar',
    gone: null,
    fresh: null,
  };
  assert.deepEqual(virtletMerge(base, over), {
    runcmd: [['a1'], ['a2'], ['b1']],
    nested: { k1: 1, k2: { x: 1, y: 2 } },
    s: 'new',
    l: { now: 'map' },
    m: 'scalar',
    fresh: null,
  });
  // Inputs are not modified.
  assert.deepEqual(base.runcmd, [['a1'], ['a2']]);
});

test('overwrite mode replaces top-level keys whole', () => {
  assert.deepEqual(
    mergeCloudConfig(
      { runcmd: ['a'], ntp: { enabled: true }, keep: 1 },
      { runcmd: ['b'], ntp: { servers: ['x'] } },
      'overwrite',
    ),
    { runcmd: ['b'], ntp: { servers: ['x'] }, keep: 1 },
  );
});
