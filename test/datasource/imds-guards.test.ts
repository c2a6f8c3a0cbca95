// The order of KubeVirt IMDS's rate buckets on a listener every VM of the
// node shares: a request is charged to its VM's bucket (or its source
// address's) first, and reaches the node-wide bucket only if that one let it
// through, so one VM's flood is refused by its own bucket and cannot spend
// the tokens the node keeps for every other VM.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ImdsGuards } from '../../src/datasource/imds/guards.ts';

// Time stands still: no bucket refills during a test.
const frozen = () => 0;
const limits = { ratePerSecond: 1, burst: 1, nodeRatePerSecond: 1, nodeBurst: 3 };

test("a VM flooding past its own bucket does not spend the node bucket's tokens", () => {
  const g = new ImdsGuards(limits, frozen);
  const flood = Array.from({ length: 20 }, () => g.throttle('vmi-a', '10.0.0.1'));
  assert.deepEqual(flood, [undefined, ...Array<string>(19).fill('vm')], 'refused by its own bucket, never the node');
  // The node bucket gave A one token; the other two are there for B and C.
  assert.equal(g.throttle('vmi-b', '10.0.0.2'), undefined);
  assert.equal(g.throttle('vmi-c', '10.0.0.3'), undefined);
  // Now the node bucket is empty: a VM with tokens of its own is refused by it.
  assert.equal(g.throttle('vmi-d', '10.0.0.4'), 'node');
});

test("requests that resolve to no VM: a flooding address's refusals do not spend the node bucket either", () => {
  const g = new ImdsGuards(limits, frozen);
  const flood = Array.from({ length: 20 }, () => g.throttle(undefined, '10.0.0.9'));
  assert.deepEqual(flood, [undefined, ...Array<string>(19).fill('source')]);
  assert.equal(g.throttle('vmi-b', '10.0.0.2'), undefined);
  assert.equal(g.throttle(undefined, '10.0.0.8'), undefined);
  assert.equal(g.throttle('vmi-c', '10.0.0.3'), 'node');
});
