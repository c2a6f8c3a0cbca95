// What a normal VM start waits for is shown as waiting: pending with the
// code, a Normal Event once per code, no error counted; the queue's backoff
// shows as the retry count and time; the per-VMI series follow the state.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ReconcileRecorder, newProgress } from '../../src/agent/reconcile-recorder.ts';
import { StatusStore } from '../../src/agent/status-store.ts';
import { WorkQueue } from '../../src/agent/work-queue.ts';
import { WAITING } from '../../src/agent/waiting.ts';
import type { EventRecorder } from '../../src/agent/events.ts';
import type { VmiObject } from '../../src/api/objects.ts';
import { VmseedError } from '../../src/errors.ts';
import { createMetrics } from '../../src/metrics/metrics.ts';
import { renderStatusPage, renderVmiPage } from '../../src/http/status-page.ts';
import { parseExposition, sampleValue } from '../support/promtool.ts';
import { captureLogger } from '../support/capture-logger.ts';

const VMI: VmiObject = {
  metadata: { name: 'web', namespace: 'ns', uid: 'u1', annotations: { 'vmseed.io/cloud-init': 'userData: x' } },
  spec: {},
};

function setup() {
  let now = Date.parse('2026-01-01T00:00:00Z');
  const clock = () => new Date(now);
  const metrics = createMetrics({ version: 't', processMetrics: false });
  const status = new StatusStore({
    version: 't',
    nodeName: 'n1',
    stateDir: '/nonexistent',
    config: {},
    metrics,
    watch: () => ({ mode: 'local', synced: true }) as never,
    queue: () => ({ depth: 0, inFlight: 0 }),
    now: clock,
  });
  const events: Array<{ type: string; reason: string; message: string }> = [];
  const recorder: EventRecorder = {
    record: (_v, type, reason, message) => void events.push({ type, reason, message }),
    flush: async () => {},
  };
  let failures = 0;
  const rec = new ReconcileRecorder({
    nodeName: 'n1',
    status,
    records: status.records,
    events: recorder,
    metrics,
    logger: captureLogger().logger,
    injecting: true,
    failures: () => failures,
    now: () => now,
  });
  const scrape = async () => parseExposition(await metrics.registry.metrics());
  return {
    status,
    events,
    rec,
    scrape,
    advance: (ms: number) => (now += ms),
    setFailures: (n: number) => (failures = n),
  };
}

const wait = (code: (typeof WAITING)[number]) =>
  new VmseedError(code, `waiting for ${code}`, { kind: 'retryable', field: 'status.activePods' });

test('each code of a normal start is waiting: pending, one Normal Event per code, no error counted', async () => {
  const h = setup();
  for (const code of WAITING) {
    for (let i = 0; i < 3; i++) assert.equal(h.rec.failed('ns/web', VMI, wait(code), 0, newProgress()), 'retry');
    const s = h.status.get('ns/web')!;
    assert.equal(s.state, 'pending', code);
    assert.equal(s.lastError?.code, code);
    assert.equal(s.lastError?.field, 'status.activePods');
  }
  assert.deepEqual(
    h.events.map((e) => `${e.type} ${e.reason} ${e.message.split(':')[0]}`),
    WAITING.map((c) => `Normal SeedWaiting ${c}`),
  );
  const s = await h.scrape();
  assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'waiting' }), WAITING.length * 3);
  assert.equal(sampleValue(s, 'vmseed_reconcile_total', { result: 'error' }), 0);
  assert.equal(s.filter((x) => x.name === 'vmseed_reconcile_errors_total').length, 0, 'no error code counted');
  assert.equal(sampleValue(s, 'vmseed_vmis', { state: 'error' }), 0);
  assert.equal(sampleValue(s, 'vmseed_vmis', { state: 'pending' }), 1);
});

test('what needs a person stays an error with a Warning; a terminal waiting code is an error too', () => {
  const h = setup();
  h.rec.failed(
    'ns/web',
    VMI,
    new VmseedError('SECRET_NOT_FOUND', 'no Secret', { kind: 'retryable' }),
    0,
    newProgress(),
  );
  assert.equal(h.status.get('ns/web')?.state, 'error');
  assert.deepEqual(
    h.events.map((e) => `${e.type} ${e.reason}`),
    ['Warning SeedFailed'],
  );
  h.rec.failed('ns/web', VMI, new VmseedError('DOMAIN_NOT_FOUND', 'gone', { kind: 'terminal' }), 0, newProgress());
  assert.equal(h.status.get('ns/web')?.state, 'error');
});

