// vmseed_vmis{state} is kept with every change to the status store rather
// than recounted from every record at each update: after any sequence of
// updates (state changes, a new object under the same key) and removals it
// equals a recount of the records.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import fc from 'fast-check';
import { STATES, StatusStore } from '../../src/agent/status-store.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import type { VmiState } from '../../src/status/snapshot.ts';

type Op =
  { kind: 'update'; key: number; uid: number; state?: VmiState; atGate?: boolean } | { kind: 'remove'; key: number };

const op: fc.Arbitrary<Op> = fc.oneof(
  fc.record({
    kind: fc.constant('update' as const),
    key: fc.integer({ min: 0, max: 5 }),
    uid: fc.integer({ min: 0, max: 1 }),
    state: fc.option(fc.constantFrom(...STATES), { nil: undefined }),
    atGate: fc.option(fc.boolean(), { nil: undefined }),
  }),
  fc.record({ kind: fc.constant('remove' as const), key: fc.integer({ min: 0, max: 5 }) }),
);

async function gauge(metrics: ReturnType<typeof createMetrics>): Promise<Record<string, number>> {
  const { values } = await metrics.vmis.get();
  return Object.fromEntries(values.map((v) => [String(v.labels.state), v.value]));
}

const GATE = { code: 'SEED_GATE_WAITING' as const, message: 'waiting for KubeVirt', at: '2026-01-01T00:00:00Z' };
const OTHER = { code: 'SECRET_NOT_FOUND' as const, message: 'no secret', at: '2026-01-01T00:00:00Z' };

test('vmseed_vmis{state} and vmseed_seed_gate_waiting equal a recount of the records after any updates and removals', async () => {
  await fc.assert(
    fc.asyncProperty(fc.array(op, { maxLength: 60 }), async (ops) => {
      const metrics = createMetrics({ version: 'test', processMetrics: false });
      const store = new StatusStore({
        version: 'test',
        nodeName: 'n',
        stateDir: '/nonexistent',
        config: {},
        metrics,
        watch: () => ({ connected: true }) as never,
        queue: () => ({ depth: 0, inFlight: 0 }),
      });
      const keys = new Set<string>();
      for (const o of ops) {
        const key = `ns/vm${o.key}`;
        if (o.kind === 'update') {
          // A patch without state keeps the record's (a new uid starts pending).
          const gate = o.atGate === undefined ? {} : { lastError: o.atGate ? GATE : OTHER };
          store.update(key, `uid-${o.uid}`, { ...(o.state ? { state: o.state } : { retries: 1 }), ...gate });
          keys.add(key);
        } else {
          store.records.end(key);
          keys.delete(key);
        }
      }
      const recount = Object.fromEntries(STATES.map((s) => [s, 0]));
      for (const k of keys) recount[store.get(k)!.state]++;
      assert.deepEqual(await gauge(metrics), recount);
      const atGate = [...keys].filter((k) => store.get(k)!.lastError?.code === 'SEED_GATE_WAITING').length;
      const { values } = await metrics.seedGateWaiting.get();
      assert.equal(values[0]?.value ?? 0, atGate);
    }),
    { numRuns: 300 },
  );
});
