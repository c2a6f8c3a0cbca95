// One record per VMI key: end(key) drops all of it in one call and tells
// every per-VMI table registered beside it; the status shown is a pure function
// of what the reconcile found and the status shown before.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { VmiRecords, resetObjectFacts } from '../../src/agent/vmi-records.ts';
import { nextStatus } from '../../src/agent/vmi-status.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';

const AT = '2026-11-25T00:00:00.000Z';

test('end(key): the record is gone, every table is told with the record it ended, other keys stay', () => {
  const records = new VmiRecords();
  const heard: string[] = [];
  const held = new Set<string>(['ns/a', 'ns/b']);
  for (const name of ['one', 'two'])
    records.register(name, {
      forget: (key, r) => {
        heard.push(`${name} ${key} ${r?.image?.path ?? '-'}`);
        held.delete(key);
      },
      holds: (key) => held.has(key),
    });
  assert.throws(() => records.register('one', { forget: () => {}, holds: () => false }), { code: 'INTERNAL' });
  assert.deepEqual(records.tables(), ['one', 'two']);
  records.of('ns/a').image = {
    uid: 'u',
    datasource: 'nocloud',
    path: '/p',
    sha256: 'x',
    needsPrune: false,
    annotations: {},
    launcherPods: [],
  };
  records.of('ns/a').otherNode = 'n2';
  records.of('ns/b');
  assert.deepEqual(records.holding('ns/a'), ['record', 'one', 'two']);
  records.end('ns/a');
  assert.equal(records.get('ns/a'), undefined);
  assert.deepEqual(records.holding('ns/a'), []);
  assert.deepEqual(records.holding('ns/b'), ['record', 'one', 'two']);
  assert.deepEqual(heard, ['one ns/a /p', 'two ns/a /p']);
  // Ended again, or never recorded: the tables are still told (a table may
  // hold a key its record never had), without the record.
  records.end('ns/a');
  records.end('ns/never');
  assert.deepEqual(heard.slice(2), ['one ns/a -', 'two ns/a -', 'one ns/never -', 'two ns/never -']);
});

test('resetObjectFacts keeps what belongs to the key (image, status, other node) and drops the per-object facts', () => {
  const records = new VmiRecords();
  const r = records.of('ns/a');
  r.otherNode = 'n2';
  r.firstSeen = { uid: 'u', at: 1, reported: true };
  r.renderTimeouts = { version: '1', count: 2 };
  r.domainFacts = { uid: 'u', facts: { devices: [], vcpuPins: [] } };
  resetObjectFacts(r);
  assert.deepEqual(r, { key: 'ns/a', otherNode: 'n2' });
});

test('the status gauge and the status page lose a forgotten VMI', async () => {
  const metrics = createMetrics({ version: 'test', processMetrics: false });
  const store = new StatusStore({
    version: 't',
    nodeName: 'n',
    stateDir: '/nonexistent',
    config: {},
    metrics,
    watch: () => ({}) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
  });
  store.write('ns/a', 'u', { kind: 'error', problem: { code: 'INTERNAL', message: 'm' }, retries: 1 });
  assert.equal(store.get('ns/a')?.state, 'error');
  store.records.end('ns/a');
  assert.equal(store.get('ns/a'), undefined);
  assert.deepEqual(store.snapshot().vmis, []);
  const { values } = await metrics.vmis.get();
  assert.equal(values.find((v) => v.labels.state === 'error')?.value, 0);
});

test('nextStatus: a new object starts pending; an error keeps the image facts; skipped and served drop them', () => {
  const seen = nextStatus(undefined, 'ns/a', 'u1', { kind: 'seen' }, AT);
  assert.deepEqual(seen, { namespace: 'ns', name: 'a', uid: 'u1', state: 'pending', warnings: [], retries: 0 });
  const ready = nextStatus(
    seen,
    'ns/a',
    'u1',
    {
      kind: 'ready',
      datasource: 'nocloud',
      imagePath: '/p',
      imageBytes: 10,
      contentHash: 'h',
      generatedAt: undefined,
      generationSeconds: 0.5,
      files: [],
      injection: undefined,
      warnings: [{ code: 'SEEDED_AFTER_BOOT', message: 'late' }],
    },
    AT,
  );
  assert.equal(ready.state, 'warning');
  assert.equal('generatedAt' in ready, false, 'an undefined value removes the field');
  assert.deepEqual(ready.warnings, [{ code: 'SEEDED_AFTER_BOOT', message: 'late', at: AT }]);
  const failed = nextStatus(
    ready,
    'ns/a',
    'u1',
    { kind: 'error', problem: { code: 'DOMAIN_NOT_FOUND', message: 'm', kind: 'retryable' }, retries: 2 },
    AT,
  );
  assert.equal(failed.state, 'error');
  assert.equal(failed.imagePath, '/p');
  assert.equal(failed.retries, 2);
  const skipped = nextStatus(failed, 'ns/a', 'u1', { kind: 'skipped', warnings: [] }, AT);
  assert.equal(skipped.state, 'skipped');
  assert.equal(skipped.lastError, undefined);
  assert.equal(skipped.imagePath, undefined);
  const served = nextStatus(ready, 'ns/a', 'u1', { kind: 'served', datasource: 'nocloud', warnings: [] }, AT);
  assert.equal(served.state, 'ready');
  assert.equal(served.contentHash, undefined);
  assert.equal(served.imageBytes, undefined);
  const other = nextStatus(ready, 'ns/a', 'u2', { kind: 'seen' }, AT);
  assert.equal(other.state, 'pending', 'another object under the same name starts over');
  assert.equal(ready.state, 'warning', 'the status it was computed from is not changed');
});