test('the backoff shows as retry N at T, for waiting and failing alike; success clears it', async () => {
  const h = setup();
  const q = new WorkQueue({
    concurrency: 1,
    backoff: { baseMs: 1000, maxMs: 60_000 },
    handler: async () => {
      h.rec.failed('ns/web', VMI, wait('DOMAIN_NOT_FOUND'), 0, newProgress());
      return 'retry';
    },
    versionOf: () => '1',
    onBackoff: (key, attempt, delayMs) => h.status.backoff(key, attempt, delayMs),
  });
  q.add('ns/web');
  await q.idle();
  const s = h.status.get('ns/web')!;
  assert.equal(s.state, 'pending');
  assert.equal(s.retries, 1);
  assert.equal(s.retryAt, '2026-01-01T00:00:01.000Z');
  await q.shutdown(AbortSignal.timeout(1000));

  h.setFailures(3);
  h.rec.failed(
    'ns/web',
    VMI,
    new VmseedError('SECRET_NOT_FOUND', 'no Secret', { kind: 'retryable' }),
    0,
    newProgress(),
  );
  assert.equal(h.status.get('ns/web')?.retryAt, undefined, 'no retry time claimed before the queue says');
  h.status.backoff('ns/web', 4, 8000);
  assert.deepEqual(
    [h.status.get('ns/web')?.state, h.status.get('ns/web')?.retries, h.status.get('ns/web')?.retryAt],
    ['error', 4, '2026-01-01T00:00:08.000Z'],
  );
  h.status.write('ns/web', 'u1', { kind: 'skipped', warnings: [] });
  assert.equal(h.status.get('ns/web')?.retryAt, undefined);
  assert.equal(h.status.get('ns/web')?.retries, 0);
});

test('the per-VMI series: one label set at a time, since when the state and code were entered', async () => {
  const h = setup();
  h.rec.failed('ns/web', VMI, wait('LAUNCHER_POD_UNKNOWN'), 0, newProgress());
  h.advance(5000);
  h.rec.failed('ns/web', VMI, wait('LAUNCHER_POD_UNKNOWN'), 0, newProgress());
  let s = await h.scrape();
  const first = { namespace: 'ns', name: 'web', state: 'pending', code: 'LAUNCHER_POD_UNKNOWN' };
  assert.equal(sampleValue(s, 'vmseed_vmi_info', first), 1);
  assert.equal(
    sampleValue(s, 'vmseed_vmi_state_since_timestamp_seconds', first),
    Date.parse('2026-01-01T00:00:00Z') / 1000,
    'the same code again keeps its start',
  );
  h.advance(5000);
  h.rec.failed('ns/web', VMI, wait('SEED_GATE_WAITING'), 0, newProgress());
  s = await h.scrape();
  const gate = { ...first, code: 'SEED_GATE_WAITING' };
  assert.equal(s.filter((x) => x.name === 'vmseed_vmi_info').length, 1);
  assert.equal(sampleValue(s, 'vmseed_vmi_info', gate), 1);
  assert.equal(
    sampleValue(s, 'vmseed_vmi_state_since_timestamp_seconds', gate),
    Date.parse('2026-01-01T00:00:10Z') / 1000,
  );
  assert.equal(sampleValue(s, 'vmseed_seed_gate_waiting'), 1);
  h.status.records.end('ns/web');
  s = await h.scrape();
  assert.equal(
    s.filter((x) => x.name.startsWith('vmseed_vmi_') && x.name !== 'vmseed_vmi_annotation_writes_total').length,
    0,
  );
  assert.equal(sampleValue(s, 'vmseed_seed_gate_waiting'), 0);
});

test('the status page and its VMI page say which retry comes when, and since when the VMI waits', () => {
  const h = setup();
  h.rec.failed('ns/web', VMI, wait('LAUNCHER_POD_UNKNOWN'), 0, newProgress());
  h.status.backoff('ns/web', 3, 4000);
  const snap = h.status.snapshot();
  const now = new Date('2026-01-01T00:00:01Z');
  const list = renderStatusPage(snap, { now, refreshSeconds: 10 });
  const row = list.slice(list.indexOf('<tr class="vmi r-pending"'));
  assert.match(row.slice(0, row.indexOf('</tr>')), /retry 3 at [^<]*00:00:04[^<]*\(in 3\.00 s\)/);
  const page = renderVmiPage(snap, snap.vmis[0], { now, refreshSeconds: 10 });
  assert.match(page, /retry 3 at [^<]*00:00:04/);
  assert.match(page, /in this state since<\/th><td>[^<]*00:00:00/);
});
